"""Advantages: group baseline, whitening, REINFORCE++-baseline, GRPO, on hand-built batches."""
import pytest
import torch

from trainer.algo.advantages import (
    ADVANTAGES, group_baseline, group_mean, grpo, reinforce_pp_baseline, whiten,
)


def test_group_baseline_subtracts_group_mean_in_any_order():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    group = torch.tensor([2, 0, 0, 2, 0, 2, 5])  # interleaved, with gaps in the ids
    out = group_baseline(rewards, group)
    # group 0: [0,1,0] mean 1/3; group 2: [1,0,1] mean 2/3; group 5: [1]
    expect = torch.tensor([1 - 2 / 3, -1 / 3, 2 / 3, -2 / 3, -1 / 3, 1 / 3, 0.0])
    torch.testing.assert_close(out, expect)


def test_group_mean_matches_loop():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(200, generator=g)
    group = torch.randint(0, 13, (200,), generator=g)
    want = torch.stack([rewards[group == group[i]].mean() for i in range(200)])
    torch.testing.assert_close(group_mean(rewards, group), want)


def test_whiten_zero_mean_unit_std():
    x = torch.tensor([1.0, 2.0, 3.0, 10.0])
    w = whiten(x)
    assert abs(float(w.mean())) < 1e-6
    assert abs(float(w.pow(2).mean().sqrt()) - 1.0) < 1e-5


@pytest.mark.parametrize("x", [torch.zeros(5), torch.full((3,), 0.1), torch.ones(1)])
def test_whiten_constant_gives_zeros(x):
    assert torch.equal(whiten(x), torch.zeros_like(x))


def test_reinforce_pp_baseline_is_whitened_group_baseline():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    a = reinforce_pp_baseline(rewards, group)
    b = group_baseline(rewards, group)
    torch.testing.assert_close(a, (b - b.mean()) / (b.std(unbiased=False) + 1e-6))
    # No per-group std: group 0 (1 of 4 right) and group 1 (3 of 4 right) are mirror images.
    torch.testing.assert_close(a[:4].sort().values, (-a[4:]).sort().values)


def test_grpo_divides_by_group_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1])
    out = grpo(rewards, group)
    g0 = rewards[:4]
    torch.testing.assert_close(out[:4], (g0 - g0.mean()) / (g0.std() + 1e-6))
    torch.testing.assert_close(out[4:], torch.tensor([-1.0, 1.0]) / (2 ** 0.5 + 1e-6))


def test_grpo_constant_and_singleton_groups_are_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.5])
    group = torch.tensor([0, 0, 0, 1])
    assert torch.equal(grpo(rewards, group), torch.zeros(4))


def test_registry_names():
    assert set(ADVANTAGES) == {"reinforce_pp_baseline", "grpo", "group_mean"}
    r, g = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    for fn in ADVANTAGES.values():
        assert fn(r, g).shape == (4,)


def test_token_weighted_whitening_is_zero_mean_unit_std_over_tokens():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    group = torch.tensor([0, 0, 1, 1])
    lengths = torch.tensor([1.0, 9.0, 5.0, 5.0])
    a = reinforce_pp_baseline(rewards, group, lengths)
    per_token = torch.repeat_interleave(a, lengths.long())
    assert abs(float(per_token.mean())) < 1e-5
    assert float(per_token.pow(2).mean().sqrt()) == pytest.approx(1.0, abs=1e-4)
    # per sample it is not zero-mean: the choice matters (and equal lengths give the sample form)
    assert abs(float(a.mean())) > 0.05
    torch.testing.assert_close(reinforce_pp_baseline(rewards, group, torch.full((4,), 3.0)),
                               reinforce_pp_baseline(rewards, group))
