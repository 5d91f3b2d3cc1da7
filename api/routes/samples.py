"""A job's stored rollouts (`samples.per_step` of each step): what the model actually wrote,
and for a multi-turn job (`task.env`) the whole episode turn by turn, with its counts.

This is how users catch reward hacking: a rising reward whose completions read wrong.
Tenant-scoped like every job route (another tenant's job is a 404), paged by a keyset cursor.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from store import jobs
from trainer.spec import MAX_TOTAL_STEPS

from api.deps import SessionDep, TenantDep
from api.submission import job_or_404
from api.schemas import ListPublic, SamplePublic

router = APIRouter(prefix="/jobs/{job_id}", tags=["samples"])

MAX_SAMPLE_ID = 2**53  # within what a JavaScript number holds exactly
Reward = Annotated[float | None, Query(ge=-1e9, le=1e9)]


@router.get("/samples", response_model=ListPublic[SamplePublic])
def list_samples(
    job_id: str, session: SessionDep, tenant: TenantDep,
    step: Annotated[int | None, Query(ge=0, le=MAX_TOTAL_STEPS, description="Only this step.")] = None,
    min_reward: Reward = None,
    max_reward: Reward = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_SAMPLE_ID,
                                       description="The last sample id of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 64,
) -> ListPublic[SamplePublic]:
    """Stored samples, newest step first, highest rewards first within a step."""
    job_or_404(session, tenant.id, job_id)
    rows = jobs.list_samples(session, tenant.id, job_id, step=step, min_reward=min_reward,
                             max_reward=max_reward, after=after, limit=limit + 1)
    return ListPublic[SamplePublic](data=[SamplePublic.of(r) for r in rows[:limit]],
                                    has_more=len(rows) > limit)
