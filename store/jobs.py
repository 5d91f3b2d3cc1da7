"""The job state machine: queued -> running -> succeeded | failed | cancelled.

Every function takes a Session first; the caller commits unless the docstring says
otherwise. Two ideas keep concurrent API requests, duplicate Celery deliveries, crashed
workers and reapers from corrupting a job:

* Compare-and-set: every transition is a single `UPDATE ... WHERE <expected state>`, so the
  database decides the race (Postgres row locks, SQLite's single writer), never a read
  followed by a write.
* Fencing: a claim bumps `attempt`; a worker's later writes carry the attempt it claimed and
  are refused (`Fenced`) once the job is no longer running under that attempt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from store import sample_rows, webhooks
from store.errors import Fenced, IdempotencyConflict, InvalidTransition, NotFound
from store.job_queries import (  # re-exported: store.jobs is the one entry point
    count_active_jobs,
    continuations,
    count_jobs_by_status,
    get_checkpoint,
    get_job,
    get_job_unscoped,
    job_shapes,
    latest_checkpoint,
    list_checkpoints,
    list_events,
    list_jobs,
    list_metrics,
    list_samples,
    metric_page_raw,
    spec_gpus,
    spec_max_attempts,
    spec_nodes,
)
from store.tables import (
    TERMINAL_STATUSES,
    Checkpoint,
    EventType,
    Job,
    JobEvent,
    JobKind,
    JobSample,
    JobStatus,
    Metric,
    UTCDateTime,
    new_id,
    utcnow,
)

__all__ = [
    "Claim", "add_event", "claim", "continuations", "count_jobs_by_status", "create_job", "finish",
    "get_checkpoint", "get_job", "get_job_unscoped", "heartbeat", "job_shapes", "latest_checkpoint",
    "list_checkpoints", "list_events", "list_jobs", "list_metrics", "reap_expired",
    "record_checkpoint", "record_metrics", "record_progress", "record_result", "request_cancel",
    "retry_or_fail", "spec_gpus", "spec_hash", "spec_nodes",
]

# The compare-and-set UPDATEs below don't touch Job objects already loaded in the session;
# the reads in job_queries overwrite the session's copy instead (populate_existing).
_NO_SYNC = {"synchronize_session": False}
_FRESH = {"populate_existing": True}


@dataclass(frozen=True)
class Claim:
    """What a worker gets for winning a job: the attempt to carry on every later write."""

    job_id: str
    attempt: int
    spec: dict[str, Any]
    tenant_id: int
    kind: JobKind = JobKind.train


def spec_hash(spec: dict[str, Any]) -> str:
    """sha256 of the spec's canonical JSON (sorted keys, no spaces): the idempotency body."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _lease_now(s: Session) -> Any:
    """"Now" for lease times: the database's clock on PostgreSQL, so that a worker whose clock
    drifts cannot make its lease look longer or shorter to the reaper (every lease time is
    written and compared by the one server). SQLite has no server: it is one machine's clock."""
    if s.get_bind().dialect.name == "postgresql":
        return func.now()
    return utcnow()


def _record_event(s: Session, job_id: str, type_: EventType, data: dict[str, Any]) -> JobEvent:
    """Every job event is written here: with it, in the same transaction, the webhook
    deliveries it causes (store.webhooks), so a committed event is never lost to them."""
    event = JobEvent(job_id=job_id, type=type_, data=data)
    s.add(event)
    webhooks.enqueue_for_event(s, job_id, type_.value, data)
    return event


def _event(s: Session, job_id: str, type_: EventType, **data: Any) -> JobEvent:
    return _record_event(s, job_id, type_, data)


# --------------------------------------------------------------------------- API side


