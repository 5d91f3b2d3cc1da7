"""Is a reward being gamed? The training reward rises while held-out pass@1 falls.

A policy that learns to please a reward function rather than to solve the task shows it as a
divergence: the reward it collects on its own rollouts keeps rising, while pass@1 on the
held-out split (scored by the task's own correctness check) falls. One evaluation is noise;
`eval.gaming_window` evaluations in a row with both moves larger than `eval.gaming_min_delta`
is a signal worth a warning (the samples table then shows what the model writes).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GamingWatch:
    """Per evaluation: the mean training reward of the steps since the previous one, and the
    evaluation's pass@1. Forgets what it has warned about, so each warning is about new steps."""

    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, reward, pass@1)
    rewards_since_eval: list[float] = field(default_factory=list)

    def step(self, reward_mean: float) -> None:
        self.rewards_since_eval.append(reward_mean)

    def evaluation(self, step: int, pass_at_1: float, window: int, min_delta: float) -> str | None:
        """Record an evaluation; a warning message when the last `window` evaluations diverge."""
        if self.rewards_since_eval:
            reward = sum(self.rewards_since_eval) / len(self.rewards_since_eval)
            self.points.append((step, reward, pass_at_1))
        self.rewards_since_eval = []
        if window < 1 or len(self.points) < window + 1:
            return None
        (s0, r0, p0), (s1, r1, p1) = self.points[-window - 1], self.points[-1]
        if r1 - r0 < min_delta or p0 - p1 < min_delta:
            return None
        self.points = self.points[-1:]
        return (f"the training reward rose from {r0:.3f} to {r1:.3f} while eval pass@1 fell from "
                f"{p0:.3f} to {p1:.3f} (steps {s0} to {s1}): the reward may be gamed; read the "
                f"job's samples to see what the model writes")
