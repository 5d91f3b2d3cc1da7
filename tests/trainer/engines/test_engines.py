"""Rollout engines: the shape contract, log-prob agreement with the trainer, verified weight sync.

One vLLM engine serves the whole module (construction takes seconds); the tests that perturb
weights perturb a private copy of the trainer model and sync it, so their order does not
matter. Everything runs on the untrained builtin model (float32, CPU).
"""
from __future__ import annotations

import copy

import pytest
import torch

from trainer.engines.base import WeightSyncError, trainer_token_logprobs
from trainer.engines.hf_engine import HFEngine
from trainer.rollouts import SamplingConfig
from trainer.models.tiny import VOCAB, build_untrained, encode, save_folder
from tests.support.services import require_module

EOS = VOCAB["<eos>"]
PROMPTS = [encode("State the answer: 1 + 2 =\n"), encode("hi"), encode("7 - 9 =\n")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(trainer model, folder holding its weights)."""
    model, tok = build_untrained(seed=3, max_position_embeddings=512)
    folder = save_folder(model, tok, tmp_path_factory.mktemp("tiny"))
    return model, folder


@pytest.fixture(scope="module")
def vllm_engine(tiny):
    require_module("vllm")
    from trainer.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny[1], dtype="float32", seed=0, max_model_len=256, max_num_seqs=64)
    yield engine
    engine.close()


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.02) -> torch.nn.Module:
    """A copy of `model` after a training-like update (small noise on every weight)."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


def teacher_forced(model, prompt: list[int], response: list[int], temperature: float,
                   top_p: float = 1.0) -> torch.Tensor:
    """Log-probs of `response` after `prompt` under softmax(logits / T); with top_p < 1
    renormalised over each position's nucleus (what vLLM's processed log-probs report)."""
    with torch.no_grad():
        x = torch.tensor([prompt + response])
        logits = model.eval()(input_ids=x).logits[0, len(prompt) - 1:-1].float() / temperature
        lp = torch.log_softmax(logits, -1)
        if top_p < 1.0:
            p_sorted = lp.exp().sort(-1, descending=True).values
            mass = torch.where(p_sorted.cumsum(-1) - p_sorted < top_p, p_sorted, 0.0).sum(-1, keepdim=True)
            lp = lp - mass.log()
        return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def check_shape(gen, n: int, max_new: int) -> None:
    assert gen.prompt_index == [p for p in range(len(PROMPTS)) for _ in range(n)]
    assert len(gen.token_ids) == len(gen.logprobs) == len(gen.finished) == len(PROMPTS) * n
    for ids, lps, fin in zip(gen.token_ids, gen.logprobs, gen.finished):
        assert len(ids) == len(lps) and 1 <= len(ids) <= max_new
        assert all(lp <= 0 for lp in lps)
        # EOS ends a finished response and appears nowhere else; unfinished ones hit the cap.
        assert fin == (ids[-1] == EOS)
        assert EOS not in ids[:-1]
        if not fin:
            assert len(ids) == max_new


# --------------------------------------------------------------------------- vLLM


@pytest.mark.slow
def test_vllm_sync_then_greedy_matches_hf(tiny, vllm_engine):
    model = perturbed(tiny[0], seed=1)
    # The engine holds other weights (the untrained model's, or another test's copy) until the
    # sync; afterwards its log-probs are the policy's.
    assert vllm_engine.sync_check_diff(model) > 1e-2
    vllm_engine.sync_weights(model)
    assert vllm_engine.sync_check_diff(model) < 1e-3
    sampling = SamplingConfig(n=1, max_new_tokens=12, temperature=0.0)
    got = vllm_engine.generate(PROMPTS, sampling, ignore_eos=True)
    want = HFEngine(model, EOS).generate(PROMPTS, sampling, ignore_eos=True)
    assert got.token_ids == want.token_ids


@pytest.mark.slow
def test_vllm_sampled_logprobs_match_trainer(tiny, vllm_engine):
    model = perturbed(tiny[0], seed=2)
    vllm_engine.sync_weights(model)
    for temperature in (1.0, 0.7):
        gen = vllm_engine.generate(PROMPTS, SamplingConfig(n=4, max_new_tokens=10,
                                                           temperature=temperature, seed=5))
        for p, ids, lps in zip(gen.prompt_index, gen.token_ids, gen.logprobs):
            ref = teacher_forced(model, PROMPTS[p], ids, temperature)
            assert torch.allclose(torch.tensor(lps), ref, atol=1e-3), (temperature, lps, ref)


@pytest.mark.slow
def test_vllm_skipped_sync_is_detected(tiny, vllm_engine):
    synced = perturbed(tiny[0], seed=3)
    vllm_engine.sync_weights(synced)
    assert vllm_engine.verify(synced) < 1e-3
    # The trainer takes another step but the load is skipped: verification must refuse.
    stale = perturbed(synced, seed=4, scale=0.01)
    with pytest.raises(WeightSyncError):
        vllm_engine.verify(stale)
    vllm_engine.sync_weights(stale)  # and a real sync repairs it


@pytest.mark.slow
def test_vllm_shape_contract_and_eos(tiny, vllm_engine):
    # Raising EOS's output row makes both outcomes (stopped at EOS, cut at the cap) appear.
    model = perturbed(tiny[0], seed=6)
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5 * model.model.embed_tokens.weight.mean(0)
    vllm_engine.sync_weights(model)
    gen = vllm_engine.generate(PROMPTS, SamplingConfig(n=5, max_new_tokens=6, seed=1))
    check_shape(gen, 5, 6)
    assert any(gen.finished) and not all(gen.finished)
    # ignore_eos (benchmarks) gives full-length responses
    gen = vllm_engine.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=6), ignore_eos=True)
    assert all(len(t) == 6 and not f for t, f in zip(gen.token_ids, gen.finished))


