"""Continuations: a job's continuations (jobs started from its checkpoints), and the spec that
continues it (`?broad=true`: BroRL's plateau -> broad move). Submitting that spec, edited or
not, is `POST /v1/jobs`; `brorl continue` and the job page's button do both in one step."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from store import jobs

from api.continuation import continuation_spec
from api.deps import SessionDep, TenantDep
from api.errors import ApiError
from api.schemas import JobSummary, ListPublic
from api.submission import job_or_404

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("/{job_id}/continuation")
def get_continuation(job_id: str, session: SessionDep, tenant: TenantDep,
                     broad: Annotated[bool, Query(description="n x 4 (up to 512) at the parent's "
                                                  "lr rule for that batch")] = False) -> dict[str, Any]:
    """The spec that continues this job from its newest checkpoint (its own settings, or broad)."""
    job = job_or_404(session, tenant.id, job_id)
    if jobs.latest_checkpoint(session, job.id) is None:
        raise ApiError(409, f"job {job_id} has no checkpoint to continue from yet", type_="conflict")
    return {"spec": continuation_spec(job, broad)}


@router.get("/{job_id}/continuations", response_model=ListPublic[JobSummary])
def list_continuations(job_id: str, session: SessionDep, tenant: TenantDep) -> ListPublic[JobSummary]:
    """The caller's jobs that started from this job's checkpoints, oldest first."""
    job_or_404(session, tenant.id, job_id)
    return ListPublic[JobSummary](data=[JobSummary.model_validate(j)
                                        for j in jobs.continuations(session, tenant.id, job_id)])
