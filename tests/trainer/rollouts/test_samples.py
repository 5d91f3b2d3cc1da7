"""The rollouts a step stores for reading: highest and lowest rewards, decoded, cut, with
advantages and sub-rewards; and they reach the sink once per step in a real run."""
import torch

from trainer.rollouts import Rollouts
from trainer.samples import pick_indices, step_samples


def test_pick_takes_the_highest_then_the_lowest_rewards_without_repeats():
    rewards = torch.tensor([0.5, 1.0, 0.0, 1.0, 0.25, 0.0])
    assert pick_indices(rewards, 4) == [1, 3, 5, 2]
    assert pick_indices(rewards, 3) == [1, 3, 5]
    assert sorted(pick_indices(rewards, 10)) == list(range(6))  # never more than there are
    assert pick_indices(rewards, 0) == [] and pick_indices(torch.zeros(0), 4) == []


class _Chars:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def test_step_samples_rows():
    ro = Rollouts(prompt_ids=[[0, 1], [2]], response_ids=[[3, 4, 5, 6], [7]], engine_logprobs=[[], []],
                  group=torch.tensor([0, 0]), rewards=torch.tensor([0.0, 1.0]),
                  truncated=torch.tensor([True, False]), correct=torch.tensor([False, True]),
                  extras={"reward/format": torch.tensor([0.5, 1.0]), "orig_group": torch.tensor([0, 0])})
    rows = step_samples(ro, torch.tensor([-0.7, 0.7]), _Chars(), per_step=2, max_chars=3)
    assert rows == [
        {"prompt": "c", "completion": "h", "reward": 1.0, "correct": True, "truncated": False,
         "advantage": rows[0]["advantage"], "sub_rewards": {"format": 1.0}},
        {"prompt": "ab", "completion": "def", "reward": 0.0, "correct": False, "truncated": True,
         "advantage": rows[1]["advantage"], "sub_rewards": {"format": 0.5}},
    ]
    assert abs(rows[0]["advantage"] - 0.7) < 1e-6 and abs(rows[1]["advantage"] + 0.7) < 1e-6
