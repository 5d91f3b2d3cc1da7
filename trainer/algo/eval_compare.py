"""The figures of an evaluation, from per-prompt correct counts: pure Python, no torch.

For each model, c_i correct of n samples on prompt i:
- `pass_at_k[k]`: the mean over prompts of the unbiased pass@k (trainer.algo.passk), with a
  95 % **bootstrap percentile interval over prompts** (prompts resampled with replacement, a
  fixed seed, `BOOTSTRAP` draws; trainer.algo.probe_stats.bootstrap_band). Prompts are the unit
  that varies between held-out sets, and one prompt's n samples are correlated (an easy prompt
  is easy for all of them), so an interval that treated the n x prompts samples as independent
  (Wilson's, on pass@1) would be too narrow whenever prompts differ in difficulty, which they do.
- `delta[k]`: a checkpoint's pass@k minus the base's, with a **paired** bootstrap interval: the
  per-prompt differences are resampled, so the same prompts are drawn for both models and the
  difficulty they share cancels (much narrower than comparing two separate intervals).
- `gained` / `lost`: prompts the base never solved in n samples that the checkpoint solved at
  least once, and the other way round (the solvable set growing or shrinking, which is what
  broad exploration is for); `better` / `worse`: prompts with more / fewer correct samples.

The best checkpoint of a job's training (`best_from_training`) and of an evaluation
(`best_of`) are chosen here too, each by one written rule.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from trainer.algo.passk import pass_at_k
from trainer.algo.probe_stats import BOOTSTRAP, bootstrap_band

INTERVAL = f"95 % bootstrap percentile over prompts ({BOOTSTRAP} draws); deltas paired by prompt"


def _interval(values: Sequence[float], seed: int) -> dict[str, float]:
    lo, hi = bootstrap_band(values, seed=seed)
    return {"mean": sum(values) / max(len(values), 1), "lo": lo, "hi": hi}


def per_prompt_pass(counts: Sequence[int], n: int, k: int) -> list[float]:
    return [pass_at_k(n, c, k) for c in counts]


def pass_at_k_intervals(counts: Sequence[int], n: int, ks: Sequence[int], seed: int = 0) -> dict[str, dict]:
    """{"k": {"mean", "lo", "hi"}} for each k."""
    _check(counts, n)
    return {str(k): _interval(per_prompt_pass(counts, n, k), seed + k) for k in ks}


def delta_intervals(base: Sequence[int], other: Sequence[int], n: int, ks: Sequence[int],
                    seed: int = 0) -> dict[str, dict]:
    """{"k": {"mean", "lo", "hi"}} of other's pass@k minus base's, paired by prompt."""
    _check(base, n)
    _check(other, n)
    if len(base) != len(other):
        raise ValueError(f"{len(base)} base prompts but {len(other)} compared")
    out = {}
    for k in ks:
        diffs = [a - b for a, b in zip(per_prompt_pass(other, n, k), per_prompt_pass(base, n, k))]
        out[str(k)] = _interval(diffs, seed + 7 * k + 1)
    return out


def prompt_changes(base: Sequence[int], other: Sequence[int]) -> dict[str, Any]:
    """Which prompts a model solves (at least once) that the base never did, and vice versa."""
    pairs = list(zip(base, other))
    return {
        "gained": [i for i, (b, o) in enumerate(pairs) if b == 0 and o > 0],
        "lost": [i for i, (b, o) in enumerate(pairs) if b > 0 and o == 0],
        "better": sum(1 for b, o in pairs if o > b),
        "worse": sum(1 for b, o in pairs if o < b),
    }


def _check(counts: Sequence[int], n: int) -> None:
    if any(not 0 <= int(c) <= n for c in counts):
        raise ValueError(f"every count must lie in 0..{n}")


def best_from_training(checkpoint_steps: Sequence[int],
                       metrics: Sequence[tuple[int, Mapping[str, Any]]],
                       metric: str = "eval/pass@1") -> tuple[int, str] | None:
    """The stored checkpoint whose own step recorded the highest `metric` during training, and
    why; None when no stored checkpoint's step has one.

    Only an evaluation at the checkpoint's exact step counts: the training loop evaluates after
    a step's update and checkpoints after it too, so both see the same weights; an evaluation
    at another step measured other weights. Ties go to the earlier step (as good, with fewer
    updates away from the base). Checkpoints pruned by `checkpoint.keep_last` cannot be
    chosen; when a pruned step scored higher, the reason says so.
    """
    stored = set(checkpoint_steps)
    scores = {step: float(v[metric]) for step, v in metrics
              if isinstance(v.get(metric), (int, float))}
    candidates = sorted((s for s in scores if s in stored), key=lambda s: (-scores[s], s))
    if not candidates:
        return None
    best = candidates[0]
    why = f"{metric} {scores[best]:.4g} at step {best}: the highest the training recorded at a stored checkpoint"
    pruned = [s for s in scores if s not in stored and s > 0 and scores[s] > scores[best]]
    if pruned:
        top = max(pruned, key=lambda s: scores[s])
        why += f" (step {top} scored {scores[top]:.4g}, but its checkpoint is no longer kept)"
    return best, why


def best_of(models: Sequence[Mapping[str, Any]], k: str = "1") -> Mapping[str, Any] | None:
    """The evaluated checkpoint (not the base) with the highest pass@k mean; ties: earlier step."""
    ckpts = [m for m in models if m.get("step") is not None]
    if not ckpts:
        return None
    return min(ckpts, key=lambda m: (-m["pass_at_k"][k]["mean"], m["step"]))
