"""Probes: sample a model many times per eval prompt and read whether broad exploration pays.

A probe is a job row of kind `probe` (store.probes): created, queued, claimed, leased, fenced,
cancelled and reaped like a training job, on the same queue, by the same worker. Creating one
is: validate the `ProbeSpec` body, then `api.submission.submit_probe`: the checks a job gets,
`model: {job, step}` resolved to the caller's checkpoint (a 422 naming `model.job` /
`model.step` otherwise), insert, COMMIT, then enqueue, as `POST /v1/jobs` does. Another tenant's probe, and a
training job's id, are a 404 here (and a probe's id is a 404 under /v1/jobs).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import Field

from store import jobs
from store.tables import Job, JobKind, JobStatus
from trainer.probe_spec import ProbeSpec

from api.deps import EnqueueDep, SessionDep, SettingsDep, TenantDep
from api.schemas import EventPublic, JobSummary, ListPublic
from api.submission import IdempotencyKey, probe_or_404, submit_probe

router = APIRouter(prefix="/probes", tags=["probes"])


class ProbeSummary(JobSummary):
    object: Literal["probe"] = "probe"  # type: ignore[assignment]
    step: int = Field(description="Samples generated so far.")
    total_steps: int = Field(description="Samples to generate: n x prompts.")
    model: dict[str, Any] | None = Field(None, description="The probe's model: {path} or {job, step}.")


class ProbePublic(ProbeSummary):
    spec: dict[str, Any] = Field(description="The probe as stored (task filled in).")
    result: dict[str, Any] | None = Field(
        None, description="Once succeeded: per_prompt, pass_at_k (with its band), solvable_all_wrong, "
                          "timings and the recommendation (docs/probe.md).")


def _public(model: type[ProbeSummary], row: Job) -> ProbeSummary:
    return model.model_validate(row).model_copy(update={"model": (row.spec or {}).get("model")})


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ProbePublic,
             responses={200: {"model": ProbePublic, "description": "Replay of an Idempotency-Key."}})
def create_probe(spec: ProbeSpec, session: SessionDep, settings: SettingsDep, tenant: TenantDep,
                 enqueue: EnqueueDep, response: Response,
                 idempotency_key: IdempotencyKey = None,
                 ) -> ProbePublic:
    """Queue a probe; 201 with it. Its progress is in `step` / `total_steps` and its events."""
    row, created = submit_probe(spec, session, settings, tenant.id, enqueue, idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    return _public(ProbePublic, row)


@router.get("", response_model=ListPublic[ProbeSummary])
def list_probes(session: SessionDep, tenant: TenantDep,
                limit: Annotated[int, Query(ge=1, le=100)] = 20,
                after: Annotated[str | None, Query(max_length=64)] = None,
                status_: Annotated[JobStatus | None, Query(alias="status")] = None,
                ) -> ListPublic[ProbeSummary]:
    """The caller's probes, newest first, without spec and result."""
    rows, has_more = jobs.list_jobs(session, tenant.id, limit=limit, after=after, status=status_,
                                    kind=JobKind.probe)
    return ListPublic[ProbeSummary](data=[_public(ProbeSummary, r) for r in rows], has_more=has_more)


@router.get("/{probe_id}", response_model=ProbePublic)
def get_probe(probe_id: str, session: SessionDep, tenant: TenantDep) -> ProbePublic:
    return _public(ProbePublic, probe_or_404(session, tenant.id, probe_id))


@router.post("/{probe_id}/cancel", response_model=ProbePublic)
def cancel_probe(probe_id: str, session: SessionDep, tenant: TenantDep) -> ProbePublic:
    """Queued: cancelled at once. Running: stops after its current generation chunk."""
    row = jobs.request_cancel(session, tenant.id, probe_id, JobKind.probe)
    session.commit()
    return _public(ProbePublic, row)


@router.get("/{probe_id}/events", response_model=ListPublic[EventPublic])
def list_probe_events(probe_id: str, session: SessionDep, tenant: TenantDep,
                      after: Annotated[int | None, Query(ge=0)] = None,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> ListPublic[EventPublic]:
    """created, started, progress ({done, total} samples), retried, cancelled, failed, succeeded."""
    probe_or_404(session, tenant.id, probe_id)
    rows = jobs.list_events(session, tenant.id, probe_id, after=after, limit=limit + 1)
    return ListPublic[EventPublic](data=[EventPublic.model_validate(e) for e in rows[:limit]],
                                   has_more=len(rows) > limit)

