"""Advantage estimators: one scalar advantage per sample, from its reward and its group.

A group is one prompt's N rollouts; `group` is a [S] long tensor of prompt indices (any
order, need not be contiguous). Everything is vectorised with `index_add_` so that the cost
does not depend on Python loops over samples (N = 512 x 128 prompts is the normal case).

Variants are small functions picked once by name from `ADVANTAGES`, never an `if` ladder:
- `reinforce_pp_baseline` (the paper's default, docs/algorithm.md): A = R - mean(R over the
  group), then whitened over the whole global batch. No per-group std division.
- `grpo`: A = (R - group mean) / (group std + eps).
- `group_mean` (Dr. GRPO's): A = R - group mean, nothing else.
"""
from __future__ import annotations

from typing import Callable

import torch

# (rewards [S], group [S], token_weights [S] or None, reduce or None) -> advantages [S]
AdvantageFn = Callable[..., torch.Tensor]


def _group_count_sum(values: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group sample count and sum of `values`, indexed by group id (0 .. max id)."""
    n_groups = int(group.max().item()) + 1 if group.numel() else 0
    sums = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    counts = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    sums.index_add_(0, group, values)
    counts.index_add_(0, group, torch.ones_like(values))
    return counts, sums


def group_mean(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over each sample's group, broadcast back to samples ([S])."""
    counts, sums = _group_count_sum(values, group)
    # Ids with no samples get count 0; they are never gathered, clamp only avoids 0/0.
    return (sums / counts.clamp_min(1))[group]


def group_baseline(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """R - mean of R over the sample's group (the REINFORCE++ baseline before whitening)."""
    rewards = rewards.float()
    return rewards - group_mean(rewards, group)


def whiten(x: torch.Tensor, eps: float = 1e-6, weights: torch.Tensor | None = None,
           reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(x - mean) / (std + eps) over the whole batch; zeros when the batch has no spread.

    Population std (no Bessel correction) so a batch of one is defined. A std at or below
    `eps` is treated as zero spread and gives zeros: dividing rounding noise by eps would
    otherwise turn an all-equal batch into O(1) advantages. With `weights` (each sample's
    response length) mean and std are over tokens, as OpenRLHF's `reinforce_baseline`:
    every token, not every sample, then has zero-mean unit-variance advantage.
    `reduce` sums a tensor of partial sums over ranks (trainer.collectives.all_sum) when the
    batch is split across processes; the moments are then the whole batch's.
    """
    reduce = reduce or (lambda t: t)
    x = x.float()
    w = torch.ones_like(x) if weights is None else weights.float().clamp_min(0)
    total, wx = reduce(torch.stack([w.sum(), (w * x).sum()]).double())
    if float(total) <= 0:
        return torch.zeros_like(x)
    centred = x - (wx / total).float()
    std = (reduce((w * centred.pow(2)).sum().double()) / total).sqrt().float()
    if std <= eps:
        return torch.zeros_like(x)
    return centred / (std + eps)


def reinforce_pp_baseline(rewards: torch.Tensor, group: torch.Tensor,
                          token_weights: torch.Tensor | None = None, reduce=None) -> torch.Tensor:
    """The paper's default: group-mean baseline, then whitening over the global batch
    (over samples, or over tokens when `token_weights` holds the response lengths; over
    every rank's samples with `reduce`, see `whiten`)."""
    return whiten(group_baseline(rewards, group), weights=token_weights, reduce=reduce)


def grpo(rewards: torch.Tensor, group: torch.Tensor, token_weights: torch.Tensor | None = None,
         reduce=None, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (R - group mean) / (group std + eps). No batch whitening: `token_weights` and
    `reduce` unused (a group is never split across ranks).

    The group std is the sample std (Bessel-corrected, as TRL and veRL compute it); a group
    of one sample has advantage 0 (its centred reward is 0 and its std is taken as 0).
    """
    rewards = rewards.float()
    centred = rewards - group_mean(rewards, group)
    counts, sq_sums = _group_count_sum(centred.pow(2), group)
    std = (sq_sums / (counts - 1).clamp_min(1)).sqrt()
    return centred / (std[group] + eps)


def group_mean_baseline(rewards: torch.Tensor, group: torch.Tensor,
                        token_weights: torch.Tensor | None = None, reduce=None) -> torch.Tensor:
    """Dr. GRPO: R - mean of R over the group; no std division (which would weigh groups by
    how easy or hard their prompt is), no whitening. `token_weights`, `reduce` unused."""
    return group_baseline(rewards, group)


ADVANTAGES: dict[str, AdvantageFn] = {
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "grpo": grpo,
    "group_mean": group_mean_baseline,
}
