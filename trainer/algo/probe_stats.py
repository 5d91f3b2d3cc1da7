"""The figures of a pass@k probe, from per-prompt correct counts: pure Python, no torch.

Given c_i correct of n samples for each probed prompt:
- `pass_at_k[k]`: the mean over prompts of the unbiased pass@k (trainer.algo.passk), for
  k = 1, 2, 4, ..., n, with a 95 % **bootstrap percentile band over prompts** (prompts resampled
  with replacement, a fixed seed, `BOOTSTRAP` draws): the band says how much the curve could
  move with another draw of prompts from the same task, which is what a user's decision rests
  on. The n samples of one prompt are not resampled: their count is exact for that prompt.
- `solvable_all_wrong[k]`: the share of prompts that k samples miss but n samples solve,
  mean_i [c_i > 0] * (1 - pass@k_i), which equals pass@n - pass@k. At k = 16 this is the
  prompts a N = 16 batch leaves with no positive signal although the model can solve them:
  what the paper's broadening is for (Theorem 1's unsampled correct mass, see `unsampled_mass`).
- `unsampled_mass[N]`: mean_i q_i (1 - q_i)^N with q_i = c_i / n (a plug-in estimate): the
  expected correct probability mass of a prompt that a batch of N samples never draws, the
  prompt-level reading of Theorem 1's U_pos (and Lemma 2's p^2 (1-p)^N for its second moment).
"""
from __future__ import annotations

import random
from typing import Sequence

from trainer.algo.passk import pass_at_k

BOOTSTRAP = 1000
SOLVABLE_AT = (16, 64, 256)


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... below n, then n."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def bootstrap_band(values: Sequence[float], seed: int = 0, draws: int = BOOTSTRAP,
                   level: float = 0.95) -> tuple[float, float]:
    """Percentile band of the mean of `values` when the prompts are resampled."""
    if not values:
        return (0.0, 0.0)
    rng, m = random.Random(seed), len(values)
    means = sorted(sum(values[rng.randrange(m)] for _ in range(m)) / m for _ in range(draws))
    lo = means[int((1 - level) / 2 * (draws - 1))]
    hi = means[int((1 + level) / 2 * (draws - 1) + 0.5)]
    return (lo, hi)


def curve(counts: Sequence[int], n: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """{"k": {"mean", "lo", "hi"}} for k = 1, 2, 4, ..., n."""
    out = {}
    for k in powers_of_two(n):
        per_prompt = [pass_at_k(n, c, k) for c in counts]
        lo, hi = bootstrap_band(per_prompt, seed=seed + k)
        out[str(k)] = {"mean": sum(per_prompt) / max(len(per_prompt), 1), "lo": lo, "hi": hi}
    return out


def solvable_all_wrong(counts: Sequence[int], n: int, k: int) -> float | None:
    """Share of prompts all-wrong in k samples (expected) yet solved within n; None if k >= n."""
    if k >= n or not counts:
        return None
    return sum((1.0 - pass_at_k(n, c, k)) for c in counts if c > 0) / len(counts)


def unsampled_mass(counts: Sequence[int], n: int, big_n: int) -> float:
    """mean_i q_i (1 - q_i)^N, q_i = c_i / n: correct mass left unsampled by N samples."""
    if not counts:
        return 0.0
    return sum((c / n) * (1.0 - c / n) ** big_n for c in counts) / len(counts)


def decision_figures(counts: Sequence[int], n: int, at_n: int) -> dict:
    """What a mid-training probe reports (rollout.broaden trigger probe): pass@1, pass@at_n,
    pass@n and the share all-wrong at the stage's `at_n` yet solved within n."""
    mean = lambda k: sum(pass_at_k(n, c, k) for c in counts) / max(len(counts), 1)  # noqa: E731
    return {"n": n, "prompts": len(counts), "at_n": at_n, "pass@1": mean(1), f"pass@{at_n}": mean(at_n),
            f"pass@{n}": mean(n), "solvable_all_wrong": solvable_all_wrong(counts, n, at_n)}


def figures(counts: Sequence[int], n: int, rewards: Sequence[float], *, seed: int = 0) -> dict:
    """The probe's result without the run's timings: per-prompt rows, the curve, the shares."""
    counts = [int(c) for c in counts]
    if any(not 0 <= c <= n for c in counts):
        raise ValueError(f"every count must lie in 0..{n}")
    p = max(len(counts), 1)
    return {
        "n": n,
        "prompts": len(counts),
        "per_prompt": [{"correct": c, "n": n, "mean_reward": r} for c, r in zip(counts, rewards)],
        "pass_at_k": curve(counts, n, seed),
        "band": "bootstrap percentile, 95 %, prompts resampled (1000 draws)",
        "solvable_all_wrong": {str(k): solvable_all_wrong(counts, n, k) for k in SOLVABLE_AT},
        "never_solved": sum(1 for c in counts if c == 0) / p,
        "unsampled_mass": {str(k): unsampled_mass(counts, n, k) for k in (16, 64, 256, n)},
    }
