"""The HF engine prefills a prefix shared by prompts of one call once (multi-turn contexts:
each prompt's trajectories share its opening) and gives the tokens and log-probs of the
engine without the reuse (`min_shared_prefix=None`)."""
from __future__ import annotations

import time

import pytest
import torch

from trainer.engines.hf_engine import HFEngine
from trainer.models.tiny import VOCAB, build_untrained
from trainer.rollouts import SamplingConfig

EOS = VOCAB["<eos>"]


@pytest.fixture(scope="module")
def model():
    return build_untrained(seed=3, max_position_embeddings=512)[0].float()


def rand(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(5, len(VOCAB), (n,), generator=g).tolist()


def contexts(openings: int = 3, per: int = 4, system: int = 40, opening: int = 60, seed: int = 0):
    """Multi-turn-like contexts: `openings` prompts (sharing a system part) x `per` trajectories,
    each with its own suffix of its own length, plus one unrelated prompt."""
    g = torch.Generator().manual_seed(seed)
    sys_part, out = rand(system, g), []
    for _ in range(openings):
        head = sys_part + rand(opening, g)
        out += [head + rand(int(torch.randint(1, 15, (), generator=g)), g) for _ in range(per)]
    return out + [rand(20, g)]


def forward_shapes(model):
    seen: list[tuple[int, int, int]] = []  # (rows, input width, attention mask width)
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append((*kw["input_ids"].shape, kw["attention_mask"].shape[1])),
        with_kwargs=True)
    return seen, hook


def test_plan_groups_each_opening_not_the_shared_system_part(model):
    prompts = contexts()
    group_of, prefix = HFEngine(model, EOS)._plan_prefixes(prompts)
    assert [group_of[i * 4] for i in range(3)] == [group_of[i * 4 + 3] for i in range(3)]
    assert len({group_of[i * 4] for i in range(3)}) == 3 and group_of[-1] not in group_of[:-1]
    assert prefix[:12] == [100] * 12  # the whole opening (system 40 + opening 60)
    assert prefix[-1] == 19  # a prompt of its own: all but its last token in the prefix block


def test_plan_does_not_trigger_on_prompts_that_share_little(model):
    g = torch.Generator().manual_seed(1)
    engine = HFEngine(model, EOS)
    assert engine._plan_prefixes([rand(200, g) for _ in range(64)]) is None
    short = rand(20, g)  # a shared head under min_shared_prefix
    assert engine._plan_prefixes([short + rand(100, g) for _ in range(8)]) is None
    # One pair sharing a prefix among many long distinct prompts: not worth the extra forward.
    pair = rand(60, g)
    assert engine._plan_prefixes([pair + [5], pair + [6]] + [rand(200, g) for _ in range(30)]) is None
    assert HFEngine(model, EOS, min_shared_prefix=None)._plan_prefixes(contexts()) is None
    # Cheap: thousands of long distinct prompts are planned in well under a generate step.
    many = [rand(300, g) for _ in range(2000)]
    t0 = time.perf_counter()
    assert engine._plan_prefixes(many) is None
    assert time.perf_counter() - t0 < 0.5


def test_plan_is_off_on_sliding_window_models():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    engine = HFEngine(MistralForCausalLM(cfg), 0)
    assert engine._plan_prefixes([[1] * 40 + [2], [1] * 40 + [3]]) is None


@pytest.mark.parametrize("max_batch_tokens", [131_072, 1000])  # 700: groups split over chunks
def test_greedy_tokens_equal_the_engine_without_reuse(model, max_batch_tokens):
    prompts = contexts()
    greedy = SamplingConfig(n=2, max_new_tokens=6, temperature=0.0)
    seen, hook = forward_shapes(model)
    try:
        got = HFEngine(model, EOS, max_batch_tokens=max_batch_tokens).generate(prompts, greedy, ignore_eos=True)
    finally:
        hook.remove()
    want = HFEngine(model, EOS, max_batch_tokens=max_batch_tokens, min_shared_prefix=None).generate(
        prompts, greedy, ignore_eos=True)
    assert got.token_ids == want.token_ids and got.prompt_index == want.prompt_index
    for a, b in zip(got.logprobs, want.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    # The reuse ran: a forward over prefixes (one row per group) and one over the suffixes,
    # whose input is far narrower than the prompts; and every forward keeps the token budget.
    longest = max(map(len, prompts))
    assert any(w < 20 and m > longest - 20 for _, w, m in seen)
    assert all(rows * m <= max_batch_tokens for rows, w, m in seen)


def test_sampled_tokens_equal_the_engine_without_reuse(model):
    """Same seeded draws: the same tokens (logits agree to float rounding), log-probs close;
    rows finishing early (EOS) are dropped from the forward as usual."""
    prompts = contexts(openings=3, per=4, seed=2)
    sampling = SamplingConfig(n=2, max_new_tokens=20, temperature=1.0, top_p=0.95, seed=7)
    engines = [HFEngine(model, EOS, min_shared_prefix=m) for m in (32, None)]
    for e in engines:
        e.eos_ids = list(range(12))  # responses of many lengths
    got, want = (e.generate(prompts, sampling) for e in engines)
    assert got.token_ids == want.token_ids and got.finished == want.finished
    assert len({len(t) for t in got.token_ids}) > 3
    for a, b in zip(got.logprobs, want.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)


def test_kv_budget_holds_with_the_shared_layout(model):
    """max_kv_bytes bounds rows x (the [prefix | suffix] width + max_new_tokens) as before."""
    from trainer.engines.hf_engine import kv_bytes_per_token

    prompts = contexts(openings=2, per=4, seed=3)
    budget = 7 * kv_bytes_per_token(model) * (max(map(len, prompts)) + 6)
    seen, hook = forward_shapes(model)
    try:
        got = HFEngine(model, EOS, max_kv_bytes=budget).generate(
            prompts, SamplingConfig(n=2, max_new_tokens=6, temperature=0.0), ignore_eos=True)
    finally:
        hook.remove()
    assert len(got.token_ids) == 2 * len(prompts)
    assert all(rows * m * kv_bytes_per_token(model) <= budget for rows, _, m in seen)