@pytest.mark.slow
def test_vllm_samples_differ_within_group(tiny, vllm_engine):
    vllm_engine.sync_weights(tiny[0])
    gen = vllm_engine.generate(PROMPTS[:1], SamplingConfig(n=8, max_new_tokens=8, seed=2),
                               ignore_eos=True)
    assert len({tuple(t) for t in gen.token_ids}) > 1


# --------------------------------------------------------------------------- HF


def test_hf_shape_contract_and_logprobs(tiny):
    model = tiny[0]
    engine = HFEngine(model, EOS, max_batch_tokens=64)  # forces chunking and group splits
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        gen = engine.generate(PROMPTS, SamplingConfig(n=5, max_new_tokens=7, temperature=temperature,
                                                      top_p=top_p, seed=4))
        check_shape(gen, 5, 7)
        for p, ids, lps in zip(gen.prompt_index, gen.token_ids, gen.logprobs):
            ref = teacher_forced(model, PROMPTS[p], ids, temperature, top_p)
            assert torch.allclose(torch.tensor(lps), ref, atol=1e-4)


@pytest.mark.parametrize("vocab", [6, 3_000])
def test_hf_sampler_draws_each_token_with_its_probability(vocab):
    """`_draw` (the HF engine's inverse-CDF sampler): every token's frequency over many rows
    is its probability within 5 standard errors, across several blocks and a partial last
    block, and a token of probability 0 (outside a top_p nucleus) is never drawn."""
    from trainer.engines.hf_engine import _draw

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
    probs[::3] = 0.0
    probs = probs / probs.sum()
    rows = 200_000 if vocab < 100 else 60_000
    drawn = _draw(probs.repeat(rows, 1), gen)
    freq = torch.bincount(drawn, minlength=vocab).double() / rows
    assert freq[::3].sum() == 0
    p = probs.double()
    se = (p * (1 - p) / rows).sqrt()
    common = p * rows >= 20  # where the normal approximation holds; the rest are checked in sum
    assert common.sum() >= min(vocab // 3, 100)
    assert ((freq - p).abs()[common] <= 5 * se[common]).all()
    rare = p[~common & (p > 0)].sum()
    assert abs(freq[~common & (p > 0)].sum() - rare) <= 5 * (rare * (1 - rare) / rows).sqrt() + 1e-12
    # The same generator state draws the same tokens (runs are reproducible from the seed).
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(_draw(probs.repeat(64, 1), g1), _draw(probs.repeat(64, 1), g2))
    # Probabilities from NaN logits are refused with a message, as torch.multinomial refused them.
    with pytest.raises(ValueError, match="not finite"):
        _draw(torch.full((2, vocab), float("nan")), gen)


def test_hf_dropping_finished_rows_keeps_the_samples(tiny):
    """Finished rows leave the forward, and the drawn tokens and log-probs are the same as
    when every row runs to the end; the KV budget splits the prompts into chunks."""
    model = tiny[0]
    rows: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    sampling = SamplingConfig(n=24, max_new_tokens=30, temperature=1.3, seed=5)
    try:
        gens = {}
        for compact in (False, True):
            engine = HFEngine(model, EOS, compact=compact, max_kv_bytes=4_000_000)
            engine.eos_ids = list(range(12))  # ~12 % EOS per token: responses of all lengths
            rows.clear()
            gens[compact] = engine.generate(PROMPTS, sampling)
            gens[compact, "rows"] = list(rows)
    finally:
        hook.remove()
    plain, fast = gens[False], gens[True]
    assert fast.token_ids == plain.token_ids and fast.finished == plain.finished
    for a, b in zip(plain.logprobs, fast.logprobs):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-5, atol=1e-5)
    assert len({len(t) for t in plain.token_ids}) > 5
    assert sum(gens[True, "rows"]) < 0.7 * sum(gens[False, "rows"])
    # 30 MB of KV at 16 KiB per token: fewer rows per chunk than the 72 samples.
    assert max(gens[False, "rows"]) < 72


