"""Faults with real worker processes, PostgreSQL and a private Redis: nothing lost, nothing twice.

Each test checks the same invariants at the end (`assert_consistent`): metric steps are
1..3 exactly once, every checkpoint row has its folder and every checkpoint folder on disk
has its row (no file of a stale attempt survives), and the terminal event is written once.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from store.db import session_scope
from store.models import Checkpoint, Job, JobEvent, JobStatus, Metric
from tests.faults.conftest import wait_for
from trainer.checkpoints import format as ckpt_format

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]


def job(job_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, job_id)


def event_types(job_id: str) -> list[str]:
    with session_scope() as s:
        return [e.type.value for e in s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.id)]


def assert_consistent(job_id: str, artifact_dir: Path) -> None:
    with session_scope() as s:
        steps = [m.step for m in s.query(Metric).filter_by(job_id=job_id).order_by(Metric.step)]
        rows = {Path(c.uri) for c in s.query(Checkpoint).filter_by(job_id=job_id)}
    assert steps == sorted(set(steps)) and steps == list(range(1, len(steps) + 1)), steps
    on_disk = {p for p in (artifact_dir / "jobs" / job_id).rglob("step-*")
               if ckpt_format.step_of(p) is not None}
    assert on_disk == rows, (on_disk, rows)  # no row without files, no files without a row
    assert all(ckpt_format.cached_archive(p) for p in rows)  # archives built at record time
    assert not list((artifact_dir / "jobs" / job_id).rglob(".tmp-*"))
    terminal = [t for t in event_types(job_id) if t in ("succeeded", "failed", "cancelled")]
    assert len(terminal) <= 1, terminal


def test_sigkill_mid_step_resumes_from_the_latest_checkpoint(stack):
    stack.start_worker()
    job_id = stack.submit("fake sleep=1.5 ckpt")
    wait_for(lambda: job(job_id).step >= 2, 60, "step 2", stack.folder)
    stack.kill_workers()  # mid step 3, checkpoint of step 2 recorded
    assert job(job_id).status == JobStatus.running
    stack.start_worker()  # its beat reaps the expired lease; the job resumes on attempt 2
    wait_for(lambda: job(job_id).status == JobStatus.succeeded, 90, "resumed run", stack.folder)
    assert job(job_id).attempt == 2
    types = event_types(job_id)
    assert types.count("retried") == 1 and types.count("succeeded") == 1
    with session_scope() as s:
        resumed = [e.data for e in s.query(JobEvent).filter_by(job_id=job_id, type="stage_started")]
    assert resumed[-1].get("resumed_from_step") == 2
    assert_consistent(job_id, Path(stack.env["BRORL_DATA_DIR"]) / "artifacts")


def test_a_job_that_always_crashes_fails_after_max_attempts(stack):
    stack.start_worker()
    job_id = stack.submit("fake crash", max_attempts=2)
    wait_for(lambda: job(job_id).status == JobStatus.failed, 90, "failed", stack.folder)
    row = job(job_id)
    assert row.attempt == 2 and "2 attempts" in row.error
    time.sleep(3)  # no loop: nothing claims it again
    assert job(job_id).attempt == 2 and event_types(job_id).count("started") == 2
    assert_consistent(job_id, Path(stack.env["BRORL_DATA_DIR"]) / "artifacts")


def test_redis_restarted_empty_with_jobs_queued_and_running(stack):
    stack.start_worker()
    running = stack.submit("fake sleep=1.5 ckpt")
    wait_for(lambda: job(running).step >= 1, 60, "running", stack.folder)
    queued = stack.submit("fake")  # waits behind `running` (one job per worker)
    stack.kill_workers()
    stack.redis.stop()  # no persistence: every message is gone
    stack.redis.start()
    stack.start_worker()
    # The reaper re-dispatches from the database: the expired lease and the unclaimed job.
    for job_id in (running, queued):
        wait_for(lambda: job(job_id).status == JobStatus.succeeded, 90, job_id, stack.folder)
        assert_consistent(job_id, Path(stack.env["BRORL_DATA_DIR"]) / "artifacts")
