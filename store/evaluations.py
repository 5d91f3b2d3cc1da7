"""Evaluations as jobs: which checkpoints an evaluation names, and where their folders are.

An evaluation is a job row of kind `evaluation` (id `evl_...`, store.tables.JobKind), so it is
queued, claimed, leased, fenced, cancelled and reaped by the one state machine in store.jobs.
Its `parent_job_id` is the evaluated job (the job's evaluations are listed by it), and its
stored spec is the `EvaluationSpec` resolved (trainer.evaluation_spec.filled): "latest" and
"best" turned into steps, with how each was picked. The API calls `resolve` to answer 422 / 404
before queueing; the worker calls `folders` again before loading (a checkpoint may have been
rotated out meanwhile, which fails the evaluation with that reason).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from store import jobs
from store.errors import IdempotencyConflict, NotFound
from store.tables import Job, JobKind, Metric
from trainer.algo.eval_compare import best_from_training
from trainer.evaluation_spec import EvaluationSpec, Picked, filled
from trainer.spec import FieldError, JobSpec

BEST_METRIC = "eval/pass@1"


@dataclass(frozen=True)
class Folders:
    """What an evaluation loads: the base's folder (None: the job's own model) and each step's."""

    base: Path | None
    steps: dict[int, Path]


def evaluated_job(s: Session, tenant_id: int, job_id: str) -> Job:
    """The caller's training job; another tenant's is as unknown as a made-up id (NotFound)."""
    job = jobs.get_job(s, tenant_id, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def _eval_metrics(s: Session, job_id: str, steps: list[int]) -> list[tuple[int, dict]]:
    rows = s.execute(select(Metric.step, Metric.values).where(Metric.job_id == job_id, Metric.step.in_(steps)))
    return [(step, values or {}) for step, values in rows]


def pick(s: Session, tenant_id: int, job: Job, choices: list) -> list[Picked]:
    """The steps `choices` name, in order, each once (a step named twice, e.g. "best" that is
    also "latest", carries both names). FieldError naming `checkpoints` when one is missing."""
    stored = [c.step for c in jobs.list_checkpoints(s, tenant_id, job.id)]
    if not stored:
        raise FieldError("checkpoints", f"job {job.id} has no checkpoint yet")
    picked: dict[int, Picked] = {}
    for choice in choices:
        if choice == "latest":
            step, why = max(stored), "the newest stored checkpoint"
        elif choice == "best":
            found = best_from_training(stored, _eval_metrics(s, job.id, stored), BEST_METRIC)
            if found is None:
                raise FieldError("checkpoints", f"job {job.id} recorded no {BEST_METRIC} at a stored checkpoint's "
                                 f"step (checkpoints at {stored}): name a step")
            step, why = found
        else:
            if choice not in stored:
                raise FieldError("checkpoints", f"job {job.id} has no checkpoint at step {choice} (it has {stored})")
            step, why = choice, ""
        name = str(choice)
        if step in picked:
            old = picked[step]
            picked[step] = old.model_copy(update={"asked": [*old.asked, name], "why": old.why or why})
        else:
            picked[step] = Picked(step=step, asked=[name], why=why)
    return list(picked.values())


def resolve(s: Session, tenant_id: int, job_id: str, spec: EvaluationSpec) -> tuple[EvaluationSpec, Job]:
    """The spec to store (steps picked, the job's settings filled in) and the evaluated job."""
    job = evaluated_job(s, tenant_id, job_id)
    job_spec = JobSpec.model_validate(job.spec)
    resolved = filled(spec, job_spec, job.id, pick(s, tenant_id, job, list(spec.checkpoints)))
    if resolved.base:
        base_folder(s, tenant_id, job_spec)  # a continued job's base must still be there
    return resolved, job


def base_folder(s: Session, tenant_id: int, job_spec: JobSpec) -> Path | None:
    """The folder of the model a job started from: its parent's checkpoint for a continued job,
    None for its own `model` (a path, or builtin:tiny warm-started as the job was)."""
    ref = job_spec.continue_from
    if ref is None:
        return None
    ckpt = jobs.get_checkpoint(s, tenant_id, ref.job, ref.step) if ref.step is not None else None
    if ckpt is None:
        raise FieldError("base", f"the checkpoint this job continued ({ref.job} step {ref.step}) is no longer "
                         "stored: evaluate without the base (base: false)")
    return Path(ckpt.uri)


def folders(s: Session, tenant_id: int, spec: EvaluationSpec) -> tuple[JobSpec, Folders]:
    """The evaluated job's spec and the folders to load (the worker, just before loading)."""
    job = evaluated_job(s, tenant_id, spec.job or "")
    job_spec = JobSpec.model_validate(job.spec)
    steps = {}
    for step in spec.checkpoints:
        ckpt = jobs.get_checkpoint(s, tenant_id, job.id, int(step))
        if ckpt is None:
            raise FieldError("checkpoints", f"job {job.id}'s checkpoint at step {step} is no longer stored")
        steps[int(step)] = Path(ckpt.uri)  # a checkpoint's uri is its folder
    return job_spec, Folders(base_folder(s, tenant_id, job_spec) if spec.base else None, steps)


def total_samples(spec: EvaluationSpec, job_spec: JobSpec) -> int:
    """Samples the evaluation will draw, as far as the API can tell (the worker's progress
    corrects it once the eval split is built)."""
    task = spec.task or job_spec.task
    split = task.reasoning_gym.eval_size if task.reasoning_gym is not None else (spec.prompts or 64)
    prompts = min(spec.prompts or split, split)
    return prompts * int(spec.n or 1) * (len(spec.checkpoints) + int(spec.base))


def _request(job_id: str, spec: EvaluationSpec) -> dict:
    """What an Idempotency-Key stands for: the request (the job and the body as asked), not the
    resolved spec, whose "latest" moves when the job saves another checkpoint."""
    return {"job": job_id, "request": spec.model_dump(mode="json", exclude={"job", "picked"})}


def replay(s: Session, tenant_id: int, job_id: str, spec: EvaluationSpec, key: str | None) -> Job | None:
    """The evaluation an earlier request with this key created (IdempotencyConflict when that
    request differed, or the key belongs to another kind of row); None for a new key."""
    if not key:
        return None
    row = s.scalar(select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key)
                   .execution_options(populate_existing=True))
    if row is None:
        return None
    if row.kind != JobKind.evaluation or row.client_meta != _request(job_id, spec):
        raise IdempotencyConflict(f"Idempotency-Key was already used for {row.id} with a different request")
    return row


