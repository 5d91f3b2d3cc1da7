"""Packed micro-batches (several samples to a row, `trainer.optim.update.packs`) against the
padded ones: same log-probs, loss, gradient norm and updated weights to float tolerance, on a
batch whose responses run from 1 to 120 tokens, and far fewer positions run."""
import copy

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from trainer.optim.update import (Rows, UpdateConfig, _chunks, packed_micro_batches,
                                  packed_prefix_micro_batches, packs, ppo_update, prompt_copy_weight,
                                  sequence_logprobs)
from tests.support.rollout_batches import random_rollouts
from trainer.rollouts import Rollouts

VOCAB = 64
_SIZE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**_SIZE, **kw)).float().train()


def _length(g: torch.Generator) -> int:
    """1..120 tokens, most short, some at 120."""
    u = float(torch.rand((), generator=g))
    return 120 if u < 0.15 else 1 + int(torch.randint(0, 40, (), generator=g) * u * 2)


def _batch(groups=((24, 9), (12, 17), (1, 5), (1, 30)), seed=0) -> Rollouts:
    """Groups of (N, prompt length); responses of 1..120 tokens, most short, some at 120."""
    return random_rollouts(groups, _length, vocab=VOCAB, max_new=120, engine_level=-4.0, seed=seed)


def _update(model, batch, *, pack: bool, shared: bool, max_tokens: int, opt: str = "sgd"):
    """One ppo_update (KL against a fixed reference, no clipping); returns stats and weights."""
    cfg = UpdateConfig(kl_coef=0.1, grad_clip=None, shared_prefix=shared, pack=pack)
    g = torch.Generator().manual_seed(1)
    ref = [torch.tensor(e) + 0.05 * torch.randn(len(e), generator=g) for e in batch.engine_logprobs]
    optim = (torch.optim.SGD(model.parameters(), lr=1.0) if opt == "sgd"
             else torch.optim.AdamW(model.parameters(), lr=1e-3))
    stats = ppo_update(model, optim, batch, None, ref, cfg, max_tokens)
    return stats, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("max_tokens", [400, 100_000])  # many micro-batches, or one
def test_packed_update_matches_padded(shared, max_tokens):
    batch, base = _batch(), _model()
    chunks, _ = _chunks(base, batch.prompt_ids, batch.response_ids, max_tokens, shared)
    assert all(isinstance(c, Rows) for c in chunks) and any(n > 1 for c in chunks for n in c.sizes)
    padded, w_padded = _update(copy.deepcopy(base), batch, pack=False, shared=shared, max_tokens=max_tokens)
    packed, w_packed = _update(copy.deepcopy(base), batch, pack=True, shared=shared, max_tokens=max_tokens)
    for key in ("loss", "entropy", "kl", "is_ratio_mean", "is_truncated_frac", "pg_clipfrac_low",
                "pg_clipfrac_high", "n_tokens"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-7), key
    assert padded["grad_norm"] > 0
    assert packed["grad_norm"] == pytest.approx(padded["grad_norm"], rel=1e-5)
    for a, b in zip(w_padded, w_packed):  # SGD with lr 1: the weights moved by minus the gradient
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_packed_adamw_weights_match_padded():
    batch, base = _batch(), _model()
    _, w_padded = _update(copy.deepcopy(base), batch, pack=False, shared=True, max_tokens=400, opt="adamw")
    _, w_packed = _update(copy.deepcopy(base), batch, pack=True, shared=True, max_tokens=400, opt="adamw")
    # Adam's first step is lr x g / (|g| + eps): a gradient entry near eps turns a float
    # rounding into a visible part of the 1e-3 step, so the tolerance is 1 % of that step.
    for a, b in zip(w_padded, w_packed):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_packed_logprobs_match_padded(shared):
    batch, model = _batch(), _model().eval()
    padded = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 0.7, 400, with_entropy=True,
                               shared_prefix=shared, pack=False)
    packed = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 0.7, 400, with_entropy=True,
                               shared_prefix=shared, pack=True)
    for part_a, part_b in zip(padded, packed):
        for a, b in zip(part_a, part_b):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def _positions_run(model, fn) -> int:
    """Positions the model body runs (padding included) during fn()."""
    seen = [0]

    def count(_mod, args, kwargs):
        seen[0] += kwargs.get("input_ids", args[0] if args else None).numel()

    hook = model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    try:
        fn()
    finally:
        hook.remove()
    return seen[0]


