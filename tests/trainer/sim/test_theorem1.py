"""Theorem 1 (mass balance) and Lemma 2 of the paper (docs/algorithm.md) against an exact one-step softmax update.

The logit step dz_j = (eta/N) p_j (R_j - S_R) is applied exactly to a 20-token vocabulary;
the observed change of the correct mass Q_pos must match the theorem's first-order formula
(relative error O(eta)), including configurations where the unsampled coupling is negative.
"""
import pytest
import torch

from trainer.sim.theory import (
    batch_mood, logit_step, mass_balance_dq, token_rewards,
)

V = 20
CORRECT = torch.zeros(V, dtype=torch.bool)
CORRECT[:6] = True


def expected_unsampled_second_moment(p: torch.Tensor, N: int) -> torch.Tensor:
    """Lemma 2: E[p^2 1{unsampled in N i.i.d. draws}] = p^2 (1 - p)^N, per token."""
    p = p.double()
    return p.pow(2) * (1.0 - p).pow(N)


def _observed_dq(z, correct, sampled, R_c, R_w, eta, N):
    p = z.softmax(-1)
    dz = logit_step(p, correct, sampled, R_c, R_w, eta, N)
    return float((z + dz).softmax(-1)[correct].sum() - p[correct].sum())


def _draw(p, N, seed):
    x = torch.multinomial(p, N, replacement=True, generator=torch.Generator().manual_seed(seed))
    sampled = torch.zeros(V, dtype=torch.bool)
    sampled[x] = True
    return sampled


def test_logit_step_is_gradient_of_linear_objective():
    # dz = (eta/N) d/dz sum_{sampled k} R_k p_k: the reading of the step used by the theory.
    z = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    sampled = _draw(z.detach().softmax(-1), 6, 0)
    R = token_rewards(CORRECT, sampled, 1.0, -1.0)
    (R * z.softmax(-1)).sum().backward()
    eta, N = 0.5, 6
    torch.testing.assert_close(logit_step(z.detach().softmax(-1), CORRECT, sampled, 1.0, -1.0, eta, N),
                               eta / N * z.grad)


@pytest.mark.parametrize("N", [2, 4, 8, 32])
def test_first_order_formula_matches_exact_update(N):
    eta, R_c, R_w = 1e-3, 1.0, -1.0
    negative_coupling = 0
    for seed in range(40):
        z = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2
        p = z.softmax(-1)
        sampled = _draw(p, N, 1000 + seed)
        terms = mass_balance_dq(p, CORRECT, sampled, R_c, R_w, eta, N)
        observed = _observed_dq(z, CORRECT, sampled, R_c, R_w, eta, N)
        assert observed == pytest.approx(terms["total"], rel=5e-3, abs=1e-14)
        assert terms["sampled_correct"] >= 0 and terms["sampled_wrong"] >= 0
        negative_coupling += terms["unsampled_coupling"] < 0
    if N <= 8:
        assert negative_coupling > 0  # the case the theorem warns about does occur


def test_negative_coupling_can_shrink_correct_mass():
    # A dominant correct token goes unsampled while the batch mood is positive.
    p = torch.full((V,), 0.29 / 17, dtype=torch.float64)
    p[0], p[1], p[10] = 0.6, 0.1, 0.01
    z = p.log()
    sampled = torch.zeros(V, dtype=torch.bool)
    sampled[[1, 10]] = True
    eta, N = 1e-3, 2
    terms = mass_balance_dq(p, CORRECT, sampled, 1.0, -1.0, eta, N)
    assert terms["S_R"] == pytest.approx(0.09)
    assert terms["unsampled_coupling"] < 0 and terms["total"] < 0
    observed = _observed_dq(z, CORRECT, sampled, 1.0, -1.0, eta, N)
    assert observed < 0
    assert observed == pytest.approx(terms["total"], rel=5e-3)


def test_general_rewards_and_mood_sign():
    z = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    p = z.softmax(-1)
    sampled = _draw(p, 5, 7)
    for R_c, R_w in [(1.0, 0.0), (0.5, -2.0), (2.0, -0.1)]:
        terms = mass_balance_dq(p, CORRECT, sampled, R_c, R_w, 1e-3, 5)
        assert terms["S_R"] == pytest.approx(float(batch_mood(p, CORRECT, sampled, R_c, R_w)))
        observed = _observed_dq(z, CORRECT, sampled, R_c, R_w, 1e-3, 5)
        assert observed == pytest.approx(terms["total"], rel=5e-3, abs=1e-14)


def test_all_sampled_has_no_coupling():
    p = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).softmax(-1)
    terms = mass_balance_dq(p, CORRECT, torch.ones(V, dtype=torch.bool), 1.0, -1.0, 1e-3, 64)
    assert terms["unsampled_coupling"] == 0.0 and terms["total"] > 0


def test_lemma2_unsampled_second_moment_monte_carlo():
    p = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).softmax(-1)
    trials = 20_000
    for N in (1, 4, 16):
        x = torch.multinomial(p.expand(trials, V), N, replacement=True,
                              generator=torch.Generator().manual_seed(N))
        hit = torch.zeros(trials, V, dtype=torch.bool).scatter_(1, x, True)
        mc = (p.pow(2) * (~hit).double()).mean(0)
        want = expected_unsampled_second_moment(p, N)
        q = (1 - p).pow(N)
        sigma = p.pow(2) * (q * (1 - q) / trials).sqrt()
        assert ((mc - want).abs() <= 5 * sigma + 1e-12).all()
    # It shrinks with N: the coupling term's budget vanishes as exploration broadens.
    m = [float(expected_unsampled_second_moment(p, N).sum()) for N in (4, 16, 64, 512)]
    assert m == sorted(m, reverse=True) and m[-1] < 1e-6
