"""The broadening schedule: stages of (n, prompts_per_step, steps) and the LR rule.

Each stage's learning rate is `optim.lr * f(B / B0)` where B = prompts x n is the stage's
samples per step and B0 the first stage's (PAPER.md: square-root scaling, eta0*sqrt(B/B0)).
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


def scaled_lr(base_lr: float, samples: int, base_samples: int, rule: str) -> float:
    """lr for a batch of `samples` given `base_lr` at `base_samples` under `rule`."""
    return base_lr * LR_RULES[rule](samples / base_samples)


@dataclass(frozen=True)
class StagePlan:
    index: int
    n: int
    prompts_per_step: int
    samples_per_step: int
    lr: float
    steps: int
    first_step: int  # 0-based global step at which the stage starts


def plan(spec: JobSpec) -> list[StagePlan]:
    """The stage table: what each stage runs and at which learning rate."""
    stages = spec.rollout.schedule
    base = stages[0].samples_per_step
    out, first = [], 0
    for i, s in enumerate(stages):
        lr = scaled_lr(spec.optim.lr, s.samples_per_step, base, spec.optim.lr_scaling)
        out.append(StagePlan(i, s.n, s.prompts_per_step, s.samples_per_step, lr, s.steps, first))
        first += s.steps
    return out


def stage_for_step(plans: list[StagePlan], step: int) -> StagePlan:
    """The stage that runs 0-based global `step`."""
    for p in plans:
        if step < p.first_step + p.steps:
            return p
    raise IndexError(f"step {step} is beyond the schedule")


def lr_at(plans: list[StagePlan], step: int, warmup_steps: int) -> float:
    """The stage's lr, with linear warmup over the first `warmup_steps` global steps."""
    lr = stage_for_step(plans, step).lr
    if warmup_steps and step < warmup_steps:
        lr *= (step + 1) / warmup_steps
    return lr