@pytest.mark.parametrize("shared", [True, False])
def test_packing_cuts_the_padding(shared):
    batch, model = _batch(), _model().eval()
    max_tokens = 400
    run = {pack: _positions_run(model, lambda pack=pack: sequence_logprobs(
        model, batch.prompt_ids, batch.response_ids, 1.0, max_tokens, shared_prefix=shared, pack=pack))
        for pack in (False, True)}
    # Real positions: every response input (shared: all but the last token, plus each distinct
    # prompt once per chunk that runs it; plain: prompt + response per sample).
    real = {}
    for pack in (False, True):
        chunks, used = _chunks(model, batch.prompt_ids, batch.response_ids, max_tokens, shared, pack)
        assert used == shared
        real[pack] = sum(
            (sum(len(p) for p in {tuple(batch.prompt_ids[i]) for i in c})
             + sum(len(batch.response_ids[i]) - 1 for i in c)) if shared
            else sum(len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in c) for c in chunks)
    padding = {pack: 1 - real[pack] / run[pack] for pack in run}
    # The batch pads a lot when padded (the plain forward sorts whole sequences by length, so
    # less there), and little when packed.
    assert padding[False] > (0.3 if shared else 0.12), padding
    assert padding[True] < 0.1, padding
    assert run[True] < (0.75 if shared else 0.9) * run[False], run


def test_packed_chunks_cover_once_within_budget():
    batch, model = _batch(groups=((40, 9), (30, 25), (3, 4))), _model()
    w = prompt_copy_weight(model)
    inputs = [max(len(r) - 1, 0) for r in batch.response_ids]
    chunks = packed_prefix_micro_batches(batch.prompt_ids, batch.response_ids, 500, w)
    assert sorted(i for c in chunks for i in c) == list(range(len(batch)))
    for c in chunks:
        rows = c.rows()
        assert all(len({tuple(batch.prompt_ids[i]) for i in row}) == 1 for row in rows)  # one prompt a row
        prompts = {tuple(batch.prompt_ids[i]) for i in c}
        pmax = max(map(len, prompts))
        width = max(sum(inputs[i] for i in row) for row in rows)
        assert width <= max(inputs) or len(rows[0]) == 1
        assert len(prompts) * pmax + len(rows) * (width + w * pmax) <= 500 or len(rows) == 1
    lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
    plain = packed_micro_batches(lengths, 500)
    assert sorted(i for c in plain for i in c) == list(range(len(batch)))
    for c in plain:
        widths = [sum(lengths[i] for i in row) for row in c.rows()]
        assert max(widths) <= max(lengths)
        assert len(widths) * max(widths) <= 500 or len(widths) == 1


def test_packs_only_full_attention_plain_head_sdpa_models():
    assert packs(_model())
    assert not packs(_model(attn_implementation="eager"))  # wants an additive mask
    small = dict(_SIZE, head_dim=8)
    assert not packs(MistralForCausalLM(MistralConfig(**small, sliding_window=8)))  # window counts slots
    assert not packs(Gemma2ForCausalLM(Gemma2Config(**small, sliding_window=8)))  # soft-capped head
    # Unpacked there: the chunks are plain index lists.
    eager = _model(attn_implementation="eager")
    chunks, _ = _chunks(eager, [[1, 2]] * 3, [[3, 4], [5], [6, 7, 8]], 4096, True)
    assert not any(isinstance(c, Rows) for c in chunks)
