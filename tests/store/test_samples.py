"""Stored rollouts: replaced when a step re-runs, fenced, capped per job, NUL-safe on
PostgreSQL, tenant-scoped, filtered by step and reward, paged newest step first."""
from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from store import jobs
from store.errors import Fenced
from store.keys import create_tenant
from store.tables import Tenant
from tests.store.helpers import make_job


def _row(reward: float, text: str = "x") -> dict:
    return {"prompt": "p " + text, "completion": text, "reward": reward, "correct": reward > 0.5,
            "truncated": False, "advantage": reward - 0.5, "sub_rewards": {"fmt": 1.0}}


def _claimed(session: Session, tenant: Tenant):
    job = make_job(session, tenant)
    claim = jobs.claim(session, job.id, "w1", 60)
    session.commit()
    return job, claim.attempt


def test_samples_are_stored_replaced_filtered_and_paged(session: Session, tenant: Tenant) -> None:
    job, attempt = _claimed(session, tenant)
    for step in (1, 2):
        assert jobs.record_samples(session, job.id, attempt, step, [_row(1.0), _row(0.0)], 10**6) == 2
    # a resumed run repeats step 2: its new rows replace the old ones
    jobs.record_samples(session, job.id, attempt, 2, [_row(0.75, "again\x00nul")], 10**6)
    session.commit()
    rows = jobs.list_samples(session, tenant.id, job.id)
    assert [(r.step, r.idx, r.reward) for r in rows] == [(2, 0, 0.75), (1, 0, 1.0), (1, 1, 0.0)]
    assert rows[0].completion == "again\ufffdnul" and rows[0].sub_rewards == {"fmt": 1.0}
    assert [r.step for r in jobs.list_samples(session, tenant.id, job.id, step=1)] == [1, 1]
    assert [r.reward for r in jobs.list_samples(session, tenant.id, job.id, min_reward=0.5)] == [0.75, 1.0]
    assert [r.reward for r in jobs.list_samples(session, tenant.id, job.id, max_reward=0.5)] == [0.0]
    first = jobs.list_samples(session, tenant.id, job.id, limit=2)
    rest = jobs.list_samples(session, tenant.id, job.id, after=first[-1].id)
    assert [r.id for r in first + rest] == [r.id for r in rows]
    other = create_tenant(session, "other")
    assert jobs.list_samples(session, other.id, job.id) == []


def test_samples_stop_at_the_jobs_byte_cap(session: Session, tenant: Tenant) -> None:
    job, attempt = _claimed(session, tenant)
    big = "y" * 100  # prompt "p " + 100, completion 100: 202 bytes a row
    assert jobs.record_samples(session, job.id, attempt, 1, [_row(1.0, big)] * 3, 500) == 2
    assert jobs.record_samples(session, job.id, attempt, 2, [_row(1.0, big)], 500) == 0
    session.commit()
    assert len(jobs.list_samples(session, tenant.id, job.id)) == 2


def test_a_stale_attempt_cannot_store_samples(session: Session, tenant: Tenant) -> None:
    job, attempt = _claimed(session, tenant)
    jobs.finish(session, job.id, attempt, "succeeded")
    session.commit()
    with pytest.raises(Fenced):
        jobs.record_samples(session, job.id, attempt, 1, [_row(1.0)], 10**6)
