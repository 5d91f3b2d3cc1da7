"""Pausing a running job with the fake trainer: the heartbeat brings the pause request, the run
stops at its next step and the job is `paused` with its lease released; a resume queues it and
the next attempt continues from the checkpoint (store.job_pause, worker.lease)."""
from __future__ import annotations

import pytest

from store import job_pause, jobs
from store.db import session_scope
from store.errors import InvalidTransition
from store.tables import JobStatus
from tests.worker.test_runner import events, job_row, metric_steps, run_in_thread, wait_for
from worker import lease, runner

pytestmark = pytest.mark.timeout(60)


def test_pause_mid_run_then_resume_from_the_checkpoint(new_job, tenant_id):
    job_id = new_job("fake sleep=0.3 ckpt steps=6")
    thread, result = run_in_thread(job_id)
    wait_for(lambda: job_row(job_id).step >= 1)
    with session_scope() as s:
        assert job_pause.request_pause(s, tenant_id, job_id).status == JobStatus.running
    thread.join(timeout=20)
    assert not thread.is_alive() and result["status"] == "paused"
    row = job_row(job_id)
    assert row.status == JobStatus.paused and row.lease_owner is None and not row.pause_requested
    paused_at = max(metric_steps(job_id))
    assert paused_at < 6
    kinds = [t for t, _ in events(job_id)]
    assert kinds[-1] == "paused" and "pause_requested" in kinds
    assert runner.run_job(job_id) is None  # a stale message does not run a paused job

    with session_scope() as s:
        assert job_pause.resume(s, tenant_id, job_id).status == JobStatus.queued
    assert runner.run_job(job_id) == "succeeded"
    resumed = [d for t, d in events(job_id) if t == "stage_started"][-1]
    assert resumed.get("resumed_from_step", 0) >= 1
    assert metric_steps(job_id) == [1, 2, 3, 4, 5, 6]
    with session_scope() as s, pytest.raises(InvalidTransition):
        job_pause.request_pause(s, tenant_id, job_id)  # finished


def test_heartbeat_sees_a_pause_and_a_queued_job_pauses_at_once(new_job, tenant_id):
    from store.settings import get_settings

    queued = new_job()
    with session_scope() as s:
        assert job_pause.request_pause(s, tenant_id, queued).status == JobStatus.paused
        assert jobs.count_active_jobs(s, tenant_id) == 0  # a paused job holds no slot
    job_id = new_job()
    with session_scope() as s:
        claim = jobs.claim(s, job_id, "w", lease_seconds=5)
    state = lease.StopState(max_wall_seconds=100)
    beat = lease.Heartbeat(job_id, claim.attempt, get_settings(), state)
    beat.beat()
    assert not state.should_stop()
    with session_scope() as s:
        job_pause.request_pause(s, tenant_id, job_id)
    beat.beat()
    assert state.pause_requested and state.should_stop() and not state.cancel_requested
    with session_scope() as s:  # withdrawn before the worker acted on it
        assert job_pause.resume(s, tenant_id, job_id).status == JobStatus.running
        assert not job_pause.pause_requested(s, job_id)
