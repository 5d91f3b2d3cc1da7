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
from store.tables import JobEvent, JobStatus
from tests.faults.helpers import assert_consistent, checkpoint_steps, event_types, job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]


def test_sigkill_mid_step_resumes_from_the_latest_checkpoint(stack):
    stack.start_worker()
    job_id = stack.submit("fake sleep=1.5 ckpt")
    # The checkpoint row, not the step: step 2's metrics land before its checkpoint is recorded,
    # and a kill between them rightly resumes from step 1.
    wait_for(lambda: 2 in checkpoint_steps(job_id), 60, "checkpoint of step 2", stack.folder)
    stack.kill_workers()  # mid step 3
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
