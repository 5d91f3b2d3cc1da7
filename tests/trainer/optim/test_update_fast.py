"""The fast update (shared prompt prefix, no separate old-log-prob pass) against the plain one:
same loss, statistics and gradients on the same batch, to float tolerance."""
import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.support.rollout_batches import random_rollouts
from trainer.rollouts import Rollouts
from trainer.optim.update import (UpdateConfig, micro_batches, ppo_update, prefix_micro_batches,
                            sequence_logprobs, uses_shared_prefix)

VOCAB, MAX_NEW = 64, 24


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    return Qwen2ForCausalLM(cfg).float().train()


def _length(g: torch.Generator) -> int:
    """1..24 tokens, a quarter cut at 24 (truncated)."""
    cut = bool(torch.rand((), generator=g) < 0.25)
    return MAX_NEW if cut else int(torch.randint(1, MAX_NEW, (), generator=g))


def _batch(groups=((512, 30), (16, 23), (5, 3)), seed=0) -> Rollouts:
    """Groups of (N, prompt length); responses of 1..24 tokens, a quarter cut at 24."""
    return random_rollouts(groups, _length, vocab=VOCAB, max_new=MAX_NEW, engine_level=-3.0, seed=seed)


def _step(model, batch, shared: bool, separate_old: bool, max_tokens: int):
    """One ppo_update with SGD(lr=1) and no clipping: the weight change is minus the gradient."""
    cfg = UpdateConfig(kl_coef=0.0, grad_clip=None, is_band=(0.5, 5.0), shared_prefix=shared)
    old = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 1.0, max_tokens,
                            shared_prefix=shared) if separate_old else None
    before = [p.detach().clone() for p in model.parameters()]
    stats = ppo_update(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, old, None, cfg, max_tokens)
    grads = [b - p.detach() for b, p in zip(before, model.parameters())]
    return stats, grads


@pytest.mark.slow  # ~10-20 s on 2 cores: the plain update over a group of 512
@pytest.mark.parametrize("max_tokens", [2048, 16384])  # groups split over micro-batches, or not
def test_fast_update_matches_plain(max_tokens):
    batch = _batch()
    base = _model()
    plain, g_plain = _step(copy.deepcopy(base), batch, shared=False, separate_old=True, max_tokens=max_tokens)
    fast, g_fast = _step(copy.deepcopy(base), batch, shared=True, separate_old=False, max_tokens=max_tokens)
    for key in ("loss", "entropy", "is_ratio_mean", "is_truncated_frac", "pg_clipfrac_low",
                "pg_clipfrac_high", "n_tokens"):
        assert fast[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key
    assert fast["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    assert plain["grad_norm"] > 0
    for a, b in zip(g_plain, g_fast):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_shared_prefix_logprobs_match_plain():
    batch = _batch(groups=((64, 40), (7, 12), (1, 30)))
    model = _model().eval()
    plain = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 0.7, 512, with_entropy=True,
                              shared_prefix=False)
    fast = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 0.7, 512, with_entropy=True,
                             shared_prefix=True)
    for part_a, part_b in zip(plain, fast):
        for a, b in zip(part_a, part_b):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_prefix_micro_batches_cover_once_within_budget():
    batch = _batch(groups=((100, 40), (30, 12)))
    chunks = prefix_micro_batches(batch.prompt_ids, batch.response_ids, 600)
    assert sorted(i for c in chunks for i in c) == list(range(len(batch)))
    for c in chunks:
        prompts = {tuple(batch.prompt_ids[i]) for i in c}
        cost = len(prompts) * max(map(len, prompts)) + len(c) * max(len(batch.response_ids[i]) for i in c)
        assert cost <= 600 or len(c) == 1
    # The prompt runs once per chunk: far fewer tokens than the padded plain batch.
    plain = micro_batches([len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)], 600)
    assert len(chunks) < len(plain)


def test_shared_prefix_only_when_prompts_repeat_and_no_checkpointing():
    model = _model()
    assert uses_shared_prefix(model, [[1, 2], [1, 2]])
    assert not uses_shared_prefix(model, [[1, 2], [1, 3]])
    assert not uses_shared_prefix(model, [[1, 2], [1, 2]], enabled=False)
    model.gradient_checkpointing_enable()
    assert not uses_shared_prefix(model, [[1, 2], [1, 2]])


def test_budget_counts_each_samples_copy_of_the_prompt():
    """A long prompt's keys/values are copied per sample: the chunks count that copy, so a
    2,000-token prompt with 64 samples no longer fits one 4,096-token micro-batch."""
    from trainer.optim.update import _chunks, prompt_copy_weight

    model = _model()
    w = prompt_copy_weight(model)
    # 2 x (1 kv + 2 query heads) x head_dim 16 over (16 x 32 + 3 x 64) activations per token.
    assert w == pytest.approx(2 * 3 * 16 / (16 * 32 + 3 * 64))
    prompts = [list(range(1, 2001))] * 64
    responses = [[1] * 24] * 64
    chunks, shared = _chunks(model, prompts, responses, 4096, True)
    assert shared and len(chunks) > 1
    assert sorted(i for c in chunks for i in c) == list(range(64))
    for c in chunks:
        assert 2000 + len(c) * (24 + w * 2000) <= 4096 or len(c) == 1
    # Without the copy counted, everything fit one chunk (2,000 + 64 x 24 tokens).
    assert len(prefix_micro_batches(prompts, responses, 4096)) == 1
