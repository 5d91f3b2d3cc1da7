"""Read-only job queries: jobs, events, metrics and checkpoints, always scoped to a tenant
except where the name says `unscoped` (worker and reaper only).

store.jobs re-exports every function here, so callers can use `store.jobs` for all job
operations; this module only keeps the state machine's file short.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, Text, and_, bindparam, cast, func, or_, select
from sqlalchemy.orm import Session

from store.tables import Checkpoint, Job, JobEvent, JobKind, JobSample, JobStatus, Metric
from trainer.spec import LimitsSpec

# Every read of a job overwrites the session's copy: the state machine's compare-and-set
# UPDATEs bypass loaded objects, and a long-lived session (expire_on_commit=False) must never
# answer with a status another process has since changed.
_FRESH = {"populate_existing": True}


def get_job(s: Session, tenant_id: int, job_id: str, kind: JobKind = JobKind.train) -> Job | None:
    """The tenant's job of `kind`, or None (also when it belongs to another tenant: a probe
    is not a training job and vice versa, so neither route answers for the other's ids)."""
    query = select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id, Job.kind == JobKind(kind))
    return s.scalar(query.execution_options(**_FRESH))

def get_job_unscoped(s: Session, job_id: str) -> Job | None:
    """Any tenant's job: for the worker and the reaper, never for API lookups."""
    return s.get(Job, job_id, populate_existing=True)


def _resource(spec: Any, name: str) -> int:
    """`resources.<name>` of a stored spec, 1 when absent (specs stored before jobs could ask
    for more)."""
    resources = spec.get("resources") if isinstance(spec, dict) else None
    value = resources.get(name) if isinstance(resources, dict) else None
    return int(value) if value else 1


def spec_gpus(spec: Any) -> int:
    """`resources.gpus_per_node` of a stored spec."""
    return _resource(spec, "gpus_per_node")


def spec_nodes(spec: Any) -> int:
    """`resources.nodes` of a stored spec. A job of more than one node is sent to the Ray
    driver workers' queue."""
    return _resource(spec, "nodes")


# Specs stored without limits (older rows) get the spec's own default.
DEFAULT_MAX_ATTEMPTS = LimitsSpec.model_fields["max_attempts"].default


def spec_max_attempts(spec: Any) -> int:
    """`limits.max_attempts` of a stored spec (the default when absent). The store reads a
    stored spec only here and in `spec_gpus` / `spec_nodes`: what its state machine and the
    queues need."""
    limits = spec.get("limits") if isinstance(spec, dict) else None
    value = limits.get("max_attempts") if isinstance(limits, dict) else None
    return int(value) if value else DEFAULT_MAX_ATTEMPTS


def job_shapes(s: Session, job_ids: list[str]) -> dict[str, tuple[int, int]]:
    """job id -> (GPUs per node, nodes) its spec asks for, which pick its queue (the reaper),
    in one read of the specs."""
    if not job_ids:
        return {}
    rows = s.execute(select(Job.id, Job.spec).where(Job.id.in_(job_ids)))
    return {job_id: (spec_gpus(spec), spec_nodes(spec)) for job_id, spec in rows}


def continuations(s: Session, tenant_id: int, job_id: str) -> list[Job]:
    """The tenant's jobs started from a checkpoint of `job_id` (spec.continue_from), oldest first
    (its evaluations, which name it as their parent too, are not continuations)."""
    query = select(Job).where(Job.tenant_id == tenant_id, Job.parent_job_id == job_id,
                              Job.kind == JobKind.train)
    return list(s.scalars(query.order_by(Job.id)))


def list_jobs(
    s: Session,
    tenant_id: int,
    limit: int = 20,
    after: str | None = None,
    status: JobStatus | None = None,
    kind: JobKind = JobKind.train,
) -> tuple[list[Job], bool]:
    """The tenant's jobs newest first; `after` is the last id of the previous page.

    Ids sort by creation time (ULID), so "older than the cursor" is simply `id < after`.
    Returns (jobs, has_more). The API shows an overview of each spec (model, task, schedule),
    never the whole spec; specs are size-bounded at submission (trainer/spec.py).
    """
    query = select(Job).where(Job.tenant_id == tenant_id, Job.kind == JobKind(kind))
    if status is not None:
        query = query.where(Job.status == JobStatus(status))
    if after is not None:
        query = query.where(Job.id < after)
    query = query.order_by(Job.id.desc()).limit(limit + 1).execution_options(**_FRESH)
    rows = list(s.scalars(query))
    return rows[:limit], len(rows) > limit

def _scoped(query: Select[Any], model: Any, tenant_id: int, job_id: str) -> Select[Any]:
    """Restrict a child-table query to one job of one tenant."""
    return query.join(Job, Job.id == model.job_id).where(
        model.job_id == job_id, Job.tenant_id == tenant_id)

