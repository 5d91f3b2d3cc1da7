"""Jobs: create (with Idempotency-Key), list, show, cancel.

Creating a job is: validate the spec (FastAPI does it against `JobSpec`; the dataset's owner
and the GPU count are checked here, and a reasoning-gym config must build a few examples within
the limits of `api.task_probe`), insert the row, COMMIT, and only then enqueue the id by
task name on the queue of its GPU count. The
order matters: a worker that got the message before the commit would find no job. If the
broker is down the enqueue fails after the commit; the job then stays queued, the request
still answers 201 (the job exists, and the database is the truth), and the error is logged.
Such a job is picked up again by re-enqueueing queued jobs (the worker's reaper/requeue).

Idempotency: a request repeating an earlier `Idempotency-Key` with the same body returns
that job with 200 (not 201: nothing was created, and clients can tell a replay apart); the
same key with another body is a 409. Replays do not enqueue again: the first request did.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status
from sqlalchemy.orm import Session

from store import datasets, jobs
from store.errors import NotFound
from store.models import Dataset, Job, JobStatus
from store.model_paths import model_path_problem
from store.settings import Settings
from trainer.graders.models import parse_grader
from trainer.spec import FieldError, JobSpec

from api.deps import EnqueueDep, SessionDep, SettingsDep, TenantDep
from api.errors import field_error
from api.quotas import job_quota_error
from api.routes.graders import check_runnable
from api.schemas import JobPublic, JobSummary, ListPublic

log = logging.getLogger(__name__)

router = APIRouter(prefix="/jobs", tags=["jobs"])

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200,
           description="Retry-safe creation: the same key and body return the same job."),
]


def check_reward(spec: JobSpec, stored: Dataset | None, settings: Settings) -> None:
    """422 when the job's reward cannot run: a grader this server cannot run (a metric or a
    judge it lacks), or a dataset whose rows lack a field the grader or verifier reads."""
    from trainer.tasks.dataset_task import check_rows_for

    if spec.task.grader is not None:
        check_runnable(parse_grader(spec.task.grader), "task.grader")
    if stored is None:
        return
    try:
        with open(stored.uri, "rb") as fh:
            check_rows_for(fh, spec.task, settings.max_dataset_line_bytes)
    except FieldError as exc:
        raise field_error(exc.path, exc.message) from None
    except (OSError, ValueError) as exc:  # the stored file went missing or no longer parses
        raise field_error("task.dataset.id", f"dataset {stored.id} cannot be read: {exc}") from None


def job_or_404(session: Session, tenant_id: int, job_id: str) -> Job:
    """The caller's job; another tenant's job is as unknown as a made-up id."""
    job = jobs.get_job(session, tenant_id, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=JobPublic,
    responses={200: {"model": JobPublic, "description": "Replay of an Idempotency-Key."},
               409: {"description": "Idempotency-Key reused with a different body."}},
)
def create_job(spec: JobSpec, session: SessionDep, settings: SettingsDep, tenant: TenantDep,
               enqueue: EnqueueDep, request: Request, response: Response,
               idempotency_key: IdempotencyKey = None) -> JobPublic:
    """Submit a training job; 201 with the queued job."""
    if (problem := model_path_problem(spec.model.path, settings)) is not None:
        raise field_error("model.path", problem)  # the worker checks the same rule again
    request.app.state.task_probe.check(spec)
    gpus = spec.resources.gpus_per_node
    if gpus not in settings.gpu_counts:
        # Each GPU count has its own queue; a count no worker serves would wait there for ever.
        served = ", ".join(map(str, settings.gpu_counts))
        raise field_error("resources.gpus_per_node", f"{gpus} GPUs asked; this deployment's "
                          f"workers serve {served} (BRORL_GPU_COUNTS)")
    over_quota = job_quota_error(session, settings, tenant.id)
    dataset = spec.task.dataset
    stored = None if dataset is None else datasets.get_dataset(session, tenant.id, dataset.id)
    if dataset is not None and stored is None:
        raise field_error("task.dataset.id", f"no dataset {dataset.id!r} (upload it first)")
    check_reward(spec, stored, settings)
    job, created = jobs.create_job(
        session, tenant.id, spec.model_dump(mode="json"), total_steps=spec.total_steps,
        name=spec.name, idempotency_key=idempotency_key)
    if created and over_quota is not None:  # a replay of an existing job still answers
        session.rollback()
        raise over_quota
    session.commit()
    public = JobPublic.model_validate(job)
    if not created:
        response.status_code = status.HTTP_200_OK
        return public
    try:
        enqueue(job.id, gpus=gpus)
    except Exception:  # the job is committed and stays queued; requeue recovers it
        log.exception("job %s created but could not be enqueued; it stays queued", job.id)
    return public


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
    return JobPublic.model_validate(job_or_404(session, tenant.id, job_id))


@router.post("/{job_id}/cancel", response_model=JobPublic,
             responses={409: {"description": "The job already finished; the message names its state."}})
def cancel_job(job_id: str, session: SessionDep, tenant: TenantDep) -> JobPublic:
    """Queued: cancelled at once. Running: `cancel_requested` (the worker stops at its next step)."""
    job = jobs.request_cancel(session, tenant.id, job_id)
    session.commit()
    return JobPublic.model_validate(job)