def create_job(
    s: Session,
    tenant_id: int,
    spec: dict[str, Any],
    total_steps: int,
    name: str,
    idempotency_key: str | None = None,
    kind: JobKind = JobKind.train,
    client_meta: dict[str, Any] | None = None,
    parent_job_id: str | None = None,
) -> tuple[Job, bool]:
    """Insert a queued job (with a `created` event); returns (job, created).

    With an idempotency key, a retry with the same spec returns the first job (created False)
    and one with a different spec raises IdempotencyConflict. Two racing first requests are
    settled by the unique (tenant_id, idempotency_key) constraint: the loser's transaction is
    rolled back and it answers like a retry. `kind` probe: a pass@k probe (id `prb_...`).
    `client_meta`: what an OpenAI-shaped request said beyond the spec (api/openai); it is part
    of the idempotency body, so a retry with other metadata is a conflict, not a replay.
    `parent_job_id`: the job whose checkpoint it continues (spec.continue_from).
    """
    hashed = spec if client_meta is None else {"spec": spec, "client_meta": client_meta}
    request_hash = spec_hash(hashed) if idempotency_key else None
    if idempotency_key:
        existing = _job_by_key(s, tenant_id, idempotency_key)
        if existing is not None:
            return _replay(existing, request_hash), False
    job = Job(
        id=new_id(kind), kind=JobKind(kind), tenant_id=tenant_id, name=name, spec=spec,
        status=JobStatus.queued,
        total_steps=total_steps, idempotency_key=idempotency_key, request_hash=request_hash,
        client_meta=client_meta, parent_job_id=parent_job_id,
    )
    s.add(job)
    try:
        s.flush()
    except IntegrityError:
        if not idempotency_key:
            raise
        s.rollback()
        existing = _job_by_key(s, tenant_id, idempotency_key)
        if existing is None:
            raise
        return _replay(existing, request_hash), False
    _event(s, job.id, EventType.created, name=name, total_steps=total_steps)
    s.flush()
    return job, True


def _job_by_key(s: Session, tenant_id: int, key: str) -> Job | None:
    query = select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key)
    return s.scalar(query.execution_options(**_FRESH))


def _replay(existing: Job, request_hash: str | None) -> Job:
    if existing.request_hash != request_hash:
        raise IdempotencyConflict(
            f"Idempotency-Key was already used for job {existing.id} with a different body")
    return existing


def request_cancel(s: Session, tenant_id: int, job_id: str, kind: JobKind = JobKind.train) -> Job:
    """Cancel a job: queued or paused -> cancelled now; running -> cancel_requested (the worker stops at
    its next step); finished -> InvalidTransition naming the state; unknown -> NotFound.

    Each branch is a compare-and-set; if a worker claims the job between our read and our
    write, the queued branch matches nothing and we retry as running.
    """
    job = get_job(s, tenant_id, job_id, kind)
    noun = "job" if kind == JobKind.train else kind.value  # the word the caller's route uses
    if job is None:
        raise NotFound(f"{noun} {job_id} not found")
    for _ in range(3):
        now = utcnow()
        if job.status in (JobStatus.queued, JobStatus.paused):  # no worker holds it
            done = _cas(s, job_id, job.status, status=JobStatus.cancelled,
                        cancel_requested=True, finished_at=now, updated_at=now)
            if done:
                _event(s, job_id, EventType.cancel_requested)
                _event(s, job_id, EventType.cancelled,
                       reason=f"cancelled while {job.status.value}")
        elif job.status == JobStatus.running:
            done = _ask_running(s, job, "cancel_requested", EventType.cancel_requested, now)
        else:
            raise InvalidTransition(job.status, f"cannot cancel {noun} {job_id}: it is already "
                                                f"{job.status.value}")
        s.flush()
        s.refresh(job)
        if done:
            return job
    raise InvalidTransition(job.status, f"{noun} {job_id} changed state during cancel; retry")


def _ask_running(s: Session, job: Job, flag: str, event: EventType, now) -> bool:
    """Set a running job's request flag (cancel_requested, pause_requested); True once it is
    set. Only the request that flips it logs `event`: concurrent requests for one job write
    one event (the others' compare-and-set misses)."""
    column = getattr(Job, flag)
    first = not getattr(job, flag) and s.execute(
        update(Job).where(Job.id == job.id, Job.status == JobStatus.running, column.is_(False))
        .values({flag: True, "updated_at": now}).execution_options(**_NO_SYNC)
    ).rowcount == 1
    if first:
        _event(s, job.id, event, attempt=job.attempt)
    return getattr(job, flag) or first


def _cas(s: Session, job_id: str, expected: JobStatus, **values: Any) -> bool:
    stmt = update(Job).where(Job.id == job_id, Job.status == expected).values(**values)
    return s.execute(stmt.execution_options(**_NO_SYNC)).rowcount == 1


# --------------------------------------------------------------------------- worker side