def test_hf_preallocated_cache_keeps_the_samples(tiny):
    """The decode writes into a cache allocated once per chunk (no per-step concatenation):
    with prompts of different lengths (left padding), finished rows dropped and a KV budget
    that splits the prompts into chunks, the tokens drawn and their log-probs are those of
    HF's own growing cache."""
    from trainer.engines.hf_engine import _Preallocated

    model = tiny[0]
    kinds: set[str] = set()
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: kinds.update(type(layer).__name__ for layer in kw["past_key_values"].layers)
        if kw.get("past_key_values") is not None else None, with_kwargs=True)
    sampling = SamplingConfig(n=24, max_new_tokens=40, temperature=1.2, seed=11)
    gens, seen = {}, {}
    try:
        for pre in (False, True):
            engine = HFEngine(model, EOS, preallocate=pre, max_kv_bytes=4_000_000)
            engine.eos_ids = list(range(10))  # responses of all lengths, rows dropped on the way
            kinds.clear()
            gens[pre] = engine.generate(PROMPTS, sampling)
            seen[pre] = set(kinds)
    finally:
        hook.remove()
    assert seen[True] == {_Preallocated.__name__} and _Preallocated.__name__ not in seen[False]
    assert gens[True].token_ids == gens[False].token_ids and gens[True].finished == gens[False].finished
    assert len({len(t) for t in gens[False].token_ids}) > 5
    for a, b in zip(gens[False].logprobs, gens[True].logprobs):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-6, atol=1e-6)


def test_hf_eos_and_determinism(tiny):
    engine = HFEngine(tiny[0], EOS)
    a = engine.generate(PROMPTS, SamplingConfig(n=16, max_new_tokens=40, seed=9))
    b = engine.generate(PROMPTS, SamplingConfig(n=16, max_new_tokens=40, seed=9))
    assert a.token_ids == b.token_ids
    check_shape(a, 16, 40)
    assert any(a.finished)  # 100 tokens, 40 draws: some samples hit EOS


def test_hf_left_padding_does_not_change_results(tiny):
    """A prompt's greedy continuation is the same alone and batched with longer prompts."""
    engine = HFEngine(tiny[0], EOS)
    greedy = SamplingConfig(n=2, max_new_tokens=8, temperature=0.0)
    together = engine.generate(PROMPTS, greedy, ignore_eos=True)
    alone = engine.generate(PROMPTS[1:2], greedy, ignore_eos=True)
    assert together.token_ids[2:4] == alone.token_ids
    assert torch.allclose(torch.tensor(together.logprobs[2]), torch.tensor(alone.logprobs[0]), atol=1e-5)


def test_hf_sync_is_noop_for_same_model_and_copies_otherwise(tiny):
    model = tiny[0]
    engine = HFEngine(copy.deepcopy(model), EOS)
    assert HFEngine(model, EOS).sync_weights(model) == 0.0
    other = perturbed(model, seed=8)
    engine.sync_weights(other)
    ids = PROMPTS[0]
    assert torch.equal(trainer_token_logprobs(engine.model, ids), trainer_token_logprobs(other, ids))


def test_make_engine_builds_hf_and_refuses_unknown(tiny):
    from trainer.engines import RolloutEngine, make_engine

    from trainer.models.loading import load_policy

    model, tok = load_policy(tiny[1], "auto", "cpu")
    engine = make_engine("hf", tiny[1], model, tok, dtype="auto", seed=0, max_model_len=256,
                         max_num_seqs=8)
    assert isinstance(engine, RolloutEngine) and engine.name == "hf"
    assert engine.sync_weights(model) == 0.0
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("tgi", tiny[1], model, tok, dtype="auto", seed=0, max_model_len=256,
                    max_num_seqs=8)


def test_auto_engine_is_hf_on_cpu():
    import torch

    from trainer.engines import default_engine

    assert default_engine(torch.device("cpu")) == "hf"


def test_hf_stops_on_every_generation_config_eos(tiny):
    model = copy.deepcopy(tiny[0])
    greedy = SamplingConfig(n=2, max_new_tokens=6, temperature=0.0)
    first = HFEngine(model, EOS).generate(PROMPTS[:1], greedy, ignore_eos=True).token_ids[0][0]
    assert first != EOS
    model.generation_config.eos_token_id = [EOS, first]   # e.g. <|im_end|> and <|endoftext|>
    gen = HFEngine(model, EOS).generate(PROMPTS[:1], greedy)
    assert gen.token_ids == [[first], [first]] and all(gen.finished)


def test_unsupported_vllm_version_fails_with_a_clear_message():
    from trainer.engines.vllm_engine import check_vllm_version

    check_vllm_version("0.32.0")
    with pytest.raises(RuntimeError, match="weight sync uses vLLM internals"):
        check_vllm_version("0.33.1")


def test_vllm_concurrency_and_kv_cache_are_sized_from_the_step(tiny):
    from trainer.engines.vllm_engine import MAX_NUM_SEQS_CAP, kv_cache_bytes, size_max_num_seqs

    assert [size_max_num_seqs(s) for s in (0, 64, 512)] == [1, 64, 512]
    assert size_max_num_seqs(64 * 512) == MAX_NUM_SEQS_CAP  # vLLM queues the rest
    small, large = (kv_cache_bytes(tiny[1], "float32", 256, s) for s in (8, 64))
    assert large > small  # the cache grows with the concurrency it must hold at full length
