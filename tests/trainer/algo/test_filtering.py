"""Dynamic sampling: which groups carry signal, and the filter's statistics."""
import torch

from trainer.algo.filtering import filter_rollouts, group_solve_stats, informative_groups
from trainer.rollouts import Rollouts


def _rollouts(rewards, group):
    n = len(rewards)
    return Rollouts(
        prompt_ids=[[1, 2]] * n, response_ids=[[i + 3] for i in range(n)],
        engine_logprobs=[[-0.5]] * n, group=torch.tensor(group),
        rewards=torch.tensor(rewards, dtype=torch.float), truncated=torch.zeros(n, dtype=torch.bool),
        advantages=torch.arange(n, dtype=torch.float))


def test_group_solve_stats():
    correct = torch.tensor([True, False, True, True, False, False])
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    torch.testing.assert_close(group_solve_stats(correct, group), torch.tensor([0.5, 1.0, 0.0]))


def test_informative_groups_binary_and_score():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.2])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert informative_groups(rewards, group).tolist() == [True, False, False, False, True]


def test_informative_groups_empty_ids_false():
    out = informative_groups(torch.tensor([0.0, 1.0]), torch.tensor([3, 3]))
    assert out.tolist() == [False, False, False, True]


def test_filter_rollouts_keeps_informative_and_reindexes():
    # groups: 7 mixed, 2 all correct, 5 all wrong, 9 mixed (interleaved order)
    rewards = [1, 1, 0, 0, 1, 1, 0, 0, 0, 1]
    group = [7, 2, 5, 7, 2, 9, 5, 9, 7, 7]
    kept, stats = filter_rollouts(_rollouts(rewards, group))
    assert kept.extras["orig_group"].tolist() == [7, 7, 9, 9, 7, 7]
    assert kept.group.tolist() == [0, 0, 1, 1, 0, 0]
    assert kept.response_ids == [[3], [6], [8], [10], [11], [12]]  # sample order preserved
    assert kept.advantages.tolist() == [0, 3, 5, 7, 8, 9]
    assert stats["keep_rate"] == 0.6
    assert stats["frac_all_correct"] == 0.25 and stats["frac_all_wrong"] == 0.25
    assert stats["kept_groups"] == 2 and stats["kept_samples"] == 6


def test_filter_rollouts_score_rewards_constant_partial_group_dropped():
    kept, stats = filter_rollouts(_rollouts([0.5, 0.5, 0.2, 0.7], [0, 0, 1, 1]))
    assert len(kept) == 2 and stats["keep_rate"] == 0.5
    # the dropped 0.5/0.5 group is neither all-correct nor all-wrong
    assert stats["frac_all_correct"] == 0.0 and stats["frac_all_wrong"] == 0.0


def test_filter_rollouts_everything_dropped():
    kept, stats = filter_rollouts(_rollouts([1, 1, 0, 0], [0, 0, 1, 1]))
    assert len(kept) == 0 and kept.group.numel() == 0
    assert stats["keep_rate"] == 0.0 and stats["frac_all_correct"] == 0.5