def claim(s: Session, job_id: str, worker_id: str, lease_seconds: float) -> Claim | None:
    """Atomically move a queued job to running under a new attempt and a lease. Commits.

    Returns None when the job is not queued: a duplicate delivery, a cancelled job, a job
    another worker already holds. That single UPDATE ... WHERE status='queued' RETURNING is
    the whole race: exactly one caller gets a row back.
    """
    now, lease_now = utcnow(), _lease_now(s)
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(
            status=JobStatus.running,
            attempt=Job.attempt + 1,
            lease_owner=worker_id,
            lease_expires_at=lease_now + timedelta(seconds=lease_seconds),
            heartbeat_at=lease_now,
            started_at=func.coalesce(Job.started_at, literal(now, UTCDateTime())),
            updated_at=now,
        )
        .returning(Job.attempt, Job.spec, Job.tenant_id, Job.kind)
        .execution_options(**_NO_SYNC)
    )
    row = s.execute(stmt).one_or_none()
    if row is None:
        s.rollback()
        return None
    # No worker id in the event: it is hostname-PID, an internal the tenant must not see
    # (the lease_owner column keeps it for operators).
    _event(s, job_id, EventType.started, attempt=row.attempt)
    s.commit()
    return Claim(job_id=job_id, attempt=row.attempt, spec=row.spec, tenant_id=row.tenant_id,
                 kind=JobKind(row.kind))


def _fenced_update(s: Session, job_id: str, attempt: int, **values: Any) -> bool:
    """UPDATE the job only if it is running under `attempt`; raise Fenced otherwise.

    Returns cancel_requested. On Postgres the UPDATE also row-locks the job until the caller
    commits, so a reaper cannot requeue it in the middle of the write it guards.
    """
    values.setdefault("updated_at", utcnow())
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.running, Job.attempt == attempt)
        .values(**values)
        .returning(Job.cancel_requested)
        .execution_options(**_NO_SYNC)
    )
    row = s.execute(stmt).one_or_none()
    if row is None:
        raise Fenced(job_id, attempt)
    return bool(row.cancel_requested)


def heartbeat(s: Session, job_id: str, attempt: int, lease_seconds: float) -> bool:
    """Renew the lease; returns whether a cancel was requested. Raises Fenced."""
    now = _lease_now(s)
    return _fenced_update(s, job_id, attempt, heartbeat_at=now,
                          lease_expires_at=now + timedelta(seconds=lease_seconds))


def _upsert(s: Session, model: type, conflict: list[str], row: dict[str, Any]) -> None:
    """INSERT ... ON CONFLICT (conflict) DO UPDATE: a step re-run after resume replaces the
    first run's row instead of tripping the unique constraint."""
    dialect = s.get_bind().dialect.name
    insert = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}[dialect]
    stmt = insert(model).values(**row)
    update_cols = {k: stmt.excluded[k] for k in row if k not in conflict}
    s.execute(stmt.on_conflict_do_update(index_elements=conflict, set_=update_cols))


def record_metrics(
    s: Session, job_id: str, attempt: int, step: int, values: dict[str, Any]
) -> None:
    """Store one step's metrics (replacing an earlier row for that step) and advance jobs.step."""
    _fenced_update(s, job_id, attempt, step=step)
    _upsert(s, Metric, ["job_id", "step"],
            {"job_id": job_id, "step": step, "values": values, "created_at": utcnow()})


def record_progress(s: Session, job_id: str, attempt: int, done: int, total: int,
                    data: dict[str, Any] | None = None) -> bool:
    """A probe's progress: `step`/`total_steps` become samples done / total, with a `progress`
    event. Fenced; returns whether a cancel was requested (a progress write is a heartbeat's
    reading of the flag too)."""
    cancel = _fenced_update(s, job_id, attempt, step=done, total_steps=total)
    _event(s, job_id, EventType.progress, done=done, total=total, attempt=attempt, **(data or {}))
    return cancel


def record_result(s: Session, job_id: str, attempt: int, result: dict[str, Any]) -> None:
    """Store a probe's result. Fenced: an attempt that lost the job writes nothing, so a probe
    retried after a dead worker ends with the one result of the attempt that finished."""
    _fenced_update(s, job_id, attempt, result=result)


