"""The objectives of `algo.loss` (trainer/algo/objectives.py): value and gradient on a batch
small enough to do by hand, and the same objective in every layout of the update."""
import copy
import math

import pytest
import torch

from trainer.algo.objectives import OBJECTIVES, Totals
from trainer.optim.update import UpdateConfig, _chunks, ppo_update, sequence_logprobs
from tests.trainer.optim.test_update_packed import _batch, _model

CLIP_LOW, CLIP_HIGH = 0.2, 0.27
SMALL = ((8, 9), (4, 17), (1, 30))  # groups of (n, prompt length): a few micro-batches at 400 tokens


def _hand_batch():
    """Two samples, 2 and 1 response tokens (the [1, 1] slot is padding, holding a NaN that
    must stay inert). Ratios r = exp(logp - old): sample 0: [1.5, 1.0], sample 1: [0.5];
    advantages +1 and -1."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0 - math.log(1.5), -2.0], [-0.5 + math.log(2.0), 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True], [True, False]])
    return logp, old, adv, mask


def _value_and_grad(name: str, max_new_tokens: int = 4):
    logp, old, adv, mask = _hand_batch()
    obj = OBJECTIVES[name]
    per_token, low, high = obj.terms(logp, old, adv, mask, CLIP_LOW, CLIP_HIGH)
    loss = obj.aggregate(per_token, mask, Totals(tokens=3, samples=2, max_new_tokens=max_new_tokens))
    loss.backward()
    return loss.item(), torch.nan_to_num(logp.grad), low & mask, high & mask


def test_ppo_value_and_gradient():
    # Token (0,0): r 1.5 > 1.27 with A > 0: clipped, term -1.27, no gradient.
    # Token (0,1): r 1, term -1, d/dlogp = -r A = -1.
    # Token (1,0): r 0.5 < 0.8 with A < 0: clipped, term -min(-0.5, -0.8) = 0.8, no gradient.
    # Mean over the 3 tokens: (-1.27 - 1 + 0.8) / 3 = -0.49; gradient -1/3 at (0,1).
    loss, grad, low, high = _value_and_grad("ppo")
    assert loss == pytest.approx(-0.49)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1 / 3], [0.0, 0.0]]))
    assert low.tolist() == [[False, False], [True, False]]
    assert high.tolist() == [[True, False], [False, False]]


def test_gspo_value_and_gradient():
    # Sample 0: s = exp((ln 1.5 + 0) / 2) = sqrt(1.5) = 1.2247 < 1.27, unclipped: -s A = -1.2247,
    # d/dlogp_t = -A s / 2 (the mean over its 2 tokens), then / 2 samples: -s / 4 = -0.30619.
    # Sample 1: s = 0.5 < 0.8 with A < 0: clipped, 0.8, no gradient.
    # Mean over sequences: (-1.2247 + 0.8) / 2 = -0.21237.
    loss, grad, low, high = _value_and_grad("gspo")
    s = math.sqrt(1.5)
    assert loss == pytest.approx((-s + 0.8) / 2)
    torch.testing.assert_close(grad, torch.tensor([[-s / 4, -s / 4], [0.0, 0.0]]))
    assert low.tolist() == [[False, False], [True, False]] and not high.any()


def test_cispo_value_and_gradient():
    # Weights sg(min(r, 1.27)): 1.27, 1, 0.5. Terms -w A logp: -1.27 x 1 x -1 = 1.27,
    # -1 x 1 x -2 = 2, -0.5 x -1 x -0.5 = -0.25; mean over 3 tokens: 3.02 / 3.
    # Gradient -w A / 3: every token gets one, the capped one too (PPO dropped two of three).
    loss, grad, low, high = _value_and_grad("cispo")
    assert loss == pytest.approx(3.02 / 3)
    torch.testing.assert_close(grad, torch.tensor([[-1.27 / 3, -1 / 3], [0.5 / 3, 0.0]]))
    assert high.tolist() == [[True, False], [False, False]] and not low.any()


def test_dr_grpo_value_and_gradient():
    # PPO's terms summed (-1.47) over samples x max_new_tokens = 2 x 4: -0.18375; the one
    # unclipped token's gradient -1 / 8.
    loss, grad, _, _ = _value_and_grad("dr_grpo", max_new_tokens=4)
    assert loss == pytest.approx(-1.47 / 8)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1 / 8], [0.0, 0.0]]))
    # The normaliser is a constant: a longer budget scales the loss, whatever the lengths.
    assert _value_and_grad("dr_grpo", max_new_tokens=8)[0] == pytest.approx(-1.47 / 16)


def test_ppo_objective_is_the_previous_update_bit_for_bit():
    # The default objective must be today's: sum of is_weight x clipped term / the tokens.
    from trainer.algo.losses import ppo_clip_terms, token_sum
    logp, old, adv, mask = _hand_batch()
    want = token_sum(ppo_clip_terms(logp, old, adv, CLIP_LOW, CLIP_HIGH)[0], mask) / 3
    got = OBJECTIVES["ppo"].aggregate(OBJECTIVES["ppo"].terms(logp, old, adv, mask, CLIP_LOW, CLIP_HIGH)[0],
                                      mask, Totals(3, 2, 4))
    assert torch.equal(got, want)


def _update(model, batch, loss: str, *, pack: bool, shared: bool, max_tokens: int):
    cfg = UpdateConfig(kl_coef=0.1, kl_estimator="k3", grad_clip=None, shared_prefix=shared, pack=pack,
                       loss=loss, max_new_tokens=120, clip_low=0.2, clip_high=0.27)
    g = torch.Generator().manual_seed(1)
    ref = [torch.tensor(e) + 0.05 * torch.randn(len(e), generator=g) for e in batch.engine_logprobs]
    # old log-probs a little off the current ones, so ratios move and clipping is exercised
    cur = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 1.0, 100_000, pack=False,
                            shared_prefix=False)
    old = [c + 0.2 * torch.randn(len(c), generator=g) for c in cur]
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = ppo_update(model, optim, batch, old, ref, cfg, max_tokens)
    return stats, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("loss", ["gspo", "cispo", "dr_grpo"])
def test_objective_same_in_every_layout(loss):
    """Plain padded rows, packed rows, shared-prompt and packed shared-prompt micro-batches (many
    of them) give the one-chunk plain update's loss, gradient norm and weights."""
    batch, base = _batch(SMALL), _model()
    for shared in (False, True):  # several micro-batches, some rows holding several samples
        chunks = _chunks(base, batch.prompt_ids, batch.response_ids, 400, shared)[0]
        assert len(chunks) > 1 and any(n > 1 for c in chunks for n in c.sizes)
    ref, w_ref = _update(copy.deepcopy(base), batch, loss, pack=False, shared=False, max_tokens=100_000)
    assert ref["grad_norm"] > 0 and math.isfinite(ref["loss"])
    for pack, shared in ((False, False), (True, False), (False, True), (True, True)):
        got, w = _update(copy.deepcopy(base), batch, loss, pack=pack, shared=shared, max_tokens=400)
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7), (pack, shared)
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5), (pack, shared)
        for a, b in zip(w_ref, w):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_objectives_differ_on_the_same_batch():
    """Not one objective under four names: the losses on one batch are four different numbers."""
    batch, base = _batch(SMALL), _model()
    losses = {name: _update(copy.deepcopy(base), batch, name, pack=True, shared=True, max_tokens=400)[0]["loss"]
              for name in OBJECTIVES}
    assert len({round(v, 6) for v in losses.values()}) == 4, losses


