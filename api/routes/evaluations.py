"""Evaluations: a job's checkpoints (and its base) on held-out prompts, pass@k with intervals.

An evaluation is a job row of kind `evaluation` (store.evaluations), queued, claimed, leased,
cancelled and reaped like a training job, by the same worker. Creating one
(`POST /v1/jobs/{id}/evaluations`) is: validate the `EvaluationSpec` body; the evaluated job
must be the caller's (another tenant's is a 404, as a made-up id); its checkpoints
(steps, "latest", "best") are resolved to stored steps (a 422 naming `checkpoints` otherwise);
a task given is checked like a job's (its dataset the caller's, its reward runnable); the job
quota counts it; insert (idempotent by the request: a replay after the job saved another
checkpoint still returns the first evaluation), COMMIT, then enqueue. An evaluation's id is a
404 under /v1/jobs and /v1/probes, and theirs here.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import Field, ValidationError

from store import evaluations, jobs
from store.errors import NotFound
from store.tables import Job, JobKind, JobStatus
from trainer.evaluation_spec import EvaluationSpec
from trainer.spec import FieldError, JobSpec, spec_errors

from api.deps import EnqueueDep, SessionDep, SettingsDep, TenantDep
from api.errors import field_error
from api.quotas import job_quota_error
from api.schemas import EventPublic, JobSummary, ListPublic
from api.submission import IdempotencyKey, _insert_then_enqueue, check_reward, job_or_404, owned_dataset

router = APIRouter(tags=["evaluations"])


class EvaluationSummary(JobSummary):
    object: Literal["evaluation"] = "evaluation"  # type: ignore[assignment]
    step: int = Field(description="Samples generated so far, over all its models.")
    total_steps: int = Field(description="Samples to generate: models x prompts x n.")
    job_id: str | None = Field(None, description="The evaluated job.")
    checkpoints: list[int] = Field(default_factory=list, description="The steps evaluated.")
    base: bool = Field(True, description="Whether the base model is evaluated too.")


class EvaluationPublic(EvaluationSummary):
    spec: dict[str, Any] = Field(description="The evaluation as stored: steps picked (and why), "
                                             "the job's sampling settings filled in.")
    result: dict[str, Any] | None = Field(
        None, description="Once succeeded: per model its pass@k with 95 % intervals, the delta against "
                          "the base (paired interval), prompts gained / lost, and `best` (docs/evaluation.md).")


def _public(model: type[EvaluationSummary], row: Job) -> EvaluationSummary:
    spec = row.spec or {}
    return model.model_validate(row).model_copy(update={
        "job_id": row.parent_job_id, "checkpoints": [int(c) for c in spec.get("checkpoints", [])
                                                     if isinstance(c, int)],
        "base": bool(spec.get("base", True))})


def evaluation_or_404(session: SessionDep, tenant_id: int, evaluation_id: str) -> Job:
    row = jobs.get_job(session, tenant_id, evaluation_id, JobKind.evaluation)
    if row is None:
        raise NotFound(f"evaluation {evaluation_id} not found")
    return row


def _check_task(spec: EvaluationSpec, session: SessionDep, settings: SettingsDep, tenant_id: int,
                job_id: str, request: Request) -> None:
    """A task the request names is checked as a job's would be (the job's own passed already)."""
    if spec.task is None:
        return
    job = job_or_404(session, tenant_id, job_id)
    stored = owned_dataset(session, tenant_id, spec.task)
    check_reward(spec.task, stored, settings)
    try:
        with_task = JobSpec.model_validate({**job.spec, "task": spec.task.model_dump(mode="json")})
    except ValidationError as exc:  # e.g. a task the job's model or reward settings cannot run
        err = spec_errors(exc)[0]
        raise field_error(err["field"], err["message"]) from None
    request.app.state.task_check.check(with_task)  # a reasoning-gym config builds within limits


@router.post("/jobs/{job_id}/evaluations", status_code=status.HTTP_201_CREATED, response_model=EvaluationPublic,
             responses={200: {"model": EvaluationPublic, "description": "Replay of an Idempotency-Key."}})
def create_evaluation(job_id: str, spec: EvaluationSpec, session: SessionDep, settings: SettingsDep,
                      tenant: TenantDep, enqueue: EnqueueDep, request: Request, response: Response,
                      idempotency_key: IdempotencyKey = None) -> EvaluationPublic:
    """Queue an evaluation of this job's checkpoints (and its base); 201 with it."""
    job_or_404(session, tenant.id, job_id)
    if spec.job is not None and spec.job != job_id:
        raise field_error("job", f"the body names job {spec.job} but the URL {job_id}: leave it out")
    _check_task(spec, session, settings, tenant.id, job_id, request)
    over_quota = job_quota_error(session, settings, tenant.id)

    def insert() -> tuple[Job, bool]:
        try:
            return evaluations.create_evaluation(session, tenant.id, job_id, spec, idempotency_key)
        except FieldError as exc:
            raise field_error(exc.path, exc.message) from None

    row, created = _insert_then_enqueue(session, insert, over_quota, enqueue, 1)
    if not created:
        response.status_code = status.HTTP_200_OK
    return _public(EvaluationPublic, row)


