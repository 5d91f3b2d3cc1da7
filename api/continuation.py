"""Continue from a checkpoint: resolving `continue_from` at submission, and the spec of a
continuation ("continue broad": BroRL's plateau -> broad step, one call).

A continued job's parent must be one of the caller's jobs (another tenant's is a 404, as
every lookup), with a checkpoint at the asked step (or any, for the newest); the step is
written into the stored spec, so every attempt of the job starts from the same checkpoint.
The continuation trains the parent's model: its `model` section is the parent's (filled in
when not given; a different path or adapter is a 422), and restoring the optimizer state asks
for the parent's optimizer settings too.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from store import jobs
from store.errors import NotFound
from store.tables import Job
from trainer.algo.schedule import stage_lr
from trainer.spec import JobSpec

from api.errors import field_error

BROAD_FACTOR, BROAD_MAX_N = 4, 512  # "continue broad": n x 4, up to the paper's 512


def resolve(session: Session, tenant_id: int, spec: JobSpec) -> tuple[JobSpec, str | None]:
    """(the spec to store, the parent's id); the spec as given when it continues nothing."""
    ref = spec.continue_from
    if ref is None:
        return spec, None
    parent = jobs.get_job(session, tenant_id, ref.job)
    if parent is None:
        raise NotFound(f"job {ref.job} not found")
    asked = ref.pinned_step  # None: "latest" or null, the newest
    ckpt = (jobs.get_checkpoint(session, tenant_id, ref.job, asked) if asked is not None
            else jobs.latest_checkpoint(session, ref.job))
    if ckpt is None:
        steps = [c.step for c in jobs.list_checkpoints(session, tenant_id, ref.job)]
        raise field_error("continue_from.step", f"job {ref.job} has no checkpoint"
                          + (f" at step {asked}" if asked is not None else "")
                          + f" (it has {steps or 'none'})")
    parent_spec = JobSpec.model_validate(parent.spec)
    model = parent_spec.model
    if "model" in spec.model_fields_set:
        if spec.model.path != model.path or spec.model.lora != model.lora:
            raise field_error("model", f"a continuation trains its parent's model ({model.path}"
                              + (f", LoRA rank {model.lora.rank}" if model.lora else "")
                              + "): leave model out, or give the parent's")
        model = spec.model  # e.g. another dtype or gradient checkpointing for the same weights
    if ref.optimizer and spec.optim.optimizer_state != parent_spec.optim.optimizer_state:
        raise field_error("continue_from.optimizer", "the parent's optimizer state is kept as "
                          f"{parent_spec.optim.optimizer_state}: give the same optim.optimizer_state, "
                          "or continue without it")
    resolved = spec.model_copy(update={"model": model,
                                       "continue_from": ref.model_copy(update={"step": ckpt.step})})
    return resolved, parent.id


def continuation_spec(parent: Job, broad: bool) -> dict[str, Any]:
    """The spec that continues `parent` from its newest checkpoint: its own spec, or with
    `broad` BroRL's next move: its last stage's prompts at n x 4 (at most 512) for as many
    steps, at the lr the parent's own scaling rule gives that batch."""
    spec = JobSpec.model_validate(parent.spec)
    data = spec.model_dump(mode="json", exclude={"continue_from"})
    data["name"] = f"{spec.name} (continued{', broad' if broad else ''})"[:200]
    data["continue_from"] = {"job": parent.id, "step": None, "optimizer": False}
    if broad:
        last = spec.rollout.schedule[-1]
        n = max(min(last.n * BROAD_FACTOR, BROAD_MAX_N), last.n)
        data["rollout"]["schedule"] = [{"n": n, "prompts_per_step": last.prompts_per_step, "steps": last.steps}]
        data["rollout"]["broaden"] = None
        data["optim"]["lr"] = stage_lr(spec, n * last.prompts_per_step, last.prompts_per_step)
    return data