def test_mismatch_metrics():
    """mismatch_kl is the k3 estimate of KL(engine || trainer) on the sampled tokens and is_ess
    the normalised effective sample size of the token ratios: 0 and 1 when they agree."""
    batch, base = _batch(SMALL), _model()
    model = copy.deepcopy(base)
    cur = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 1.0, 100_000)
    same = copy.copy(batch)
    same.engine_logprobs = [c.tolist() for c in cur]
    cfg = UpdateConfig(kl_coef=0.0, grad_clip=None, is_band=None)
    stats = ppo_update(model, torch.optim.SGD(model.parameters(), lr=0.0), same, None, None, cfg, 400)
    assert stats["mismatch_kl"] == pytest.approx(0.0, abs=1e-5)
    assert stats["is_ess"] == pytest.approx(1.0, abs=1e-5)
    # engine log-probs off by +-0.5 on alternate tokens: r = e^{+-0.5} per token
    off = copy.copy(batch)
    off.engine_logprobs = [[c + (0.5 if j % 2 else -0.5) for j, c in enumerate(row.tolist())] for row in cur]
    model = copy.deepcopy(base)
    stats = ppo_update(model, torch.optim.SGD(model.parameters(), lr=0.0), off, None, None, cfg, 400)
    r = torch.tensor([math.exp(-0.5 if j % 2 else 0.5) for row in cur for j in range(len(row))], dtype=torch.float64)
    assert stats["mismatch_kl"] == pytest.approx(float((r - 1 - r.log()).mean()), rel=1e-3)
    assert stats["is_ess"] == pytest.approx(float(r.sum() ** 2 / (len(r) * (r * r).sum())), rel=1e-3)
    assert stats["is_ess"] < 0.95


@pytest.mark.parametrize("loss", ["gspo", "cispo", "dr_grpo"])
def test_objective_with_a_lora_adapter(loss):
    """With a LoRA adapter: the shared-prompt update gives the plain one's loss and gradient, and
    only the adapter moves."""
    from tests.trainer.models.test_lora import _kick, _lora, _small_batch
    from trainer.models.lora import trainable_parameters

    batch, base = _small_batch(), _lora()
    _kick(base)
    results = []
    for shared in (False, True):
        model = copy.deepcopy(base)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        cfg = UpdateConfig(kl_coef=0.0, grad_clip=None, shared_prefix=shared, loss=loss, max_new_tokens=120)
        stats = ppo_update(model, torch.optim.SGD(trainable_parameters(model), lr=1.0), batch, None, None, cfg, 300)
        moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
        assert moved and all("lora_" in n for n in moved)
        results.append(stats)
    plain, shared = results
    assert plain["grad_norm"] > 0
    assert shared["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
    assert shared["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