@router.get("/jobs/{job_id}/evaluations", response_model=ListPublic[EvaluationPublic])
def list_job_evaluations(job_id: str, session: SessionDep, tenant: TenantDep,
                         limit: Annotated[int, Query(ge=1, le=50)] = 20) -> ListPublic[EvaluationPublic]:
    """This job's evaluations, newest first, with their results (the job page's table)."""
    job_or_404(session, tenant.id, job_id)
    rows = evaluations.list_for_job(session, tenant.id, job_id, limit + 1)
    return ListPublic[EvaluationPublic](data=[_public(EvaluationPublic, r) for r in rows[:limit]],
                                        has_more=len(rows) > limit)


@router.get("/evaluations", response_model=ListPublic[EvaluationSummary])
def list_evaluations(session: SessionDep, tenant: TenantDep,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20,
                     after: Annotated[str | None, Query(max_length=64)] = None,
                     status_: Annotated[JobStatus | None, Query(alias="status")] = None,
                     ) -> ListPublic[EvaluationSummary]:
    """The caller's evaluations of every job, newest first, without spec and result."""
    rows, has_more = jobs.list_jobs(session, tenant.id, limit=limit, after=after, status=status_,
                                    kind=JobKind.evaluation)
    return ListPublic[EvaluationSummary](data=[_public(EvaluationSummary, r) for r in rows], has_more=has_more)


@router.get("/evaluations/{evaluation_id}", response_model=EvaluationPublic)
def get_evaluation(evaluation_id: str, session: SessionDep, tenant: TenantDep) -> EvaluationPublic:
    return _public(EvaluationPublic, evaluation_or_404(session, tenant.id, evaluation_id))


@router.post("/evaluations/{evaluation_id}/cancel", response_model=EvaluationPublic)
def cancel_evaluation(evaluation_id: str, session: SessionDep, tenant: TenantDep) -> EvaluationPublic:
    """Queued: cancelled at once. Running: stops after its current generation chunk."""
    evaluation_or_404(session, tenant.id, evaluation_id)
    row = jobs.request_cancel(session, tenant.id, evaluation_id, JobKind.evaluation)
    session.commit()
    return _public(EvaluationPublic, row)


@router.get("/evaluations/{evaluation_id}/events", response_model=ListPublic[EventPublic])
def list_evaluation_events(evaluation_id: str, session: SessionDep, tenant: TenantDep,
                           after: Annotated[int | None, Query(ge=0)] = None,
                           limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> ListPublic[EventPublic]:
    """created, started, progress ({done, total} samples, model), retried, cancelled, failed, succeeded."""
    evaluation_or_404(session, tenant.id, evaluation_id)
    rows = jobs.list_events(session, tenant.id, evaluation_id, after=after, limit=limit + 1)
    return ListPublic[EventPublic](data=[EventPublic.model_validate(e) for e in rows[:limit]],
                                   has_more=len(rows) > limit)
