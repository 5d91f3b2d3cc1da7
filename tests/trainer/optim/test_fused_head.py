"""The head's gradient fused into the log-prob forward (trainer/optim/fused_head.py) against the
unfused `token_logp` path, through the update's real entry point (`ppo_update`): every
parameter's gradient, the loss and every statistic equal to float tolerance, on the plain
padded batch, packed rows, the shared-prompt forward, a sliding-window model and a model whose
own logits are taken (no sliced head); with ppo, cispo and dr_grpo, the KL term on, the
multi-turn loss mask, old log-probs given, fp32_head under bf16, a frozen head. GSPO takes the
unfused path (`UpdateConfig.fuses`) and still matches."""
import copy

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from tests.support.rollout_batches import random_rollouts
from trainer.optim.model_io import sliced_head
from trainer.optim.update import Rows, UpdateConfig, _chunks, ppo_update

VOCAB = 96
_SIZE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
MODELS = {
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**_SIZE)),
    # a small window that the prompts + responses below exceed (bench/sliding_window.py's Mistral)
    "mistral_window": lambda: MistralForCausalLM(MistralConfig(**_SIZE, head_dim=8, sliding_window=8)),
    # logit soft-capping: no sliced head, the model's own logits are the segments
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**_SIZE, head_dim=8, sliding_window=8)),
}
# (shared prompt, packed rows); packing needs a full-attention plain head, so the window model
# and gemma2 run the other two layouts only
LAYOUTS = {"padded": (False, False), "packed": (False, True), "shared": (True, False), "shared_packed": (True, True)}


class _Capture:
    """An optimizer that keeps the mini-batch's gradients instead of stepping."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def step(self):
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)


def _model(name):
    torch.manual_seed(0)
    return MODELS[name]().float().train()


def _batch(loss_mask: bool):
    b = random_rollouts(((5, 4), (3, 9), (1, 6)), lambda g: 1 + int(torch.randint(0, 19, (), generator=g)),
                        vocab=VOCAB, max_new=20, engine_level=-4.6)
    if loss_mask:  # an environment's turn in the middle of each longer response carries no loss
        b.loss_mask = [[0 if len(r) > 4 and len(r) // 3 <= t < len(r) // 2 else 1 for t in range(len(r))]
                       for r in b.response_ids]
    return b


def _run(model, batch, fused: bool, *, old=None, kl=True, max_tokens=60, **cfg):
    g = torch.Generator().manual_seed(1)
    ref = [torch.tensor(e) + 0.3 * torch.randn(len(e), generator=g) for e in batch.engine_logprobs] if kl else None
    config = UpdateConfig(kl_coef=0.1 if kl else 0.0, grad_clip=None, fused_head=fused, **cfg)
    opt = _Capture(model)
    stats = ppo_update(model, opt, batch, old, ref, config, max_tokens)
    return stats, opt.grads


def _assert_same(name, batch, *, rtol=1e-5, atol=1e-6, frozen_head=False, **kw):
    base = _model(name)
    if frozen_head:
        base.get_output_embeddings().weight.requires_grad_(False)
    s0, g0 = _run(copy.deepcopy(base), batch, False, **kw)
    s1, g1 = _run(copy.deepcopy(base), batch, True, **kw)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=rtol, atol=atol, msg=k)
    for k in s0:
        assert s1[k] == pytest.approx(s0[k], rel=rtol, abs=atol), k
    assert s0["grad_norm"] > 0
    return s0, g0


@pytest.mark.parametrize("loss", ["ppo", "cispo", "dr_grpo"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_matches_unfused_on_every_layout(loss, layout):
    shared, pack = LAYOUTS[layout]
    batch = _batch(loss_mask=True)
    model = _model("qwen2")
    chunks, is_shared = _chunks(model, batch.prompt_ids, batch.response_ids, 60, shared, pack)
    assert is_shared == shared and len(chunks) > 1  # several micro-batches
    assert pack == isinstance(chunks[0], Rows)
    _assert_same("qwen2", batch, loss=loss, shared_prefix=shared, pack=pack)


@pytest.mark.parametrize("loss", ["ppo", "cispo", "dr_grpo"])
@pytest.mark.parametrize("name", ["mistral_window", "gemma2"])
@pytest.mark.parametrize("shared", [True, False])
def test_fused_matches_on_a_sliding_window_and_on_the_models_own_logits(loss, name, shared):
    assert (sliced_head(_model(name)) is None) == (name == "gemma2")
    _assert_same(name, _batch(loss_mask=True), loss=loss, shared_prefix=shared)


@pytest.mark.parametrize("kl", [True, False])
def test_fused_matches_with_old_logprobs_given_and_without_kl(kl):
    batch = _batch(loss_mask=False)
    g = torch.Generator().manual_seed(2)
    # a second mini-batch: the policy moved, so ratios are off 1 and some tokens clip
    old = [torch.tensor(e) + 0.3 * torch.randn(len(e), generator=g) for e in batch.engine_logprobs]
    s, _ = _assert_same("qwen2", batch, old=old, kl=kl, loss="ppo")
    assert s["pg_clipfrac_low"] + s["pg_clipfrac_high"] > 0


@pytest.mark.parametrize("name", ["qwen2", "gemma2"])
def test_fused_matches_with_fp32_head_under_bf16(name):
    # the layers run in bf16 (the same in both paths), the head and log-softmax in float32
    _assert_same(name, _batch(loss_mask=True), rtol=1e-4, atol=1e-5, fp32_head=True,
                 compute_dtype=torch.bfloat16, loss="cispo")


def test_frozen_head_gets_no_gradient_and_the_rest_matches():
    _, grads = _assert_same("qwen2", _batch(loss_mask=False), frozen_head=True, loss="ppo")
    assert "lm_head.weight" not in grads and "model.embed_tokens.weight" in grads


def test_gspo_goes_unfused_and_still_matches():
    assert not UpdateConfig(loss="gspo").fuses and UpdateConfig(loss="ppo").fuses
    assert not UpdateConfig(loss="ppo", fused_head=False).fuses
    _assert_same("qwen2", _batch(loss_mask=True), loss="gspo")
