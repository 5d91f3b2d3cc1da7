"""Races and stale writers on real PostgreSQL (no broker needed): the database decides."""
from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import jobs
from store.db import session_scope
from store.errors import Fenced
from store.tables import Job, JobEvent, JobStatus
from tests.faults.helpers import assert_consistent, event_types, job, wait_for
from worker import lease, runner

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


def _tenant_id() -> int:
    from store import keys

    with session_scope() as s:
        return keys.create_tenant(s, "acme").id


def _expire(job_id: str) -> None:
    with session_scope() as s:
        s.query(Job).filter_by(id=job_id).update({"lease_expires_at": job(job_id).created_at})


def test_cancel_landing_mid_reap_cancels_instead_of_requeueing(stack):
    job_id = stack.submit("fake")
    with session_scope() as s:
        jobs.claim(s, job_id, "dead-worker", lease_seconds=60)
    _expire(job_id)
    tenant = _tenant_id()
    reaped: dict = {}
    # The cancel's transaction holds the job's row lock while the reaper reads (flag still
    # false) and then tries its compare-and-set, which must miss once the cancel commits.
    with session_scope() as cancel:
        jobs.request_cancel(cancel, tenant, job_id)
        reaper = threading.Thread(target=lambda: reaped.update(ids=_reap()))
        reaper.start()
        time.sleep(0.5)
        assert reaper.is_alive()  # blocked on the row lock
    reaper.join(10)
    assert reaped["ids"] == []  # not requeued
    assert job(job_id).status == JobStatus.cancelled
    assert event_types(job_id)[-2:] == ["cancel_requested", "cancelled"]


def _reap() -> list[str]:
    with session_scope() as s:
        return jobs.reap_expired(s)