def record_samples(s: Session, job_id: str, attempt: int, step: int, rows: list[dict[str, Any]],
                   max_job_bytes: int) -> int:
    """Store a step's samples (replacing a re-run step's), fenced, within the job's byte cap;
    returns how many were stored (fewer, or none, once the cap is reached). A multi-turn
    sample's transcript counts against the cap too (`store.sample_rows`)."""
    _fenced_update(s, job_id, attempt)
    s.execute(delete(JobSample).where(JobSample.job_id == job_id, JobSample.step == step))
    used = s.scalar(select(func.coalesce(func.sum(JobSample.bytes), 0)).where(JobSample.job_id == job_id))
    stored = 0
    for idx, row in enumerate(rows):
        fields = sample_rows.stored_fields(row)
        if used + fields["bytes"] > max_job_bytes:
            break
        used += fields["bytes"]
        s.add(JobSample(job_id=job_id, step=step, idx=idx, reward=row["reward"], correct=row["correct"],
                        truncated=row["truncated"], advantage=row["advantage"],
                        sub_rewards=row.get("sub_rewards") or {}, created_at=utcnow(), **fields))
        stored += 1
    return stored


def add_event(
    s: Session,
    job_id: str,
    type: EventType | str,
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
) -> JobEvent:
    """Append an event; with `attempt` it is fenced like every other worker write."""
    extra = {}
    if EventType(type) == EventType.warning:  # also the job's status line (JobPublic.warning)
        extra["warning"] = str((data or {}).get("message", ""))[:2000]
    if attempt is not None:
        _fenced_update(s, job_id, attempt, **extra)
    elif extra:
        s.execute(update(Job).where(Job.id == job_id).values(**extra).execution_options(**_NO_SYNC))
    event = _record_event(s, job_id, EventType(type), dict(data or {}))
    s.flush()
    return event


def record_checkpoint(
    s: Session, job_id: str, attempt: int, step: int, uri: str, nbytes: int, sha256: str,
    keep_last: int | None = None,
) -> list[str]:
    """Register a saved checkpoint folder (replacing one at the same step) and log it.

    With `keep_last`, the rows of all but the newest `keep_last` checkpoints are deleted too.
    Returns the uris no longer recorded (those rows, and the folder a same-step row pointed
    at): the caller deletes those folders after committing, so a listed checkpoint always
    has its files and no file outlives its row.
    """
    _fenced_update(s, job_id, attempt)
    replaced = s.scalar(select(Checkpoint.uri).where(Checkpoint.job_id == job_id,
                                                      Checkpoint.step == step))
    _upsert(s, Checkpoint, ["job_id", "step"], {
        "job_id": job_id, "step": step, "uri": uri, "bytes": nbytes, "sha256": sha256,
        "created_at": utcnow(),
    })
    # No path in the event: events are shown to users, the uri is the server's business.
    _event(s, job_id, EventType.checkpoint_saved, step=step, bytes=nbytes, sha256=sha256,
           attempt=attempt)
    gone = [replaced] if replaced and replaced != uri else []
    if keep_last is not None:
        kept = select(Checkpoint.step).where(Checkpoint.job_id == job_id) \
            .order_by(Checkpoint.step.desc()).limit(keep_last)
        old = s.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id,
                                                 Checkpoint.step.not_in(kept))
                        .returning(Checkpoint.uri).execution_options(**_NO_SYNC)).scalars().all()
        gone += [u for u in old if u != uri]
    return gone


def finish(
    s: Session, job_id: str, attempt: int, status: JobStatus | str, error: str | None = None,
    data: dict[str, Any] | None = None,
) -> JobStatus:
    """End the attempt with succeeded | failed | cancelled, log it and drop the lease.

    A run that succeeds after a cancel was requested ends `cancelled`: the user asked for it
    to stop, and the last step racing the cancel must not turn that into a success. Returns
    the status written. `data` is merged into the terminal event (e.g. the error's message).
    """
    status = JobStatus(status)
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"finish() needs a final status, got {status.value}")
    now = utcnow()
    # The first fenced UPDATE row-locks the job (Postgres) so the flag read cannot go stale.
    if status == JobStatus.succeeded and _fenced_update(s, job_id, attempt):
        status = JobStatus.cancelled
    _fenced_update(s, job_id, attempt, status=status, error=error, finished_at=now,
                   lease_owner=None, lease_expires_at=None)
    payload: dict[str, Any] = {**(data or {}), "attempt": attempt}
    if error is not None:
        payload["error"] = error
    _event(s, job_id, EventType(status.value), **payload)
    return status