def latest_checkpoint(s: Session, job_id: str) -> Checkpoint | None:
    """The highest-step checkpoint of a job (what a retried attempt resumes from)."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id)
    return s.scalar(query.order_by(Checkpoint.step.desc()).limit(1))

def list_checkpoints(s: Session, tenant_id: int, job_id: str, after: int | None = None,
                     limit: int | None = None, newest_first: bool = False) -> list[Checkpoint]:
    """Checkpoints by ascending step, those after step `after`, at most `limit` of them
    (`newest_first`: by descending step, those before step `after`, as OpenAI lists them)."""
    query = _scoped(select(Checkpoint), Checkpoint, tenant_id, job_id)
    if newest_first:
        if after is not None:
            query = query.where(Checkpoint.step < after)
        return list(s.scalars(query.order_by(Checkpoint.step.desc()).limit(limit)))
    if after is not None:
        query = query.where(Checkpoint.step > after)
    return list(s.scalars(query.order_by(Checkpoint.step).limit(limit)))

def get_checkpoint(s: Session, tenant_id: int, job_id: str, step: int) -> Checkpoint | None:
    query = _scoped(select(Checkpoint), Checkpoint, tenant_id, job_id)
    return s.scalar(query.where(Checkpoint.step == step))

def list_events(
    s: Session, tenant_id: int, job_id: str, after: int | None = None, limit: int = 100,
    newest_first: bool = False,
) -> list[JobEvent]:
    """Events oldest first; `after` is the last event id seen (SSE Last-Event-ID).
    `newest_first`: newest first, those older than `after` (OpenAI's order)."""
    query = _scoped(select(JobEvent), JobEvent, tenant_id, job_id)
    if newest_first:
        if after is not None:
            query = query.where(JobEvent.id < after)
        return list(s.scalars(query.order_by(JobEvent.id.desc()).limit(limit)))
    if after is not None:
        query = query.where(JobEvent.id > after)
    return list(s.scalars(query.order_by(JobEvent.id).limit(limit)))

def list_metrics(
    s: Session, tenant_id: int, job_id: str, after_step: int | None = None, limit: int = 1000
) -> list[Metric]:
    """Metric rows by ascending step, strictly after `after_step`."""
    query = _scoped(select(Metric), Metric, tenant_id, job_id)
    if after_step is not None:
        query = query.where(Metric.step > after_step)
    return list(s.scalars(query.order_by(Metric.step).limit(limit)))

def list_samples(s: Session, tenant_id: int, job_id: str, *, step: int | None = None,
                 min_reward: float | None = None, max_reward: float | None = None,
                 after: int | None = None, limit: int = 100) -> list[JobSample]:
    """Stored samples, newest step first and in their place within a step; `after` is the id
    of the previous page's last sample (a keyset cursor on (step, idx))."""
    query = _scoped(select(JobSample), JobSample, tenant_id, job_id)
    if step is not None:
        query = query.where(JobSample.step == step)
    if min_reward is not None:
        query = query.where(JobSample.reward >= min_reward)
    if max_reward is not None:
        query = query.where(JobSample.reward <= max_reward)
    last = s.get(JobSample, after) if after is not None else None
    if last is not None and last.job_id == job_id:
        query = query.where(or_(JobSample.step < last.step,
                                and_(JobSample.step == last.step, JobSample.idx > last.idx)))
    return list(s.scalars(query.order_by(JobSample.step.desc(), JobSample.idx).limit(limit)))


def _metric_page_query() -> Select[Any]:
    m = Metric.__table__
    join = Job.__table__.outerjoin(m, and_(m.c.job_id == Job.id, m.c.step > bindparam("after")))
    return (select(m.c.step, cast(m.c["values"], Text), m.c.created_at)
            .select_from(join)
            .where(Job.id == bindparam("job_id"), Job.tenant_id == bindparam("tenant_id"))
            .order_by(m.c.step).limit(bindparam("limit")))


# Built once: constructing the statement per request cost more CPU than running it.
_METRIC_PAGE = _metric_page_query()


def metric_page_raw(
    conn: Connection, tenant_id: int, job_id: str, after_step: int | None, limit: int
) -> list[tuple[int, str, Any]] | None:
    """The API's hot read in one round trip: up to `limit` (step, values as JSON text,
    created_at) rows after `after_step`, or None when the tenant has no such job.

    The job check rides along as a LEFT JOIN (a job without rows yet gives one all-NULL row),
    and `values` comes back as the database's JSON text, so a page is never decoded into
    Python objects only to be encoded again.
    """
    after = -(2**31) if after_step is None else after_step
    rows = conn.execute(_METRIC_PAGE, {"after": after, "job_id": job_id,
                                       "tenant_id": tenant_id, "limit": limit}).all()
    if not rows:
        return None
    return [tuple(r) for r in rows if r[0] is not None]

def count_jobs_by_status(s: Session) -> dict[str, int]:
    """Jobs per status over all tenants (every status present, zeros included): /metrics."""
    counts = {status.value: 0 for status in JobStatus}
    for status, n in s.execute(select(Job.status, func.count()).group_by(Job.status)):
        counts[JobStatus(status).value] = n
    return counts

def count_active_jobs(s: Session, tenant_id: int) -> int:
    """The tenant's queued and running jobs: what the job quota is checked against."""
    query = select(func.count(Job.id)).where(
        Job.tenant_id == tenant_id, Job.status.in_([JobStatus.queued, JobStatus.running]))
    return int(s.scalar(query) or 0)
