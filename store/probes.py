"""Probes as jobs: what a probe's row holds and how its model and base job spec are found.

A probe is a job row of kind `probe` (store.tables.JobKind), so it is queued, claimed, leased,
fenced, cancelled and reaped by the one state machine in store.jobs. This module only adds
what is probe-specific: the stored spec is the `ProbeSpec` with its task filled in, progress
counts samples (`total_steps` = n x prompts), and `resolve` turns `model: {job, step}` into
the tenant's checkpoint folder and the job spec the recommendation builds on. The API calls
`resolve` to answer 422 before queueing; the worker calls it again before loading (the
checkpoint may have been rotated out meanwhile).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from store import jobs
from store.tables import Job, JobKind
from trainer.probe_spec import CheckpointRef, ProbeSpec, base_job_spec, job_spec_of_checkpoint
from trainer.spec import FieldError, JobSpec


@dataclass(frozen=True)
class Resolved:
    """What a probe runs: the job spec standing for it, and a checkpoint folder if any."""

    probe: ProbeSpec
    base: JobSpec
    model_dir: Path | None


def resolve(s: Session, tenant_id: int, probe: ProbeSpec) -> Resolved:
    """The probe's base job spec and model folder; FieldError naming `model.job`,
    `model.step` or `task` when the tenant has no such job or checkpoint."""
    if not isinstance(probe.model, CheckpointRef):
        return Resolved(probe, base_job_spec(probe), None)
    ref = probe.model
    job = jobs.get_job(s, tenant_id, ref.job)
    if job is None:
        raise FieldError("model.job", f"no job {ref.job!r}")
    ckpt = (jobs.get_checkpoint(s, tenant_id, ref.job, ref.step) if ref.step is not None
            else jobs.latest_checkpoint(s, ref.job))
    if ckpt is None:
        steps = [c.step for c in jobs.list_checkpoints(s, tenant_id, ref.job)]
        raise FieldError("model.step", f"job {ref.job} has no checkpoint at step {ref.step} "
                         f"(it has {steps or 'none'})")
    base = job_spec_of_checkpoint(probe, job.spec)
    filled = probe.model_copy(update={"task": base.task})
    return Resolved(filled, base, Path(ckpt.uri))  # a checkpoint's uri is its folder


def create_probe(s: Session, tenant_id: int, probe: ProbeSpec,
                 idempotency_key: str | None = None) -> tuple[Job, bool]:
    """Insert a queued probe (resolved first, so a bad reference is refused here)."""
    resolved = resolve(s, tenant_id, probe)
    stored = resolved.probe.model_dump(mode="json")
    task = resolved.base.task.reasoning_gym.name if resolved.base.task.reasoning_gym else "dataset"
    return jobs.create_job(s, tenant_id, stored, total_steps=probe.n * probe.prompts,
                           name=f"probe {task} n={probe.n}", idempotency_key=idempotency_key,
                           kind=JobKind.probe)
