"""Dynamic sampling (docs/algorithm.md): drop prompts whose rollouts carry no learning signal.

A group whose N rewards are all equal (all correct, all wrong, or, with score rewards, any
constant) has zero advantage for every sample under a group baseline, so it only dilutes
the token-level loss. `filter_rollouts` keeps the informative groups and reports the
statistics the dashboard shows (keep_rate, frac_all_correct, frac_all_wrong).

Groups are identified by `Rollouts.group` (prompt indices, any order). Per-group tensors
here are indexed by group id 0 .. max id; ids with no samples count as empty groups and are
excluded from the per-group fractions.
"""
from __future__ import annotations

import torch

from trainer.rollouts import Rollouts


def _n_groups(group: torch.Tensor) -> int:
    return int(group.max().item()) + 1 if group.numel() else 0


def group_sizes(group: torch.Tensor) -> torch.Tensor:
    """[G] long: samples per group id."""
    return torch.bincount(group, minlength=_n_groups(group))


def group_solve_stats(correct: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[G] float: fraction of each group's samples that are correct (NaN for empty ids)."""
    n = group_sizes(group).float()
    hits = torch.zeros_like(n).index_add_(0, group, correct.float())
    return hits / n  # 0/0 = NaN marks ids with no samples; callers mask them out


def solve_fractions(correct: torch.Tensor, rewards: torch.Tensor,
                    group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Over present groups: ([G'] solve rate, [G'] bool all-wrong).

    All-wrong means no sample correct AND none with a positive reward: with `reward: score`
    a group of partial credit is neither all-correct nor all-wrong.
    """
    present = group_sizes(group) > 0
    solve = group_solve_stats(correct, group)
    best = torch.full((len(present),), -torch.inf).scatter_reduce(
        0, group, rewards.float(), "amax", include_self=False)
    wrong = (solve == 0) & (best <= 0)
    return solve[present], wrong[present]


def informative_groups(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[G] bool: groups whose rewards are not all equal (empty ids are False).

    "Not all equal" rather than "not all correct and not all wrong" so that score rewards
    (partial credit) follow the same rule: any constant group has zero advantage.
    """
    G = _n_groups(group)
    r = rewards.float()
    hi = torch.full((G,), -torch.inf).scatter_reduce(0, group, r, "amax", include_self=False)
    lo = torch.full((G,), torch.inf).scatter_reduce(0, group, r, "amin", include_self=False)
    return hi > lo  # empty ids keep (-inf, inf) and compare False


def compact_groups(group: torch.Tensor) -> torch.Tensor:
    """Re-index group ids to 0 .. K-1, keeping their relative order."""
    _, new = torch.unique(group, sorted=True, return_inverse=True)
    return new


def filter_rollouts(rollouts: Rollouts, correct: torch.Tensor | None = None) -> tuple[Rollouts, dict]:
    """Keep the samples of informative groups; return them and the filter's statistics.

    `correct` ([S] bool) defines "solved" for frac_all_correct / frac_all_wrong; by default
    `rollouts.correct`, else a sample is correct when its reward is >= 1 (binary rewards; a full score). With score
    rewards a constant group of partial credit is dropped but is neither all-correct nor
    all-wrong, so the two fractions need not add up to the dropped share of groups.

    The kept batch's `group` is RE-INDEXED to 0 .. K-1 (order of the original ids kept);
    the original id of each kept sample is in `kept.extras["orig_group"]`. Sample order is
    preserved. `select` does not carry `extras`, so other extras must be re-attached by the
    caller.
    """
    group, rewards = rollouts.group, rollouts.rewards
    if correct is None:
        correct = rollouts.correct if rollouts.correct is not None else rewards >= 1.0
    sizes = group_sizes(group)
    present = sizes > 0
    solve, wrong = solve_fractions(correct, rewards, group)
    keep_group = informative_groups(rewards, group)
    keep_sample = keep_group[group]
    idx = keep_sample.nonzero(as_tuple=True)[0]

    kept = rollouts.select(idx)
    kept.extras["orig_group"] = kept.group
    kept.group = compact_groups(kept.group)

    n_present = max(int(present.sum()), 1)
    stats = {
        "keep_rate": idx.numel() / max(len(rollouts), 1),
        "frac_all_correct": float((solve == 1).sum()) / n_present,
        "frac_all_wrong": float(wrong.sum()) / n_present,
        "kept_groups": int(keep_group.sum()),
        "kept_samples": int(idx.numel()),
    }
    return kept, stats
