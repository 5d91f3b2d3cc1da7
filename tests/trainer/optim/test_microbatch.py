"""Micro-batching on a tiny random Qwen2: padding is invisible, gradients add up exactly,
and N = 512 runs with a micro-batch budget far below the step's token count."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer.algo.losses import KL_ESTIMATORS, is_weights, ppo_clip_terms, token_sum
from trainer.optim.update import (
    MAX_AUTO_TOKENS, UpdateConfig, auto_micro_batch_tokens, micro_batches, ppo_update,
    sequence_logprobs,
)
from trainer.rollouts import Rollouts

VOCAB = 64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return Qwen2ForCausalLM(cfg).float().eval()


def _rollouts(n, seed, prompt_len=(2, 7), resp_len=(1, 8), shared_prompt=False):
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    tokens = lambda k: torch.randint(1, VOCAB, (k,), generator=g).tolist()
    prompt = tokens(4)
    prompts = [prompt if shared_prompt else tokens(rand(*prompt_len)) for _ in range(n)]
    responses = [tokens(rand(*resp_len)) for _ in range(n)]
    return Rollouts(
        prompt_ids=prompts, response_ids=responses,
        engine_logprobs=[(-3.0 - torch.rand(len(r), generator=g)).tolist() for r in responses],
        group=torch.arange(n) // 4, rewards=torch.rand(n, generator=g),
        truncated=torch.zeros(n, dtype=torch.bool), advantages=torch.randn(n, generator=g))


class GradCapture:
    """An optimizer stand-in that records the gradients it is asked to apply."""

    def __init__(self, model):
        self.params = list(model.parameters())
        self.grads = None

    def step(self):
        self.grads = [p.grad.clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


# ----------------------------------------------------------------------------- packing


def test_micro_batches_respect_budget_and_cover_all():
    lengths = [5, 17, 3, 3, 9, 40, 1, 8, 8, 12]
    chunks = micro_batches(lengths, 24)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    for c in chunks:
        assert len(c) * max(lengths[i] for i in c) <= 24 or len(c) == 1
    assert [5] in chunks  # longer than the budget: alone, and first (longest first)
    assert chunks[0] == [5]


def test_auto_micro_batch_tokens(model):
    assert auto_micro_batch_tokens(model, 128) == MAX_AUTO_TOKENS
    assert auto_micro_batch_tokens(model, 10**6) == 10**6
    big = type("M", (), {})()  # a Qwen2.5-1.5B-shaped config in bf16
    big.config = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                             num_hidden_layers=28)
    big.parameters = lambda: iter([torch.zeros(1, dtype=torch.bfloat16)])
    assert 256 <= auto_micro_batch_tokens(big, 256) <= 4096


# ----------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("max_tokens", [10, 1000])
def test_sequence_logprobs_padding_is_invisible(model, max_tokens):
    ro = _rollouts(9, seed=1)
    lps, ents = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 0.8, max_tokens,
                                  with_entropy=True)
    for p, r, lp, ent in zip(ro.prompt_ids, ro.response_ids, lps, ents):
        with torch.no_grad():
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1:-1] / 0.8
        want = logits.log_softmax(-1).gather(-1, torch.tensor(r)[:, None])[:, 0]
        torch.testing.assert_close(lp, want, atol=1e-5, rtol=1e-5)
        probs = logits.softmax(-1)
        torch.testing.assert_close(ent, -(probs * probs.log()).sum(-1), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- gradients


def _full_batch_grads(model, ro, old, ref, cfg):
    """One padded forward over the whole mini-batch, written independently of trainer/optim/update.py."""
    B = len(ro)
    seqs = [p + r for p, r in zip(ro.prompt_ids, ro.response_ids)]
    L, R = max(map(len, seqs)), max(map(len, ro.response_ids))
    ids = torch.zeros(B, L, dtype=torch.long)
    attn = torch.zeros(B, L, dtype=torch.long)
    pos = torch.zeros(B, R, dtype=torch.long)
    tgt = torch.zeros(B, R, dtype=torch.long)
    mask = torch.zeros(B, R, dtype=torch.bool)
    pad = lambda rows: torch.stack([torch.nn.functional.pad(torch.as_tensor(x, dtype=torch.float),
                                                            (0, R - len(x))) for x in rows])
    for i, (p, r) in enumerate(zip(ro.prompt_ids, ro.response_ids)):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        attn[i, :len(p) + len(r)] = 1
        pos[i, :len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
        tgt[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = True
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=attn).logits / cfg.temperature
    logp_all = logits.log_softmax(-1).gather(1, pos[..., None].expand(-1, -1, VOCAB))
    logp = logp_all.gather(-1, tgt[..., None])[..., 0]
    w, _ = is_weights(pad(old), pad(ro.engine_logprobs), cfg.is_band)
    pg, _, _ = ppo_clip_terms(logp, pad(old), ro.advantages, cfg.clip_low, cfg.clip_high)
    per_tok = w * pg + cfg.kl_coef * KL_ESTIMATORS[cfg.kl_estimator](logp, pad(ref))
    (token_sum(per_tok, mask) / mask.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_micro_batched_gradient_equals_full_batch(model, estimator):
    ro = _rollouts(12, seed=2)
    g = torch.Generator().manual_seed(3)
    cur = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 1000)
    # Perturb old log-probs so that both clips are active; engine log-probs so that some
    # tokens fall outside the IS band; a reference that differs so that KL has a gradient.
    old = [c + 0.4 * torch.randn(len(c), generator=g) for c in cur]
    ro.engine_logprobs = [(o + 1.2 * torch.randn(len(o), generator=g)).tolist() for o in old]
    ref = [c + 0.3 * torch.randn(len(c), generator=g) for c in cur]
    cfg = UpdateConfig(kl_coef=0.5, kl_estimator=estimator, grad_clip=None)

    want = _full_batch_grads(model, ro, old, ref, cfg)
    opt = GradCapture(model)
    stats = ppo_update(model, opt, ro, old, ref, cfg, max_tokens=16)
    for got, exp in zip(opt.grads, want):
        torch.testing.assert_close(got, exp, atol=1e-5, rtol=1e-4)
    assert stats["pg_clipfrac_low"] > 0 and stats["pg_clipfrac_high"] > 0
    assert 0 < stats["is_truncated_frac"] < 1
    assert all(p.grad is None for p in model.parameters())  # zero_grad was called


def test_large_group_runs_in_small_micro_batches(model):
    ro = _rollouts(512, seed=4, resp_len=(1, 7), shared_prompt=True)
    old = sequence_logprobs(model, ro.prompt_ids, ro.response_ids, 1.0, 8192)
    ro.engine_logprobs = [o.tolist() for o in old]
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        stats = ppo_update(model, opt, ro, old, old, UpdateConfig(), max_tokens=128)
    finally:
        hook.remove()
    step_tokens = sum(len(p) + len(r) for p, r in zip(ro.prompt_ids, ro.response_ids))
    assert step_tokens > 20 * 128
    assert len(shapes) > 20 and max(b * L for b, L in shapes) <= 128
    assert stats["n_tokens"] == sum(map(len, ro.response_ids))
    assert stats["is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["is_truncated_frac"] == 0.0 and stats["kl"] == pytest.approx(0.0, abs=1e-8)
    assert stats["pg_clipfrac_low"] == 0.0 and stats["pg_clipfrac_high"] == 0.0
    assert stats["entropy"] > 0 and stats["grad_norm"] > 0


def test_update_moves_parameters_and_needs_advantages(model):
    import copy
    m = copy.deepcopy(model)
    ro = _rollouts(6, seed=5)
    old = sequence_logprobs(m, ro.prompt_ids, ro.response_ids, 1.0, 100)
    before = [p.clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    stats = ppo_update(m, opt, ro, old, None, UpdateConfig(is_band=None, grad_clip=0.5), 100)
    assert stats["kl"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))
    ro.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        ppo_update(m, opt, ro, old, None, UpdateConfig(), 100)


def test_update_config_from_spec():
    from trainer.spec import JobSpec

    spec = JobSpec.model_validate({"name": "t", "task": {"dataset": {"id": "ds_x"}},
                                   "algo": {"kl_estimator": "k3", "is_truncation": None}})
    cfg = UpdateConfig.from_spec(spec)
    assert cfg == UpdateConfig(0.2, 0.27, 1e-4, "k3", None, 1.0, 1.0)
