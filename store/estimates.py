"""Reads behind estimates: finished jobs' measured figures, a running job's recent steps, and
where a queued job stands in its queue.

Metric rows are JSON; the few numbers needed (`n`, `prompts`, `samples`, `step_s`, `gen_s`) are
summed here in Python, over a bounded number of rows, so SQLite and PostgreSQL read the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.job_queries import spec_gpus, spec_nodes
from store.tables import Job, JobKind, JobStatus, Metric

# Finished jobs a measurement draws on (the newest), the step rows read of each (its first
# ones: a dry run must not read millions of rows), and a running job's steps its ETA uses.
PAST_JOBS = 50
STEPS_PER_PAST_JOB = 500
RECENT_STEPS = 20


@dataclass(frozen=True)
class StepTotals:
    """Sums over step rows (step >= 1) of one job."""

    rows: int = 0
    scheduled_samples: float = 0.0   # n x prompts of each row
    samples: float = 0.0             # generated, refill rounds included
    step_s: float = 0.0
    gen_s: float = 0.0


def _num(values: dict[str, Any], name: str) -> float:
    value = values.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _totals(rows: list[dict[str, Any]]) -> StepTotals:
    timed = [v for v in rows if _num(v, "step_s") > 0]
    return StepTotals(
        rows=len(timed),
        scheduled_samples=sum(_num(v, "n") * _num(v, "prompts") for v in timed),
        samples=sum(_num(v, "samples") for v in timed),
        step_s=sum(_num(v, "step_s") for v in timed),
        gen_s=sum(_num(v, "gen_s") for v in timed))


def finished_jobs(s: Session, limit: int = PAST_JOBS,
                  steps: int = STEPS_PER_PAST_JOB) -> list[tuple[Job, StepTotals]]:
    """The deployment's newest succeeded training jobs that ran in one attempt (a retried or
    paused job's wall time includes time it did not run), each with the totals of its first
    `steps` step rows. All tenants: the figures describe this deployment's workers, and
    callers show only numbers."""
    query = (select(Job).where(Job.kind == JobKind.train, Job.status == JobStatus.succeeded,
                               Job.attempt == 1, Job.started_at.is_not(None),
                               Job.finished_at.is_not(None))
             .order_by(Job.id.desc()).limit(limit))
    jobs = list(s.scalars(query))
    if not jobs:
        return []
    by_job: dict[str, list[dict[str, Any]]] = {j.id: [] for j in jobs}
    rows = s.execute(select(Metric.job_id, Metric.values)
                     .where(Metric.job_id.in_(list(by_job)), Metric.step >= 1, Metric.step <= steps))
    for job_id, values in rows:
        if isinstance(values, dict):
            by_job[job_id].append(values)
    return [(j, _totals(by_job[j.id])) for j in jobs]


def recent_steps(s: Session, job_id: str, limit: int = RECENT_STEPS) -> StepTotals:
    """Totals over a job's last `limit` step rows (its own pace, for an ETA)."""
    query = (select(Metric.values).where(Metric.job_id == job_id, Metric.step >= 1)
             .order_by(Metric.step.desc()).limit(limit))
    return _totals([v for v in s.scalars(query) if isinstance(v, dict)])


@dataclass(frozen=True)
class QueuePlace:
    position: int        # 1: the next job a worker of this queue takes
    gpus: int            # the queue: jobs asking for this many GPUs (per node)
    multi_node: bool     # the queue of every multi-node job instead (worker.celery_app.queue_for)
    yours_ahead: list[str]
    others_ahead: int    # other tenants' jobs ahead: a count, never ids
    running: int         # jobs of this queue running now (every tenant)


def _job_gpus(kind: JobKind, spec: Any) -> int:
    return 1 if kind == JobKind.probe else spec_gpus(spec)  # a probe runs on one GPU


def queue_key(kind: JobKind, spec: Any) -> int | str:
    """Which queue a job waits on, as worker.celery_app.queue_for picks it: every multi-node
    job on one queue (its Ray drivers'), the others by their GPU count."""
    if kind != JobKind.probe and spec_nodes(spec) > 1:
        return "multi-node"
    return _job_gpus(kind, spec)


def queue_place(s: Session, job: Job) -> QueuePlace | None:
    """Where a queued job stands. Workers take a queue's messages in the order they were sent,
    which is submission order (ids are ULIDs), among queued jobs of the same GPU count,
    probes included; None when the job is not queued."""
    if job.status != JobStatus.queued:
        return None
    gpus, key = _job_gpus(job.kind, job.spec), queue_key(job.kind, job.spec)
    rows = s.execute(select(Job.id, Job.tenant_id, Job.kind, Job.spec, Job.status)
                     .where(Job.status.in_([JobStatus.queued, JobStatus.running]))
                     .order_by(Job.id))
    yours: list[str] = []
    others = running = 0
    for job_id, tenant_id, kind, spec, status in rows:
        if queue_key(JobKind(kind), spec) != key:
            continue
        if status == JobStatus.running:
            running += 1
        elif job_id < job.id:
            if tenant_id == job.tenant_id:
                yours.append(job_id)
            else:
                others += 1
    return QueuePlace(len(yours) + others + 1, gpus, key == "multi-node", yours, others, running)


def queued_on(s: Session, key: int | str) -> int:
    """Jobs queued now on the queue of `key` (`queue_key`), every tenant's (a count)."""
    rows = s.execute(select(Job.kind, Job.spec).where(Job.status == JobStatus.queued))
    return sum(1 for kind, spec in rows if queue_key(JobKind(kind), spec) == key)