def retry_or_fail(s: Session, job_id: str, attempt: int, error: str) -> bool:
    """End an attempt that a fault of the machine stopped (a rank died), not one of the job.

    Below spec.limits.max_attempts the job goes back to queued with its lease released (event
    `retried`, as the reaper writes, carrying the error) and True is returned: the caller
    commits, then enqueues it again. At the limit it fails with `error` (False); a job whose
    cancel was requested is cancelled instead (False). Fenced like `finish`: raises Fenced
    when `attempt` no longer owns the job. `attempt` stays: the next claim bumps it.
    """
    # The first fenced UPDATE row-locks the job (Postgres): nobody moves it under us.
    cancel_requested = _fenced_update(s, job_id, attempt)
    if cancel_requested:
        finish(s, job_id, attempt, JobStatus.cancelled, data={"reason": error})
        return False
    spec = s.scalar(select(Job.spec).where(Job.id == job_id))
    if attempt >= spec_max_attempts(spec):
        finish(s, job_id, attempt, JobStatus.failed, error=error)
        return False
    _fenced_update(s, job_id, attempt, status=JobStatus.queued, lease_owner=None,
                   lease_expires_at=None)
    _event(s, job_id, EventType.retried, attempt=attempt, reason="machine fault", error=error)
    return True


def stale_queued(s: Session, older_than_seconds: float, now: datetime | None = None) -> list[str]:
    """Queued jobs untouched for `older_than_seconds`; their updated_at is bumped so that each
    is returned once per period. The caller commits, then enqueues them again."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=older_than_seconds)
    rows = s.execute(
        update(Job).where(Job.status == JobStatus.queued, Job.updated_at < cutoff)
        .values(updated_at=now).returning(Job.id)
    ).scalars().all()
    return sorted(rows)


def reap_expired(s: Session, now: datetime | None = None) -> list[str]:
    """Recover running jobs whose lease ran out (their worker died or hung).

    Below spec.limits.max_attempts the job goes back to queued (event `retried`) and its id is
    returned for the caller to re-enqueue after committing; at the limit it fails. A job whose
    cancel was requested is cancelled instead. Each change is a compare-and-set on
    (status, attempt, lease, cancel flag), so two reapers, a heartbeat that just renewed, or a
    cancel landing between our read and our write cannot be overwritten: a cancel that lands
    mid-reap makes the guard miss, and the job is read again and cancelled, never requeued.
    `now` defaults to the database's clock on PostgreSQL (see `_lease_now`).
    """
    clock = now if now is not None else _lease_now(s)
    expired = s.execute(
        select(Job.id).where(Job.status == JobStatus.running, Job.lease_expires_at < clock)
        .order_by(Job.id)
    ).scalars().all()
    requeued: list[str] = []
    for job_id in expired:
        for _ in range(3):  # a miss means the row changed under us: look again
            outcome = _reap_one(s, job_id, clock)
            if outcome is not None:
                if outcome == EventType.retried:
                    requeued.append(job_id)
                break
    s.flush()
    return requeued


def _reap_one(s: Session, job_id: str, clock: Any) -> EventType | str | None:
    """One compare-and-set for one expired job: its event type, "" if nothing is left to
    reap (renewed, finished), None if it changed between the read and the write."""
    row = s.execute(
        select(Job.attempt, Job.spec, Job.cancel_requested)
        .where(Job.id == job_id, Job.status == JobStatus.running, Job.lease_expires_at < clock)
        .execution_options(**_FRESH)
    ).one_or_none()
    if row is None:
        return ""
    attempt, spec, cancel_requested = row
    now = utcnow()
    guard = update(Job).where(
        Job.id == job_id, Job.status == JobStatus.running, Job.attempt == attempt,
        Job.lease_expires_at < clock, Job.cancel_requested == cancel_requested,
    ).execution_options(**_NO_SYNC)
    release = {"lease_owner": None, "lease_expires_at": None, "updated_at": now}
    if cancel_requested:
        values, event, data = ({"status": JobStatus.cancelled, "finished_at": now},
                               EventType.cancelled, {"reason": "lease expired"})
    elif attempt < spec_max_attempts(spec):
        values, event, data = ({"status": JobStatus.queued}, EventType.retried,
                               {"reason": "lease expired"})
    else:
        error = f"lease expired after {attempt} attempts"
        values, event, data = ({"status": JobStatus.failed, "finished_at": now,
                                "error": error}, EventType.failed, {"error": error})
    if s.execute(guard.values(**values, **release)).rowcount != 1:
        return None
    _event(s, job_id, event, attempt=attempt, **data)
    return event
