"""`/v1/fine_tuning/jobs`: OpenAI's fine-tuning jobs API over this service's jobs.

Create maps the request onto a JobSpec (api/openai/mapping.py) and goes through the native
creation path (`api.submission.submit_job`: the same checks, job quota, Idempotency-Key and
enqueue), so a job made here is a job of `GET /v1/jobs` and the other way round. Retrieve,
list (`after`, `limit`), cancel, pause, resume, events and checkpoints read and move the same
rows; answers are OpenAI's objects (api/openai/objects.py), errors OpenAI's shape.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from store import datasets, job_pause, jobs
from store.tables import Job

from api.deps import EnqueueDep, SessionDep, SettingsDep, TenantDep
from api.errors import ApiError
from api.openai.errors import OpenAIError, OpenAIRoute, bad_request
from api.openai.mapping import JobCreate, build_spec, check_text, request_field
from api.openai.objects import (
    CHECKPOINT_NAME, CHECKPOINT_PREFIX, EVENT_PREFIX, checkpoint_object, cursor_int,
    event_object, job_object)
from api.submission import IdempotencyKey, job_or_404, resume_job, submit_job

router = APIRouter(prefix="/fine_tuning", tags=["openai: fine-tuning"], route_class=OpenAIRoute)

Limit = Annotated[int, Query(ge=1, le=100)]
After = Annotated[str | None, Query(max_length=100)]


def _job(session: Session, job: Job) -> dict[str, Any]:
    return job_object(job, jobs.latest_checkpoint(session, job.id))


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "has_more": has_more}


@router.post("/jobs", status_code=status.HTTP_200_OK)
def create_job(body: JobCreate, session: SessionDep, settings: SettingsDep, tenant: TenantDep,
               enqueue: EnqueueDep, request: Request, response: Response,
               idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    """Create a reinforcement fine-tuning job (OpenAI answers 200, and so does this)."""
    check_text(body)
    training = datasets.get_dataset(session, tenant.id, body.training_file)
    if training is None:
        raise OpenAIError(404, f"training_file: no file {body.training_file!r} (upload it with "
                               f"purpose fine-tune first)", param="training_file", code="not_found")
    if body.validation_file is not None:
        validation = datasets.get_dataset(session, tenant.id, body.validation_file)
        if validation is None:
            raise OpenAIError(404, f"validation_file: no file {body.validation_file!r}",
                              param="validation_file", code="not_found")
    spec, meta = build_spec(body, training.rows)
    try:
        job, _created = submit_job(spec, session, settings, tenant.id, enqueue, request,
                                   idempotency_key, client_meta=meta)
    except ApiError as exc:  # a spec field of the native check -> the request field
        if exc.field is None or exc.status_code != 422:
            raise
        field = request_field(exc.field, body.brorl)
        message = exc.message.removeprefix(f"{exc.field}: ")
        raise bad_request(field, message) from None
    return _job(session, job)


@router.get("/jobs")
def list_jobs(session: SessionDep, tenant: TenantDep, limit: Limit = 20,
              after: After = None) -> dict[str, Any]:
    """The caller's jobs, newest first (native ones too); `after` is the previous page's last id."""
    rows, has_more = jobs.list_jobs(session, tenant.id, limit=limit, after=after)
    return _page([_job(session, j) for j in rows], has_more)


@router.get("/jobs/{job_id}")
def retrieve_job(job_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return _job(session, job_or_404(session, tenant.id, job_id))


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    """Queued or paused: cancelled at once; running: stops at its next step."""
    job = jobs.request_cancel(session, tenant.id, job_id)
    session.commit()
    return _job(session, job)


@router.post("/jobs/{job_id}/pause")
def pause_job(job_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    """Queued: paused at once; running: stops as for a cancel, keeping its checkpoints."""
    job = job_pause.request_pause(session, tenant.id, job_id)
    session.commit()
    return _job(session, job)


@router.post("/jobs/{job_id}/resume")
def resume(job_id: str, session: SessionDep, settings: SettingsDep, tenant: TenantDep,
           enqueue: EnqueueDep) -> dict[str, Any]:
    """A paused job is queued again and resumes from its latest checkpoint."""
    return _job(session, resume_job(session, settings, tenant.id, job_id, enqueue))


def _cursor(after: str | None, prefix: str, what: str) -> int | None:
    """The row id an `after` cursor names; a 400 naming `after` for anything else."""
    cursor = cursor_int(after, prefix)
    if after is not None and cursor is None:
        raise bad_request("after", f"not {what} id of this API ({prefix}<n>)")
    return cursor


@router.get("/jobs/{job_id}/events")
def list_events(job_id: str, session: SessionDep, tenant: TenantDep, limit: Limit = 20,
                after: After = None) -> dict[str, Any]:
    """The job's events, newest first (OpenAI's order); `after` is the previous page's last id."""
    job_or_404(session, tenant.id, job_id)
    cursor = _cursor(after, EVENT_PREFIX, "an event")
    rows = jobs.list_events(session, tenant.id, job_id, after=cursor, limit=limit + 1,
                            newest_first=True)
    return _page([event_object(e) for e in rows[:limit]], len(rows) > limit)


@router.get("/jobs/{job_id}/checkpoints")
def list_checkpoints(job_id: str, session: SessionDep, tenant: TenantDep, limit: Limit = 10,
                     after: After = None) -> dict[str, Any]:
    """The job's kept checkpoints, newest first, each with its step's metrics."""
    job_or_404(session, tenant.id, job_id)
    cursor = _cursor(after, CHECKPOINT_PREFIX, "a checkpoint")
    rows = jobs.list_checkpoints(session, tenant.id, job_id, after=cursor, limit=limit + 1,
                                 newest_first=True)[: limit + 1]
    page = rows[:limit]
    metrics: dict[int, dict[str, Any]] = {}
    if page:
        low = min(c.step for c in page)
        for m in jobs.list_metrics(session, tenant.id, job_id, after_step=low - 1,
                                   limit=max(c.step for c in page) - low + 1):
            metrics[m.step] = m.values
    return _page([checkpoint_object(c, metrics.get(c.step)) for c in page], len(rows) > limit)


@router.get("/checkpoints/{name}/download", response_class=RedirectResponse,
            status_code=status.HTTP_307_TEMPORARY_REDIRECT)
def download(name: str, request: Request, session: SessionDep, tenant: TenantDep) -> Response:
    """A `fine_tuned_model` or `fine_tuned_model_checkpoint` name -> its archive (a redirect to
    the native download, which streams the tar; `?variant=merged` passes through for LoRA)."""
    match = CHECKPOINT_NAME.match(name)
    if match is None:
        raise bad_request("name", "not a model name of this service (ft:<job id>:step-<N>)")
    job_id, step = match["job"], int(match["step"])
    if jobs.get_checkpoint(session, tenant.id, job_id, step) is None:
        raise OpenAIError(404, f"model {name} not found", param="name", code="not_found")
    url = f"/v1/jobs/{job_id}/checkpoints/{step}/download"
    if request.url.query:
        url += f"?{request.url.query}"
    return RedirectResponse(url, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
