"""A step's rollouts kept for people to read: the highest- and lowest-reward ones, decoded.

Reward hacking shows in the text long before it shows in a curve, so every step stores a few
completions (`samples.per_step`) from its first generation round, before dynamic sampling
drops the groups whose rewards are all equal: those (all correct, all wrong) are often the
most telling. The advantage is the one the estimator gives over that round (0 for a group
whose rewards are all equal).
"""
from __future__ import annotations

from typing import Any

import torch

from trainer.rollouts import Rollouts


def pick_indices(rewards: torch.Tensor, k: int) -> list[int]:
    """`k` distinct samples: the ceil(k/2) highest rewards, then the floor(k/2) lowest
    (ties broken by position, so the pick is deterministic)."""
    if k <= 0 or len(rewards) == 0:
        return []
    order = torch.argsort(rewards, descending=True, stable=True).tolist()
    high = order[: (k + 1) // 2]
    taken = set(high)
    low = [i for i in reversed(order) if i not in taken][: k // 2]
    return high + low


def step_samples(rollouts: Rollouts, advantages: torch.Tensor, tokenizer: Any, per_step: int,
                 max_chars: int) -> list[dict[str, Any]]:
    """The rows to store for one step (see the module docstring)."""
    rows = []
    for i in pick_indices(rollouts.rewards, per_step):
        prompt = tokenizer.decode(rollouts.prompt_ids[i], skip_special_tokens=True)
        completion = tokenizer.decode(rollouts.response_ids[i], skip_special_tokens=True)
        rows.append({
            "prompt": prompt[:max_chars], "completion": completion[:max_chars],
            "reward": float(rollouts.rewards[i]), "correct": bool(rollouts.correct[i]),
            "truncated": bool(rollouts.truncated[i]), "advantage": float(advantages[i]),
            "sub_rewards": {k[len("reward/"):]: float(v[i]) for k, v in rollouts.extras.items()
                            if k.startswith("reward/")},
        })
    return rows
