"""The broadening schedule: stages of (n, prompts_per_step, steps) and the LR rule.

Each stage's learning rate is `optim.lr * f(B / B0)` where B = prompts x n is the stage's
samples per step and B0 the first stage's (the paper: square-root scaling, eta0*sqrt(B/B0)); by
default (`optim.lr_batch: prompts_capped`) B/B0 is capped at the growth of prompts per step.
Pure Python: `brorl schedule` and the API use it without torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.spec import JobSpec

LR_RULES = {
    "sqrt": math.sqrt,
    "linear": lambda ratio: ratio,
    "none": lambda ratio: 1.0,
}


def scaled_lr(base_lr: float, samples: int, base_samples: int, rule: str,
              prompts: int | None = None, base_prompts: int | None = None) -> float:
    """lr for a batch of `samples` given `base_lr` at `base_samples` under `rule`.

    With `prompts` and `base_prompts` (optim.lr_batch: prompts_capped) the samples ratio is capped
    at the prompts ratio (floored at 1): more samples of the same few prompts are not more
    independent information, and a larger lr on fewer prompts undid earlier learning.
    """
    ratio = samples / base_samples
    if prompts is not None and base_prompts is not None:
        ratio = min(ratio, max(prompts / base_prompts, 1.0))
    return base_lr * LR_RULES[rule](ratio)


def stage_lr(spec: JobSpec, samples: int, prompts: int) -> float:
    """A stage's lr under the spec's rule (optim.lr_scaling, optim.lr_batch) against stage 0."""
    first, optim = spec.rollout.schedule[0], spec.optim
    capped = optim.lr_batch == "prompts_capped"
    return scaled_lr(optim.lr, samples, first.samples_per_step, optim.lr_scaling,
                     prompts if capped else None, first.prompts_per_step if capped else None)


@dataclass(frozen=True)
class StagePlan:
    index: int
    n: int
    prompts_per_step: int
    samples_per_step: int
    lr: float
    steps: int
    first_step: int  # 0-based index of the stage's first step (the steps done before it)


def plan(spec: JobSpec) -> list[StagePlan]:
    """The stage table: what each stage runs and at which learning rate."""
    stages = spec.rollout.schedule
    out, first = [], 0
    for i, s in enumerate(stages):
        lr = stage_lr(spec, s.samples_per_step, s.prompts_per_step)
        out.append(StagePlan(i, s.n, s.prompts_per_step, s.samples_per_step, lr, s.steps, first))
        first += s.steps
    return out


FEW_PROMPTS = 16  # below this many prompts per step a broad stage lost pass@1 here (section 6)


def stage_warning(plans: list[StagePlan], p: StagePlan) -> str | None:
    """A warning when stage `p` updates on few prompts per step, and fewer than the first stage.

    Broad stages that kept samples per step by cutting prompts (16 -> 4) lost the narrow
    stage's held-out pass@1 while the same samples over 16 prompts held it (docs/results.md,
    section 6): an update's information comes mostly from the number of distinct prompts.
    """
    first = plans[0]
    if p.prompts_per_step >= FEW_PROMPTS or p.prompts_per_step * 2 > first.prompts_per_step:
        return None
    return (f"stage {p.index} updates on {p.prompts_per_step} prompts per step, "
            f"{first.prompts_per_step / p.prompts_per_step:.3g}x fewer than stage 0 "
            f"({first.prompts_per_step}): few prompts per update can undo what earlier stages "
            f"learned; keep prompts_per_step and let samples per step grow with n")


def stage_for_step(plans: list[StagePlan], index: int) -> StagePlan:
    """The stage that runs the step of 0-based global `index` (the steps done before it)."""
    for p in plans:
        if index < p.first_step + p.steps:
            return p
    raise IndexError(f"step index {index} is beyond the schedule")


def lr_at(plans: list[StagePlan], index: int, warmup_steps: int) -> float:
    """The lr of the step of 0-based `index`: its stage's, with linear warmup over the first
    `warmup_steps` steps."""
    lr = stage_for_step(plans, index).lr
    if warmup_steps and index < warmup_steps:
        lr *= (index + 1) / warmup_steps
    return lr


# ------------------------------------------------------------------ broaden on a plateau


@dataclass
class Plateau:
    """`rollout.broaden`'s memory of the metric: the best value and evaluations since it rose."""

    best: float | None = None
    since: int = 0

    def observe(self, value: float, min_delta: float) -> None:
        if self.best is None or value >= self.best + min_delta:
            self.best, self.since = value, 0
        else:
            self.since += 1


def broadened_stage(spec: JobSpec, prev: StagePlan, first_step: int) -> StagePlan | None:
    """The stage after `prev` under `rollout.broaden`, starting at 0-based `first_step` and running
    to the end of the job; None when n is at `max_n` already or no step is left."""
    b, first = spec.rollout.broaden, spec.rollout.schedule[0]
    if b is None or prev.n >= b.max_n or first_step >= spec.total_steps:
        return None
    n = min(prev.n * b.factor, b.max_n)
    prompts = first.prompts_per_step
    if b.prompts == "keep_samples":
        prompts = max(min(b.min_prompts, first.prompts_per_step), math.ceil(first.samples_per_step / n))
    lr = stage_lr(spec, n * prompts, prompts)
    return StagePlan(prev.index + 1, n, prompts, n * prompts, lr, spec.total_steps - first_step, first_step)


def broaden(spec: JobSpec, plans: list[StagePlan], first_step: int) -> list[StagePlan] | None:
    """`plans` with the running stage cut at `first_step` and a broadened one from there; None
    when it cannot broaden (see `broadened_stage`)."""
    if first_step <= 0:
        return None
    prev = stage_for_step(plans, first_step - 1)
    nxt = broadened_stage(spec, prev, first_step)
    if nxt is None:
        return None
    cut = [p for p in plans if p.first_step < first_step]
    last = cut[-1]
    cut[-1] = StagePlan(last.index, last.n, last.prompts_per_step, last.samples_per_step, last.lr,
                        first_step - last.first_step, last.first_step)
    return cut + [nxt]


def replan(spec: JobSpec, broaden_starts: list[int]) -> list[StagePlan]:
    """The stage table after broadening at each of `broaden_starts` (a resumed run's)."""
    plans = plan(spec)
    for start in broaden_starts:
        plans = broaden(spec, plans, start) or plans
    return plans


def widest_samples(spec: JobSpec) -> int:
    """The most samples per step any stage can ask for (the engine's batch size)."""
    widest = max(p.samples_per_step for p in plan(spec))
    plans = plan(spec)
    while (nxt := broaden(spec, plans, plans[-1].first_step + 1)) is not None:
        plans = nxt
        widest = max(widest, plans[-1].samples_per_step)
    return widest