def test_cancel_racing_cancel_and_completion(stack):
    job_id = stack.submit("fake")
    with session_scope() as s:
        claim = jobs.claim(s, job_id, "w", lease_seconds=60)
    tenant = _tenant_id()
    threads = [threading.Thread(target=lambda: _cancel(tenant, job_id)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert event_types(job_id).count("cancel_requested") == 1
    with session_scope() as s:  # the worker completes the last step after the request
        assert jobs.finish(s, job_id, claim.attempt, "succeeded") == JobStatus.cancelled
    assert job(job_id).status == JobStatus.cancelled


def _cancel(tenant: int, job_id: str) -> None:
    with session_scope() as s:
        jobs.request_cancel(s, tenant, job_id)


def test_stale_attempt_leaves_no_row_and_no_file(stack):
    job_id = stack.submit("fake sleep=0.6 ckpt")
    result: dict = {}
    stale = threading.Thread(target=lambda: result.update(status=runner.run_job(job_id)))
    stale.start()
    wait_for(lambda: job(job_id).step >= 1, 30, "step 1")
    _expire(job_id)  # as if its heartbeats had stopped landing
    assert _reap() == [job_id]
    with session_scope() as s:
        assert jobs.claim(s, job_id, "new-owner", 60).attempt == 2
    stale.join(30)
    assert result["status"] is None  # the stale attempt wrote no outcome
    row = job(job_id)
    assert (row.status, row.attempt, row.lease_owner) == (JobStatus.running, 2, "new-owner")
    with session_scope() as s:
        events = s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.id).all()
        takeover = max(e.id for e in events if e.type.value == "started")
        late = [e for e in events if e.id > takeover]
    assert all(e.data.get("attempt") == 2 for e in late), [(e.type, e.data) for e in late]
    assert_consistent(job_id, Path(stack.env["BRORL_DATA_DIR"]) / "artifacts")


def test_a_lease_not_renewed_for_a_whole_lease_stops_the_run():
    state = lease.StopState(max_wall_seconds=100, lease_seconds=2, job_id="j", attempt=1)
    assert state.should_stop() is False
    state.renewed -= 3  # the database did not answer for longer than the lease
    with pytest.raises(Fenced):
        state.should_stop()


@contextlib.contextmanager
def database_down(pg_url: str) -> Iterator[None]:
    """The job database refuses new connections and its open ones are cut, until the block ends."""
    from sqlalchemy import create_engine, text

    name = pg_url.rsplit("/", 1)[1]
    admin = create_engine(pg_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
            try:
                yield
            finally:
                c.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    finally:
        admin.dispose()


def _metric_rows(job_id: str) -> list[tuple[int, float]]:
    from store.tables import Metric

    with session_scope() as s:
        return [(m.step, m.values["reward_mean"])
                for m in s.query(Metric).filter_by(job_id=job_id).order_by(Metric.step)]


def test_database_dropped_mid_job_buffers_metrics_and_loses_none(stack, pg_url, monkeypatch, caplog):
    from store.settings import reset_settings_cache

    monkeypatch.setenv("BRORL_LEASE_SECONDS", "8")  # the outage (2.5 s) is shorter than a lease
    reset_settings_cache()
    job_id = stack.submit("fake sleep=0.25 steps=14")
    result: dict = {}
    run = threading.Thread(target=lambda: result.update(status=runner.run_job(job_id)))
    run.start()
    wait_for(lambda: job(job_id).step >= 1, 30, "step 1")
    with database_down(pg_url):
        time.sleep(2.5)  # the trainer keeps stepping; its rows wait in the sink's buffer
    run.join(60)
    assert result["status"] == "succeeded"
    buffered = [int(m.group(1)) for r in caplog.records
                if (m := re.search(r"database unavailable; (\d+) rows buffered", r.getMessage()))]
    assert buffered and max(buffered) >= 4, buffered  # several steps trained during the outage
    assert "wrote" in caplog.text and "buffered rows" in caplog.text
    row = job(job_id)
    assert (row.status, row.attempt, row.step) == (JobStatus.succeeded, 1, 14)
    # every step once, in order, with its own values: none lost, none duplicated
    assert _metric_rows(job_id) == [(n, pytest.approx(0.1 * n)) for n in range(1, 15)]
    assert event_types(job_id).count("stage_started") == 1
    assert_consistent(job_id, Path(stack.env["BRORL_DATA_DIR"]) / "artifacts")


def test_buffered_rows_of_a_fenced_attempt_are_dropped_and_a_full_buffer_stops(stack, pg_url):
    from worker.sink import DbSink, SinkBufferFull

    job_id = stack.submit("fake")
    with session_scope() as s:
        attempt = jobs.claim(s, job_id, "old-owner", lease_seconds=60).attempt
    fenced: list[bool] = []
    stale = DbSink(job_id, attempt, on_fenced=lambda: fenced.append(True), retry_seconds=15)
    small = DbSink(job_id, attempt, buffer_rows=2)
    stale.metrics(1, {"reward_mean": 0.1})
    with database_down(pg_url):
        stale.metrics(2, {"reward_mean": 0.2})
        stale.event("stage_started", {"stage": 1})
        small.metrics(2, {"reward_mean": 0.2})
        small.metrics(3, {"reward_mean": 0.3})
        with pytest.raises(SinkBufferFull, match=r"unreachable .* 2 metric/event rows are "
                                                 r"waiting .*BRORL_SINK_BUFFER_ROWS=2"):
            small.metrics(4, {"reward_mean": 0.4})
    assert _metric_rows(job_id) == [(1, 0.1)]
    _expire(job_id)  # the old owner is gone as far as the reaper knows; a new attempt takes over
    assert _reap() == [job_id]
    with session_scope() as s:
        assert jobs.claim(s, job_id, "new-owner", 60).attempt == attempt + 1
    with pytest.raises(Fenced):
        stale.flush()  # the database is back, but the job is no longer this attempt's
    assert fenced == [True]
    assert _metric_rows(job_id) == [(1, 0.1)]  # its buffered rows were dropped, not written
    assert "stage_started" not in event_types(job_id)
    stale.flush()  # nothing left to write


def test_leftovers_of_a_crash_mid_checkpoint_are_swept_by_the_next_attempt(stack):
    from store import artifacts
    from store.settings import get_settings
    from tests.support.fake_trainer import write_checkpoint

    job_id = stack.submit("fake")
    with session_scope() as s:
        first = jobs.claim(s, job_id, "dies-mid-save", lease_seconds=60).attempt
    out = artifacts.attempt_dir(get_settings(), job_id, first)
    recorded, nbytes, digest = write_checkpoint(out, 1)
    with session_scope() as s:
        jobs.record_metrics(s, job_id, first, 1, {"loss": 1.0})
        jobs.record_checkpoint(s, job_id, first, 1, str(recorded), nbytes, digest)
    # What SIGKILL during trainer.checkpoints.io.save leaves: a temp folder, or (killed between the
    # rename and the record) a complete folder without a row.
    (out / "checkpoints" / ".tmp-step-00000002-dead").mkdir()
    write_checkpoint(out, 2)
    _expire(job_id)
    assert _reap() == [job_id]
    assert runner.run_job(job_id) == "succeeded"
    assert_consistent(job_id, Path(stack.env["BRORL_DATA_DIR"]) / "artifacts")


def test_lease_times_come_from_the_database_clock(stack, monkeypatch):
    from datetime import timedelta

    from sqlalchemy import func, select

    from store import jobs as store_jobs
    from store.tables import utcnow

    job_id = stack.submit("fake")
    # A worker (and reaper) whose clock runs an hour ahead of the database server.
    monkeypatch.setattr(store_jobs, "utcnow", lambda: utcnow() + timedelta(hours=1))
    with session_scope() as s:
        store_jobs.claim(s, job_id, "w", lease_seconds=60)
    with session_scope() as s:
        db_now = s.scalar(select(func.now()))
    left = (job(job_id).lease_expires_at - db_now).total_seconds()
    assert 50 < left <= 60  # not 3660: the lease is 60 s of the database's time
    assert _reap() == []  # the skewed reaper does not see it as expired either
    assert job(job_id).status == JobStatus.running
