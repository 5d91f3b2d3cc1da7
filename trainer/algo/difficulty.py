"""The difficulty filter across steps (`algo.difficulty_filter`): retire training prompts the
policy always solves (or, asked for, never solves).

Dynamic sampling drops a group with no learning signal within a step, after paying for its
generation; a prompt solved every time it comes back keeps costing that. Here each prompt's
last `window` draws are remembered (the solve rate of its group of n), and once all of them
are 1 (or all 0 with `retire_unsolved`) the prompt is retired: the prompt stream skips it
from then on. Retiring stops at `min_active` prompts, so a step never has to draw one twice.

Keyed by the prompt's index in the training split, so the state is a small dict that a
checkpoint holds (`TrainerState.difficulty`: a resumed run skips what it had retired), and
the same on every rank (`record_draws` gives every rank every rank's groups).
"""
from __future__ import annotations

from collections import deque

import torch

from trainer import collectives as distributed


class DifficultyFilter:
    def __init__(self, window: int, retire_unsolved: bool, n_prompts: int, min_active: int):
        self.window = window
        self.retire_unsolved = retire_unsolved
        self.n_prompts = n_prompts
        self.min_active = max(1, min_active)
        self.history: dict[int, deque] = {}
        self.retired: set[int] = set()

    def is_retired(self, prompt: int) -> bool:
        return prompt in self.retired

    def record(self, prompts: list[int], solve_rates: list[float]) -> int:
        """Remember one draw of each prompt (its group's solve rate in [0, 1]); returns how many
        prompts this retired."""
        newly = 0
        for p, rate in zip(prompts, solve_rates):
            seen = self.history.setdefault(p, deque(maxlen=self.window))
            seen.append(float(rate))
            if len(seen) < self.window or p in self.retired:
                continue
            solved = all(r >= 1.0 for r in seen)
            unsolved = self.retire_unsolved and all(r <= 0.0 for r in seen)
            if (solved or unsolved) and self.n_prompts - len(self.retired) > self.min_active:
                self.retired.add(p)
                self.history.pop(p, None)
                newly += 1
        return newly

    def metrics(self) -> dict[str, float]:
        """prompts_retired (so far) and their share of the training split."""
        return {"prompts_retired": len(self.retired),
                "prompts_retired_frac": len(self.retired) / max(self.n_prompts, 1)}

    def state_dict(self) -> dict:
        return {"retired": sorted(self.retired),
                "history": {str(p): list(h) for p, h in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.retired = set(int(p) for p in state.get("retired", []))
        self.history = {int(p): deque(h, maxlen=self.window) for p, h in state.get("history", {}).items()}


def make_difficulty_filter(spec, n_prompts: int, state: dict | None = None) -> DifficultyFilter | None:
    """The spec's filter (None when off), with a resumed run's `state`; never fewer active
    prompts than a step draws."""
    f = spec.algo.difficulty_filter
    if f is None:
        return None
    widest = max(s.prompts_per_step for s in spec.rollout.schedule)
    filt = DifficultyFilter(f.window, f.retire == "solved_or_unsolved", n_prompts, widest)
    if state is not None:
        filt.load_state_dict(state)
    return filt


def record_draws(filt: DifficultyFilter, drawn: list[int], correct: torch.Tensor, group: torch.Tensor) -> int:
    """Record one generation round: `drawn` are every rank's prompts (split indices, the same
    list on every rank), `correct`/`group` this rank's samples, grouped by the position of their
    prompt in this rank's share (`collectives.share`). Every rank records every prompt."""
    positions = distributed.share(list(range(len(drawn))))
    hits = torch.zeros(len(drawn), dtype=torch.float64)
    counts = torch.zeros(len(drawn), dtype=torch.float64)
    if len(group):
        at = torch.tensor(positions, dtype=torch.long)[group]
        hits.index_add_(0, at, correct.double())
        counts.index_add_(0, at, torch.ones_like(hits[at]))
    totals = distributed.all_sum(torch.stack([hits, counts]))
    seen = totals[1] > 0
    return filt.record([p for p, s in zip(drawn, seen.tolist()) if s], (totals[0][seen] / totals[1][seen]).tolist())
