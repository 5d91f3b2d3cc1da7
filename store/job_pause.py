"""Pausing and resuming a job: running -> (pause requested) -> paused -> queued again.

A pause is a stop that keeps the job: the API sets `pause_requested` on a running job (a
queued one, which no worker holds, is paused at once); the worker reads the flag with its
heartbeat, stops as it does for a cancel (within the current step, which a resume redoes,
or between two, when the trainer saves a checkpoint on its way out) and writes `paused`
with its lease released (`pause_attempt`). Resuming moves a paused job back to queued; the
caller commits and enqueues it, and the next claim resumes from the job's latest checkpoint
(`worker.training_job`), as a retried job does.
Every transition is a compare-and-set, as in store.jobs, and the same functions serve the
native routes and the OpenAI-shaped ones.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.errors import InvalidTransition, NotFound
from store.jobs import _NO_SYNC, _ask_running, _cas, _event, _fenced_update, get_job
from store.tables import EventType, Job, JobStatus, utcnow


def request_pause(s: Session, tenant_id: int, job_id: str) -> Job:
    """queued -> paused now; running -> pause_requested (the worker pauses it at its next
    step); paused -> unchanged; finished -> InvalidTransition; unknown -> NotFound."""
    job = get_job(s, tenant_id, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    for _ in range(3):  # a miss means a worker claimed or finished it meanwhile: look again
        now = utcnow()
        if job.status == JobStatus.paused:
            return job
        if job.status == JobStatus.queued:
            done = _cas(s, job_id, JobStatus.queued, status=JobStatus.paused, updated_at=now)
            if done:
                _event(s, job_id, EventType.paused, reason="paused while queued")
        elif job.status == JobStatus.running:
            if job.cancel_requested:
                raise InvalidTransition(job.status, f"cannot pause job {job_id}: it is being "
                                                    f"cancelled")
            done = _ask_running(s, job, "pause_requested", EventType.pause_requested, now)
        else:
            raise InvalidTransition(job.status, f"cannot pause job {job_id}: it is already "
                                                f"{job.status.value}")
        s.flush()
        s.refresh(job)
        if done:
            return job
    raise InvalidTransition(job.status, f"job {job_id} changed state during pause; retry")


def resume(s: Session, tenant_id: int, job_id: str) -> Job:
    """paused -> queued (the caller commits, then enqueues it); a running job whose pause was
    asked for and not yet done has the request withdrawn; anything else -> InvalidTransition."""
    job = get_job(s, tenant_id, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    now = utcnow()
    if job.status == JobStatus.paused and _cas(
            s, job_id, JobStatus.paused, status=JobStatus.queued, pause_requested=False,
            updated_at=now):
        _event(s, job_id, EventType.resumed)
    elif job.status == JobStatus.running and job.pause_requested:
        s.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.running)
                  .values(pause_requested=False, updated_at=now).execution_options(**_NO_SYNC))
        _event(s, job_id, EventType.resumed, reason="pause withdrawn before it took effect")
    else:
        raise InvalidTransition(job.status, f"cannot resume job {job_id}: it is "
                                            f"{job.status.value}, not paused")
    s.flush()
    s.refresh(job)
    return job


def pause_requested(s: Session, job_id: str) -> bool:
    """Whether a pause was asked for (the worker's heartbeat reads it beside the cancel flag)."""
    return bool(s.scalar(select(Job.pause_requested).where(Job.id == job_id)))


def pause_attempt(s: Session, job_id: str, attempt: int) -> None:
    """Worker side: end the attempt as `paused`, releasing the lease. Fenced (raises Fenced
    when `attempt` no longer owns the job); the caller commits."""
    _fenced_update(s, job_id, attempt, status=JobStatus.paused, pause_requested=False,
                   lease_owner=None, lease_expires_at=None)
    _event(s, job_id, EventType.paused, attempt=attempt)
