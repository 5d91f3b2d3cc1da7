"""Token-level objective pieces on hand-built tensors: KL, IS truncation, clipping, aggregation."""
import math

import pytest
import torch

from trainer.algo.losses import (
    KL_ESTIMATORS, entropy_from_logits, is_weights, kl_k1, kl_k2, kl_k3, ppo_clip_terms,
    token_sum,
)

PI = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
REF = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1], dtype=torch.float64)
KL_TRUE = float((PI * (PI / REF).log()).sum())


def _token_mean(x, mask, n_tokens):
    """The update's aggregation (trainer/optim/update.py): token_sum over the mini-batch's tokens."""
    return token_sum(x, mask) / max(n_tokens, 1)


@pytest.mark.parametrize("fn", [kl_k1, kl_k3])
def test_unbiased_estimators_expectation_is_kl(fn):
    # Exact expectation under x ~ pi (enumerate the support) ...
    exact = float((PI * fn(PI.log(), REF.log())).sum())
    assert exact == pytest.approx(KL_TRUE, rel=1e-12)
    # ... and a Monte Carlo average over sampled tokens.
    x = torch.multinomial(PI, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    mc = float(fn(PI.log()[x], REF.log()[x]).mean())
    assert mc == pytest.approx(KL_TRUE, abs=0.01)


def test_k2_elementwise_and_k3_nonnegative():
    logp = torch.tensor([[-1.0, -2.0, -0.1]])
    ref = torch.tensor([[-1.5, -2.0, -3.0]])
    torch.testing.assert_close(kl_k2(logp, ref), 0.5 * (logp - ref) ** 2)
    assert (kl_k3(logp, ref) >= 0).all()
    d = ref - logp
    torch.testing.assert_close(kl_k3(logp, ref), d.exp() - d - 1)
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_k2_gradient_is_reverse_kl_gradient_at_small_gap():
    # k2's gradient wrt logp is (logp - ref), the first-order gradient of KL(pi || ref).
    logp = torch.tensor([-1.0, -0.7], requires_grad=True)
    ref = torch.tensor([-1.1, -0.6])
    kl_k2(logp, ref).sum().backward()
    torch.testing.assert_close(logp.grad, (logp - ref).detach())


def test_is_weights_truncation():
    ratios = torch.tensor([[0.3, 0.6, 1.0, 4.0, 7.0]])
    engine = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -0.2]])
    trainer = engine + ratios.log()
    w, trunc = is_weights(trainer, engine, (0.5, 5.0))
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.6, 1.0, 4.0, 0.0]]))
    assert trunc.tolist() == [[True, False, False, False, True]]
    w, trunc = is_weights(trainer, engine, None)
    assert torch.equal(w, torch.ones_like(w)) and not trunc.any()


def test_is_weights_are_detached():
    trainer = torch.tensor([[-1.0]], requires_grad=True)
    w, _ = is_weights(trainer, torch.tensor([[-1.1]]), (0.5, 5.0))
    assert not w.requires_grad


def test_ppo_clip_terms_values_and_clip_masks():
    ratios = torch.tensor([[0.5, 0.9, 1.5, 1.2], [0.5, 1.5, 1.1, 0.7]])
    adv = torch.tensor([-1.0, 1.0])
    old = torch.full_like(ratios, -1.0)
    logp = (old + ratios.log()).requires_grad_()
    loss, low, high = ppo_clip_terms(logp, old, adv, clip_low=0.2, clip_high=0.27)
    # row 0 (A=-1): -min(-r, -clip(r)) = max(r, clip(r)); row 1 (A=+1): -min(r, clip(r))
    want = torch.tensor([[0.8, 0.9, 1.5, 1.2], [-0.5, -1.27, -1.1, -0.7]])
    torch.testing.assert_close(loss, want)
    assert low.tolist() == [[True, False, False, False], [False] * 4]
    assert high.tolist() == [[False] * 4, [False, True, False, False]]
    loss.sum().backward()
    active = low | high
    assert (logp.grad[active] == 0).all() and (logp.grad[~active] != 0).all()
    # clip fractions over valid tokens (last column is padding)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.float)
    assert float(token_sum(low.float(), mask)) / 6 == pytest.approx(1 / 6)
    assert float(token_sum(high.float(), mask)) / 6 == pytest.approx(1 / 6)


def test_clip_higher_is_asymmetric():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.25), math.log(0.75)]])
    _, low, high = ppo_clip_terms(logp, old, torch.tensor([1.0]), 0.2, 0.27)
    assert not high.any()  # 1.25 < 1.27: inside the wider upper band
    _, low, _ = ppo_clip_terms(logp, old, torch.tensor([-1.0]), 0.2, 0.27)
    assert low.tolist() == [[False, True]]


def test_token_level_normalisation_with_padding_and_micro_batches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    lengths = torch.tensor([6, 2, 4, 1])
    mask = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    x_padded = torch.where(mask, x, torch.tensor(float("nan")))  # padding must be inert
    n = int(mask.sum())
    full = _token_mean(x_padded, mask, n)
    assert float(full) == pytest.approx(float(x[mask].sum()) / n, rel=1e-6)
    # Token level, not sample level: a long sample weighs more than a short one.
    assert float(full) != pytest.approx(float(torch.stack([x[i, :l].mean() for i, l in enumerate(lengths)]).mean()))
    # Two micro-batches (different padded widths) add up to the full loss.
    a = _token_mean(x_padded[:2], mask[:2], n)
    b = _token_mean(x_padded[2:, :4], mask[2:, :4], n)
    assert float(a + b) == pytest.approx(float(full), rel=1e-6)


def test_token_mean_gradients_add_up():
    x = torch.randn(3, 5, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float)
    _token_mean(x ** 2, mask, 8).backward()
    full = x.grad.clone()
    x.grad = None
    _token_mean(x[:1] ** 2, mask[:1], 8).backward()
    _token_mean(x[1:] ** 2, mask[1:], 8).backward()
    torch.testing.assert_close(x.grad, full)
    assert (full[mask == 0] == 0).all()


def test_entropy_from_logits():
    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(1)) * 3
    p = logits.softmax(-1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))
    assert float(entropy_from_logits(torch.zeros(7))) == pytest.approx(math.log(7))


def test_k1_as_a_loss_has_zero_expected_gradient_where_k2_and_k3_pull_towards_the_reference():
    """Why the spec refuses k1 with kl_coef > 0: the update differentiates the estimator at
    tokens drawn from pi (their probabilities are not differentiated), and for k1 that gradient,
    grad log pi, averages to zero; k2's and k3's point towards the reference."""
    z = PI.log().clone().requires_grad_(True)

    def expected_grad(fn):
        logp = torch.log_softmax(z, -1)
        (g,) = torch.autograd.grad((PI * fn(logp, REF.log())).sum(), z)
        return g

    assert expected_grad(kl_k1).abs().max() < 1e-12
    true = PI * ((PI / REF).log() - KL_TRUE)  # d KL(pi || ref) / d logits
    for fn in (kl_k2, kl_k3):
        g = expected_grad(fn)
        assert float((g * true).sum()) > 0.5 * float(true.norm() * g.norm())  # a descent direction for KL
    from trainer.spec import JobSpec

    base = {"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}}}
    with pytest.raises(ValueError, match="algo.kl_estimator.*averages to zero"):
        JobSpec.model_validate({**base, "algo": {"kl_estimator": "k1"}})
    assert JobSpec.model_validate({**base, "algo": {"kl_estimator": "k1", "kl_coef": 0}}).algo.kl_coef == 0
