"""Jobs: create (with Idempotency-Key), list, show, cancel, pause, resume.

Creating a job: FastAPI validates the body against `JobSpec`, then `api.submission.submit_job`
runs the checks, inserts, commits and enqueues (the sequence every job row goes through). If
the broker is down the enqueue fails after the commit; the job then stays queued, the request
still answers 201 (the job exists, and the database is the truth), and the error is logged.

A dry run (`?dry_run=true`) runs the same checks (the job quota included: a dry run that a real
submission would refuse is refused the same way), stores and enqueues nothing, and answers 200
with the estimate (api/estimates.py).

Idempotency: a request repeating an earlier `Idempotency-Key` with the same body returns
that job with 200 (not 201: nothing was created, and clients can tell a replay apart); the
same key with another body is a 409. Replays do not enqueue again: the first request did.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse

from store import job_pause, jobs
from store.tables import JobStatus
from trainer.spec import JobSpec

from api.deps import EnqueueDep, SessionDep, SettingsDep, TenantDep
from api import continuation
from api.estimates import JobEstimate, estimate, progress_fields
from api.schemas import JobPublic, JobSummary, ListPublic
from api.submission import IdempotencyKey, check_job, job_or_404, resume_job, submit_job

log = logging.getLogger(__name__)

router = APIRouter(prefix="/jobs", tags=["jobs"])

@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=JobPublic,
    responses={200: {"model": JobPublic | JobEstimate, "description": "Replay of an "
                     "Idempotency-Key (the job), or with dry_run=true the estimate."},
               409: {"description": "Idempotency-Key reused with a different body."}},
)
def create_job(spec: JobSpec, session: SessionDep, settings: SettingsDep, tenant: TenantDep,
               enqueue: EnqueueDep, request: Request, response: Response,
               idempotency_key: IdempotencyKey = None,
               dry_run: Annotated[bool, Query(description="Check and estimate the spec; store "
                                               "and enqueue nothing.")] = False) -> JobPublic:
    """Submit a training job; 201 with the queued job (dry_run=true: 200 with its estimate)."""
    if dry_run:
        spec, _ = continuation.resolve(session, tenant.id, spec)  # as submit_job sees it
        over_quota, dataset = check_job(spec, session, settings, tenant.id, request)
        if over_quota is not None:  # a real submission of a new job would be refused
            raise over_quota
        found = estimate(spec, session, settings, dataset)
        session.rollback()  # read only: nothing of a dry run stays
        return JSONResponse(found.model_dump(mode="json"))  # type: ignore[return-value]
    job, created = submit_job(spec, session, settings, tenant.id, enqueue, request,
                              idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    return JobPublic.model_validate(job).model_copy(update=progress_fields(session, job))


@router.get("", response_model=ListPublic[JobSummary])
def list_jobs(
    session: SessionDep, tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64,
                                       description="The last job id of the previous page.")] = None,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
) -> ListPublic[JobSummary]:
    """The caller's jobs, newest first, without their specs (`GET /v1/jobs/{id}` has it)."""
    rows, has_more = jobs.list_jobs(session, tenant.id, limit=limit, after=after, status=status_)
    return ListPublic[JobSummary](data=[JobSummary.model_validate(j) for j in rows],
                                 has_more=has_more)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: str, session: SessionDep, tenant: TenantDep) -> JobPublic:
    """The job, with its place in the queue (queued) or its ETA (running)."""
    job = job_or_404(session, tenant.id, job_id)
    return JobPublic.model_validate(job).model_copy(update=progress_fields(session, job))


@router.post("/{job_id}/cancel", response_model=JobPublic,
             responses={409: {"description": "The job already finished; the message names its state."}})
def cancel_job(job_id: str, session: SessionDep, tenant: TenantDep) -> JobPublic:
    """Queued: cancelled at once. Running: `cancel_requested` (the worker stops at its next step)."""
    job = jobs.request_cancel(session, tenant.id, job_id)
    session.commit()
    return JobPublic.model_validate(job)


@router.post("/{job_id}/pause", response_model=JobPublic,
             responses={409: {"description": "The job already finished or is being cancelled."}})
def pause_job(job_id: str, session: SessionDep, tenant: TenantDep) -> JobPublic:
    """Queued: paused at once. Running: `pause_requested` (the worker stops as for a cancel,
    keeps its checkpoints, and the job becomes `paused`)."""
    job = job_pause.request_pause(session, tenant.id, job_id)
    session.commit()
    return JobPublic.model_validate(job)


@router.post("/{job_id}/resume", response_model=JobPublic,
             responses={409: {"description": "The job is not paused."}})
def resume_job_route(job_id: str, session: SessionDep, settings: SettingsDep, tenant: TenantDep,
                     enqueue: EnqueueDep) -> JobPublic:
    """A paused job is queued again and resumes from its latest checkpoint."""
    return JobPublic.model_validate(resume_job(session, settings, tenant.id, job_id, enqueue))
