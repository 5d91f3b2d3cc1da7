"""Jobs: create (with Idempotency-Key), list, show, cancel, pause, resume.

Creating a job is: validate the spec (FastAPI does it against `JobSpec`; the dataset's owner
and the GPU count are checked here, and a reasoning-gym config must build a few examples within
the limits of `api.task_check`), insert the row, COMMIT, and only then enqueue the id by
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
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status
from sqlalchemy.orm import Session

from store import datasets, job_pause, jobs
from store.errors import NotFound
from store.tables import Dataset, Job, JobStatus
from store.model_paths import model_path_problem
from store.settings import Settings
from trainer.graders.schemas import parse_grader
from trainer.spec import FieldError, JobSpec

from api.deps import Enqueue, EnqueueDep, SessionDep, SettingsDep, TenantDep
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


def submit_job(spec: JobSpec, session: Session, settings: Settings, tenant_id: int,
               enqueue: Enqueue, request: Request, idempotency_key: str | None = None,
               client_meta: dict[str, Any] | None = None) -> tuple[Job, bool]:
    """Check, insert, commit and enqueue a job; returns (job, created). The one creation path
    of the native route and the OpenAI-shaped one (api/openai/jobs.py): the same checks,
    quota, idempotency and enqueue. `client_meta` is stored beside the spec (store.jobs)."""
    if (problem := model_path_problem(spec.model.path, settings)) is not None:
        raise field_error("model.path", problem)  # the worker checks the same rule again
    request.app.state.task_check.check(spec)
    gpus = spec.resources.gpus_per_node
    if gpus not in settings.gpu_counts:
        # Each GPU count has its own queue; a count no worker serves would wait there for ever.
        served = ", ".join(map(str, settings.gpu_counts))
        raise field_error("resources.gpus_per_node", f"{gpus} GPUs asked; this deployment's "
                          f"workers serve {served} (BRORL_GPU_COUNTS)")
    over_quota = job_quota_error(session, settings, tenant_id)
    dataset = spec.task.dataset
    stored = None if dataset is None else datasets.get_dataset(session, tenant_id, dataset.id)
    if dataset is not None and stored is None:
        raise field_error("task.dataset.id", f"no dataset {dataset.id!r} (upload it first)")
    check_reward(spec, stored, settings)
    job, created = jobs.create_job(
        session, tenant_id, spec.model_dump(mode="json"), total_steps=spec.total_steps,
        name=spec.name, idempotency_key=idempotency_key, client_meta=client_meta)
    if created and over_quota is not None:  # a replay of an existing job still answers
        session.rollback()
        raise over_quota
    session.commit()
    if created:
        try:
            enqueue(job.id, gpus=gpus)
        except Exception:  # the job is committed and stays queued; requeue recovers it
            log.exception("job %s created but could not be enqueued; it stays queued", job.id)
    return job, created


def resume_job(session: Session, settings: Settings, tenant_id: int, job_id: str,
               enqueue: Enqueue) -> Job:
    """paused -> queued, committed, then enqueued (store.job_pause); a resumed job needs a
    free job slot like a new one (a paused job does not hold one)."""
    job = job_or_404(session, tenant_id, job_id)
    if job.status == JobStatus.paused and (over := job_quota_error(session, settings, tenant_id)):
        raise over
    job = job_pause.resume(session, tenant_id, job_id)
    session.commit()
    if job.status == JobStatus.queued:
        try:
            enqueue(job.id, gpus=jobs.job_gpus(session, [job.id]).get(job.id, 1))
        except Exception:  # it stays queued; requeue recovers it
            log.exception("job %s resumed but could not be enqueued; it stays queued", job.id)
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
    job, created = submit_job(spec, session, settings, tenant.id, enqueue, request,
                              idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    return JobPublic.model_validate(job)


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