def create_evaluation(s: Session, tenant_id: int, job_id: str, spec: EvaluationSpec,
                      idempotency_key: str | None = None) -> tuple[Job, bool]:
    """Insert a queued evaluation of the caller's job (resolved first: a bad reference is
    refused here); a replay of an Idempotency-Key returns the first row (created False)."""
    evaluated_job(s, tenant_id, job_id)  # another tenant's job is a 404, also for a replayed key
    if (row := replay(s, tenant_id, job_id, spec, idempotency_key)) is not None:
        return row, False
    resolved, job = resolve(s, tenant_id, job_id, spec)
    steps = ", ".join(str(p.step) for p in resolved.picked)
    return jobs.create_job(s, tenant_id, resolved.model_dump(mode="json"),
                           total_steps=total_samples(resolved, JobSpec.model_validate(job.spec)),
                           name=f"evaluation of {job.name} at {steps}"[:200], idempotency_key=idempotency_key,
                           kind=JobKind.evaluation, parent_job_id=job.id, client_meta=_request(job_id, spec))


def list_for_job(s: Session, tenant_id: int, job_id: str, limit: int = 50) -> list[Job]:
    """The caller's evaluations of a job, newest first."""
    query = (select(Job).where(Job.tenant_id == tenant_id, Job.parent_job_id == job_id,
                               Job.kind == JobKind.evaluation)
             .order_by(Job.id.desc()).limit(limit).execution_options(populate_existing=True))
    return list(s.scalars(query))
