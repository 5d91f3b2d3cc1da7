"""Sliding-window models (Mistral, Gemma 2, Gemma 3, Qwen2 with use_sliding_window) in the
shared-prompt update: every log-prob equals the sample run alone, and the first step's
trainer/engine ratio is 1.

The window counts cache slots, not positions: a short prompt right-padded to its chunk's
longest leaves a gap of padding slots before its responses, which pushes real tokens out of
the window. The configs are tiny but keep the real layer layouts (Gemma's alternating
sliding/full layers, Qwen2's per-layer types); window 8 with prompts of 3..14 tokens and
responses up to 24 makes the window bite on every model.
"""
from __future__ import annotations

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from trainer.engines.hf_engine import HFEngine
from trainer.rollouts import Rollouts, SamplingConfig
from trainer.optim.update import (UpdateConfig, attention_window, ppo_update, prefix_micro_batches,
                            sequence_logprobs)

VOCAB, WINDOW = 64, 8
_SIZE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16)
MODELS = {
    "mistral": lambda: MistralForCausalLM(MistralConfig(**_SIZE, sliding_window=WINDOW)),
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**_SIZE, sliding_window=WINDOW)),
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(
        **_SIZE, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "qwen2_sliding": lambda: Qwen2ForCausalLM(Qwen2Config(
        **_SIZE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0)),
}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().float().train()


def _samples(seed=0):
    """Groups of (prompt length, N) with responses of 1..23 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen, n in ((3, 4), (14, 3), (11, 4), (6, 3)):
        p = torch.randint(1, VOCAB, (plen,), generator=g).tolist()
        for _ in range(n):
            prompts.append(p)
            responses.append(torch.randint(1, VOCAB, (int(torch.randint(1, 24, (), generator=g)),),
                                           generator=g).tolist())
    return prompts, responses


@torch.no_grad()
def _alone(model, prompt, response) -> torch.Tensor:
    """log pi(response | prompt) with the sample run by itself: no padding, no sharing."""
    x = torch.tensor([prompt + response])
    lp = torch.log_softmax(model(input_ids=x).logits[0].float(), -1)
    return lp[len(prompt) - 1:-1].gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_attention_window_is_read_from_the_config(name):
    assert attention_window(_model(name)) == WINDOW


def test_full_attention_models_have_no_window():
    assert attention_window(Qwen2ForCausalLM(Qwen2Config(**_SIZE))) is None  # sliding_window set, unused
    full = Gemma3TextConfig(**_SIZE, sliding_window=WINDOW, layer_types=["full_attention"] * 2)
    assert attention_window(Gemma3ForCausalLM(full)) is None


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shared", [True, False])
def test_logprobs_equal_each_sample_run_alone(name, shared):
    model = _model(name).eval()
    prompts, responses = _samples()
    # The window must bite, or the comparison says nothing about it.
    assert max(len(p) + len(r) for p, r in zip(prompts, responses)) > 2 * WINDOW
    got = sequence_logprobs(model, prompts, responses, 1.0, 4096, shared_prefix=shared)
    for p, r, lp in zip(prompts, responses, got):
        torch.testing.assert_close(lp, _alone(model, p, r), rtol=0, atol=1e-5)


def test_prefix_chunks_hold_one_prompt_length_unless_the_window_cannot_bite():
    prompts, responses = _samples()
    chunks = prefix_micro_batches(prompts, responses, 4096, window=WINDOW)
    for c in chunks:
        lengths = {len(prompts[i]) for i in c}
        fits = max(lengths) + max(len(responses[i]) for i in c) <= WINDOW
        assert len(lengths) == 1 or fits
    assert sorted(i for c in chunks for i in c) == list(range(len(prompts)))
    # Without a window the whole batch shares one chunk (the fast path is kept for full attention).
    assert len(prefix_micro_batches(prompts, responses, 4096)) == 1
    # A wide window (Mistral's 4096) that no sample reaches keeps one chunk too.
    assert len(prefix_micro_batches(prompts, responses, 4096, window=4096)) == 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_first_step_trainer_engine_ratio_is_one(name):
    """The HF engine samples 24 tokens after prompts of different lengths; the update's first
    mini-batch (old = current) recomputes them: the trainer/engine ratio must be 1."""
    model = _model(name)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 14, 5)]
    gen = HFEngine(model, 0).generate(
        prompts, SamplingConfig(n=4, max_new_tokens=24, temperature=1.0, top_p=1.0, seed=0), ignore_eos=True)
    S = len(gen.token_ids)
    batch = Rollouts(prompt_ids=[prompts[i] for i in gen.prompt_index], response_ids=gen.token_ids,
                     engine_logprobs=gen.logprobs, group=torch.tensor(gen.prompt_index),
                     rewards=torch.zeros(S), truncated=torch.ones(S, dtype=torch.bool),
                     advantages=torch.randn(S, generator=g))
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    stats = ppo_update(model, torch.optim.SGD(model.parameters(), lr=1e-2), batch, None, None,
                       UpdateConfig(kl_coef=0.0), 4096)
    assert stats["is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["is_truncated_frac"] == 0.0
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))  # it did update
