"""The job state machine: create/idempotency, listing, cancel, claim, fencing, reaper."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from store import jobs
from store.errors import Fenced, IdempotencyConflict, InvalidTransition, NotFound
from store.keys import create_tenant
from store.tables import EventType, JobEvent, JobStatus, Tenant, utcnow
from tests.store.helpers import make_job, make_spec


def _events(s: Session, job_id: str) -> list[EventType]:
    query = select(JobEvent.type).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
    return list(s.scalars(query))


def _claim(s: Session, job_id: str, worker: str = "w1", lease: float = 60) -> jobs.Claim:
    claim = jobs.claim(s, job_id, worker, lease)
    assert claim is not None
    return claim


# --------------------------------------------------------------------------- create / read


def test_create_job_defaults_and_event(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    assert job.id.startswith("job_") and len(job.id) == 30
    got = jobs.get_job(session, tenant.id, job.id)
    assert got is not None and got.status == JobStatus.queued
    assert (got.attempt, got.step, got.total_steps, got.cancel_requested) == (0, 0, 10, False)
    assert got.created_at.tzinfo is not None and got.spec == make_spec()
    assert _events(session, job.id) == [EventType.created]


def test_idempotency_same_body_returns_job_different_body_conflicts(
    session: Session, tenant: Tenant
) -> None:
    first, created = jobs.create_job(session, tenant.id, make_spec(), 10, "a", "key-1")
    session.commit()
    assert created
    # Same body with keys in another order: canonical JSON makes it the same request.
    reordered = dict(reversed(list(make_spec().items())))
    again, created = jobs.create_job(session, tenant.id, reordered, 10, "a", "key-1")
    assert (again.id, created) == (first.id, False)
    with pytest.raises(IdempotencyConflict):
        jobs.create_job(session, tenant.id, make_spec(seed=1), 10, "a", "key-1")
    # The key is per tenant: another tenant may use it freely.
    other = create_tenant(session, "other")
    theirs, created = jobs.create_job(session, other.id, make_spec(seed=1), 10, "a", "key-1")
    assert created and theirs.id != first.id
    session.commit()


def test_tenant_scoping(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    other = create_tenant(session, "other")
    session.commit()
    assert jobs.get_job(session, other.id, job.id) is None
    assert jobs.get_job_unscoped(session, job.id).tenant_id == tenant.id
    assert jobs.list_jobs(session, other.id) == ([], False)
    assert jobs.list_events(session, other.id, job.id) == []
    with pytest.raises(NotFound):
        jobs.request_cancel(session, other.id, job.id)


def test_list_jobs_newest_first_pagination_and_status(session: Session, tenant: Tenant) -> None:
    made = [make_job(session, tenant).id for _ in range(5)]
    page, more = jobs.list_jobs(session, tenant.id, limit=2)
    assert [j.id for j in page] == made[::-1][:2] and more
    page2, more = jobs.list_jobs(session, tenant.id, limit=2, after=page[-1].id)
    assert [j.id for j in page2] == made[::-1][2:4] and more
    page3, more = jobs.list_jobs(session, tenant.id, limit=2, after=page2[-1].id)
    assert [j.id for j in page3] == [made[0]] and not more
    _claim(session, made[1])
    running, more = jobs.list_jobs(session, tenant.id, limit=10, status=JobStatus.running)
    assert [j.id for j in running] == [made[1]] and not more
    queued, _ = jobs.list_jobs(session, tenant.id, limit=10, status=JobStatus("queued"))
    assert len(queued) == 4
    assert jobs.count_jobs_by_status(session) == {
        "queued": 4, "running": 1, "paused": 0, "succeeded": 0, "failed": 0, "cancelled": 0}


# --------------------------------------------------------------------------- cancel


def test_cancel_queued_is_immediate(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    job = jobs.request_cancel(session, tenant.id, job.id)
    session.commit()
    assert job.status == JobStatus.cancelled and job.created_at <= job.finished_at <= utcnow()
    assert _events(session, job.id)[-2:] == [EventType.cancel_requested, EventType.cancelled]
    assert jobs.claim(session, job.id, "w1", 60) is None


def test_cancel_running_sets_flag_seen_by_heartbeat(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    assert jobs.heartbeat(session, job.id, claim.attempt, 60) is False
    job = jobs.request_cancel(session, tenant.id, job.id)
    session.commit()
    assert job.status == JobStatus.running and job.cancel_requested
    assert jobs.heartbeat(session, job.id, claim.attempt, 60) is True
    # Asking twice is harmless and logs the request once.
    jobs.request_cancel(session, tenant.id, job.id)
    jobs.finish(session, job.id, claim.attempt, JobStatus.cancelled)
    session.commit()
    assert _events(session, job.id) == [
        EventType.created, EventType.started, EventType.cancel_requested, EventType.cancelled]


@pytest.mark.parametrize("final", ["succeeded", "failed", "cancelled"])
def test_cancel_finished_names_the_state(session: Session, tenant: Tenant, final: str) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    jobs.finish(session, job.id, claim.attempt, final, error="boom" if final == "failed" else None)
    session.commit()
    with pytest.raises(InvalidTransition, match=final) as info:
        jobs.request_cancel(session, tenant.id, job.id)
    assert info.value.status == final


def test_cancel_unknown_job(session: Session, tenant: Tenant) -> None:
    with pytest.raises(NotFound):
        jobs.request_cancel(session, tenant.id, "job_nope")


# --------------------------------------------------------------------------- claim / fencing


def test_claim_is_compare_and_set(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant, foo=[1, 2])
    claim = _claim(session, job.id, "w1")
    assert claim == jobs.Claim(job.id, 1, make_spec(foo=[1, 2]), tenant.id)
    assert jobs.claim(session, job.id, "w2", 60) is None  # duplicate delivery
    assert jobs.claim(session, "job_missing", "w2", 60) is None
    row = jobs.get_job(session, tenant.id, job.id)
    session.refresh(row)
    assert (row.status, row.attempt, row.lease_owner) == (JobStatus.running, 1, "w1")
    assert row.created_at <= row.started_at <= utcnow() < row.lease_expires_at
    assert _events(session, job.id) == [EventType.created, EventType.started]


def test_older_attempt_is_fenced_after_reclaim(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    old = _claim(session, job.id, "w1", lease=1)
    assert jobs.reap_expired(session, now=utcnow() + timedelta(seconds=5)) == [job.id]
    session.commit()
    new = _claim(session, job.id, "w2")
    assert new.attempt == old.attempt + 1
    stale_writes = [
        lambda: jobs.heartbeat(session, job.id, old.attempt, 60),
        lambda: jobs.record_metrics(session, job.id, old.attempt, 3, {"loss": 1.0}),
        lambda: jobs.add_event(session, job.id, EventType.eval, {"x": 1}, attempt=old.attempt),
        lambda: jobs.record_checkpoint(session, job.id, old.attempt, 3, "/x", 1, "ab"),
        lambda: jobs.finish(session, job.id, old.attempt, JobStatus.succeeded),
    ]
    for write in stale_writes:
        with pytest.raises(Fenced):
            write()
        session.rollback()
    # The current attempt still writes, and finishing ends its ownership too.
    jobs.record_metrics(session, job.id, new.attempt, 1, {"loss": 0.5})
    jobs.finish(session, job.id, new.attempt, "succeeded")
    session.commit()
    with pytest.raises(Fenced):
        jobs.heartbeat(session, job.id, new.attempt, 60)
    row = jobs.get_job(session, tenant.id, job.id)
    session.refresh(row)
    assert row.status == JobStatus.succeeded and row.lease_owner is None and row.step == 1


def test_metrics_upsert_on_repeated_step(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    for step in (1, 2, 3):
        jobs.record_metrics(session, job.id, claim.attempt, step, {"loss": float(step)})
    session.commit()
    # A resumed run repeats step 2 and 3: the new values replace the old rows.
    for step in (2, 3):
        jobs.record_metrics(session, job.id, claim.attempt, step, {"loss": step * 10.0})
    session.commit()
    rows = jobs.list_metrics(session, tenant.id, job.id)
    assert [(m.step, m.values["loss"]) for m in rows] == [(1, 1.0), (2, 20.0), (3, 30.0)]
    assert [m.step for m in jobs.list_metrics(session, tenant.id, job.id, after_step=1)] == [2, 3]
    assert len(jobs.list_metrics(session, tenant.id, job.id, limit=2)) == 2


def test_checkpoints_and_events(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    jobs.record_checkpoint(session, job.id, claim.attempt, 5, "/ck/5", 100, "a" * 64)
    jobs.record_checkpoint(session, job.id, claim.attempt, 10, "/ck/10", 200, "b" * 64)
    jobs.record_checkpoint(session, job.id, claim.attempt, 10, "/ck/10b", 300, "c" * 64)
    jobs.add_event(session, job.id, "stage_started", {"stage": 1}, attempt=claim.attempt)
    session.commit()
    latest = jobs.latest_checkpoint(session, job.id)
    assert (latest.step, latest.uri, latest.bytes) == (10, "/ck/10b", 300)
    assert [c.step for c in jobs.list_checkpoints(session, tenant.id, job.id)] == [5, 10]
    assert jobs.get_checkpoint(session, tenant.id, job.id, 5).sha256 == "a" * 64
    assert jobs.get_checkpoint(session, tenant.id, job.id, 7) is None
    events = jobs.list_events(session, tenant.id, job.id)
    assert [e.type for e in events][-2:] == [EventType.checkpoint_saved, EventType.stage_started]
    assert events[-1].data == {"stage": 1}
    after = jobs.list_events(session, tenant.id, job.id, after=events[1].id, limit=2)
    assert [e.id for e in after] == [e.id for e in events[2:4]]


def test_warning_event_sets_the_jobs_status_line(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    assert jobs.get_job(session, tenant.id, job.id).warning is None
    jobs.add_event(session, job.id, "warning", {"step": 10, "message": "raise max_new_tokens"},
                   attempt=claim.attempt)
    session.commit()
    session.expire_all()
    assert jobs.get_job(session, tenant.id, job.id).warning == "raise max_new_tokens"
    assert _events(session, job.id)[-1] == EventType.warning


# --------------------------------------------------------------------------- reaper


def test_reaper_requeues_then_gives_up(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant, max_attempts=2)
    later = lambda: utcnow() + timedelta(seconds=5)  # noqa: E731
    _claim(session, job.id, lease=1)
    assert jobs.reap_expired(session) == []  # lease still live
    assert jobs.reap_expired(session, now=later()) == [job.id]
    session.commit()
    # A second reaper (or a second pass) finds nothing left to do.
    assert jobs.reap_expired(session, now=later()) == []
    _claim(session, job.id, lease=1)
    assert jobs.reap_expired(session, now=later()) == []  # attempt 2 of 2: fail, not requeue
    session.commit()
    row = jobs.get_job(session, tenant.id, job.id)
    session.refresh(row)
    assert row.status == JobStatus.failed and row.error == "lease expired after 2 attempts"
    assert row.started_at <= row.finished_at <= utcnow() and row.lease_owner is None
    assert _events(session, job.id) == [
        EventType.created, EventType.started, EventType.retried, EventType.started,
        EventType.failed]


def _event_data(s: Session, job_id: str, type_: EventType) -> list[dict]:
    query = select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.type == type_)
    return [dict(d) for d in s.scalars(query.order_by(JobEvent.id))]


def test_retry_or_fail_requeues_a_machine_fault_then_fails_at_max_attempts(
    session: Session, tenant: Tenant
) -> None:
    job = make_job(session, tenant, max_attempts=2)
    first = _claim(session, job.id)
    assert jobs.retry_or_fail(session, job.id, first.attempt, "rank 1 died (exit 9)") is True
    session.commit()
    row = jobs.get_job_unscoped(session, job.id)
    assert (row.status, row.attempt, row.lease_owner, row.lease_expires_at, row.error) == (
        JobStatus.queued, 1, None, None, None)
    assert _event_data(session, job.id, EventType.retried) == [
        {"attempt": 1, "reason": "machine fault", "error": "rank 1 died (exit 9)"}]
    with pytest.raises(Fenced):  # the requeued attempt no longer owns the job
        jobs.retry_or_fail(session, job.id, first.attempt, "again")
    session.rollback()
    second = _claim(session, job.id)
    assert second.attempt == 2
    with pytest.raises(Fenced):  # a stale attempt next to a live one
        jobs.retry_or_fail(session, job.id, first.attempt, "stale")
    session.rollback()
    assert jobs.retry_or_fail(session, job.id, second.attempt, "rank 0 died") is False
    session.commit()
    row = jobs.get_job_unscoped(session, job.id)
    assert (row.status, row.error, row.lease_owner) == (JobStatus.failed, "rank 0 died", None)
    assert row.started_at <= row.finished_at <= utcnow()
    assert _events(session, job.id) == [
        EventType.created, EventType.started, EventType.retried, EventType.started,
        EventType.failed]


def test_retry_or_fail_cancels_a_job_whose_cancel_was_requested(
    session: Session, tenant: Tenant
) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    jobs.request_cancel(session, tenant.id, job.id)
    session.commit()
    assert jobs.retry_or_fail(session, job.id, claim.attempt, "rank 1 died") is False
    session.commit()
    assert jobs.get_job_unscoped(session, job.id).status == JobStatus.cancelled


def test_job_shapes_reads_each_spec(session: Session, tenant: Tenant) -> None:
    one = make_job(session, tenant)
    two = make_job(session, tenant, resources={"gpus_per_node": 2, "nodes": 1})
    wide = make_job(session, tenant, resources={"gpus_per_node": 2, "nodes": 3})
    assert jobs.job_shapes(session, [one.id, two.id, wide.id]) == {
        one.id: (1, 1), two.id: (2, 1), wide.id: (2, 3)}
    assert jobs.job_shapes(session, []) == {}


def test_stale_queued_jobs_are_returned_once_per_period(session: Session, tenant: Tenant) -> None:
    queued, running = make_job(session, tenant), make_job(session, tenant)
    _claim(session, running.id)
    session.commit()
    assert jobs.stale_queued(session, 60) == []                      # too recent
    later = utcnow() + timedelta(seconds=120)
    assert jobs.stale_queued(session, 60, now=later) == [queued.id]   # running job untouched
    session.commit()
    assert jobs.stale_queued(session, 60, now=later + timedelta(seconds=30)) == []
    assert jobs.stale_queued(session, 60, now=later + timedelta(seconds=90)) == [queued.id]


def test_reaper_cancels_expired_job_with_cancel_requested(
    session: Session, tenant: Tenant
) -> None:
    job = make_job(session, tenant)
    _claim(session, job.id, lease=1)
    jobs.request_cancel(session, tenant.id, job.id)
    session.commit()
    assert jobs.reap_expired(session, now=utcnow() + timedelta(seconds=5)) == []
    session.commit()
    assert jobs.get_job_unscoped(session, job.id).status == JobStatus.cancelled


def test_finish_refuses_non_final_status(session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    claim = _claim(session, job.id)
    with pytest.raises(ValueError):
        jobs.finish(session, job.id, claim.attempt, JobStatus.running)
