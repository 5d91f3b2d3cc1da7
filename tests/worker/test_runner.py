"""The job runner against SQLite with the fake trainer: claim, run, finish and every way out.

No broker here: `worker.runner.run_job` is called directly, which is exactly what the Celery
task does. Concurrency (cancel, fencing) is driven from a second thread with bounded waits.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest

from store import jobs
from store.db import session_scope
from store.errors import Fenced
from store.tables import Checkpoint, Job, JobEvent, JobStatus, Metric
from tests.support.fake_trainer import write_checkpoint
from worker import lease, runner

pytestmark = pytest.mark.timeout(60)


def job_row(job_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, job_id)


def events(job_id: str) -> list[tuple[str, dict]]:
    with session_scope() as s:
        rows = s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.id).all()
        return [(str(e.type.value), dict(e.data)) for e in rows]


def metric_steps(job_id: str) -> list[int]:
    with session_scope() as s:
        return sorted(m.step for m in s.query(Metric).filter_by(job_id=job_id))


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def run_in_thread(job_id: str) -> tuple[threading.Thread, dict]:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(status=runner.run_job(job_id)))
    thread.start()
    return thread, result


def test_claim_run_finish(new_job):
    job_id = new_job()
    assert runner.run_job(job_id) == "succeeded"
    job = job_row(job_id)
    assert (job.status, job.attempt, job.step, job.lease_owner) == (JobStatus.succeeded, 1, 3, None)
    assert metric_steps(job_id) == [1, 2, 3]
    types = [t for t, _ in events(job_id)]
    assert types == ["created", "started", "stage_started", "checkpoint_saved", "succeeded"]
    with session_scope() as s:
        (ckpt,) = s.query(Checkpoint).filter_by(job_id=job_id).all()
        assert ckpt.step == 3 and Path(ckpt.uri).is_dir() and Path(ckpt.uri).is_absolute()
        assert (Path(ckpt.uri) / "config.json").is_file() and len(ckpt.sha256) == 64


def test_duplicate_delivery_runs_once(new_job):
    job_id = new_job()
    assert runner.run_job(job_id) == "succeeded"
    assert runner.run_job(job_id) is None
    assert [t for t, _ in events(job_id)].count("started") == 1
    assert job_row(job_id).attempt == 1


def test_unknown_job_is_ignored(data_dir):
    assert runner.run_job("job_does_not_exist") is None


def test_trainer_exception_fails_with_a_message_not_a_traceback(new_job):
    job_id = new_job("fake fail")
    assert runner.run_job(job_id) == "failed"
    job = job_row(job_id)
    assert job.status == JobStatus.failed
    assert "fake trainer failure" in job.error and "RuntimeError" in job.error
    failed = [d for t, d in events(job_id) if t == "failed"]
    assert len(failed) == 1  # one terminal event, with a message and no internals
    assert "fake trainer failure" in str(failed[0]) and "Traceback" not in str(failed[0])
    assert "fake_trainer.py" not in str(failed[0]) and "traceback" not in failed[0]


def test_bad_entrypoint_fails_the_job_not_the_worker(new_job, monkeypatch):
    from store.settings import reset_settings_cache

    monkeypatch.setenv("BRORL_TRAINER_ENTRYPOINT", "no_such_trainer_module:train")
    reset_settings_cache()
    job_id = new_job()
    assert runner.run_job(job_id) == "failed"
    assert "no_such_trainer_module" in job_row(job_id).error


def test_cancel_mid_run(new_job, tenant_id):
    job_id = new_job("fake sleep=0.5")
    thread, result = run_in_thread(job_id)
    wait_for(lambda: job_row(job_id).step >= 1)
    with session_scope() as s:
        assert jobs.request_cancel(s, tenant_id, job_id).status == JobStatus.running
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert result["status"] == "cancelled"
    assert job_row(job_id).status == JobStatus.cancelled
    assert metric_steps(job_id) != [1, 2, 3]  # stopped before the end


def test_stale_attempt_is_fenced_and_stops(new_job):
    job_id = new_job("fake sleep=0.4")
    thread, result = run_in_thread(job_id)
    wait_for(lambda: job_row(job_id).step >= 1)
    # As if the lease had expired: the reaper requeues, another worker claims attempt 2.
    with session_scope() as s:
        s.query(Job).filter_by(id=job_id).update({"lease_expires_at": job_row(job_id).created_at})
    with session_scope() as s:
        assert jobs.reap_expired(s) == [job_id]
    with session_scope() as s:
        assert jobs.claim(s, job_id, "other-worker", 60).attempt == 2
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert result["status"] is None
    job = job_row(job_id)
    # The stale worker wrote nothing final: the job is still attempt 2's.
    assert (job.status, job.attempt, job.lease_owner) == (JobStatus.running, 2, "other-worker")
    assert "succeeded" not in [t for t, _ in events(job_id)]


def test_wall_clock_limit_fails_the_job(new_job):
    job_id = new_job("fake sleep=0.6", max_wall_seconds=1)
    assert runner.run_job(job_id) == "failed"
    assert job_row(job_id).error == lease.WALL_LIMIT_ERROR


class Sent(list):
    """A stand-in enqueue recording (job id, queue) pairs."""

    def __call__(self, job_id: str, gpus: int = 1, nodes: int = 1) -> None:
        from worker.celery_app import queue_for

        self.append((job_id, queue_for(gpus, nodes)))


def _claim_and_expire(job_id: str) -> None:
    with session_scope() as s:
        assert jobs.claim(s, job_id, "dead-worker", lease_seconds=0.01) is not None
    time.sleep(0.05)


def test_reaper_requeues_then_gives_up(new_job):
    job_id = new_job(max_attempts=2)
    sent = Sent()
    _claim_and_expire(job_id)
    assert runner.reap_and_requeue(sent) == [job_id]
    assert sent == [(job_id, "gpu")] and job_row(job_id).status == JobStatus.queued
    _claim_and_expire(job_id)  # attempt 2 = max_attempts dies too
    assert runner.reap_and_requeue(sent) == []
    job = job_row(job_id)
    assert job.status == JobStatus.failed and "2 attempts" in job.error
    assert sent == [(job_id, "gpu")]


def test_reaper_enqueues_each_job_on_the_queue_of_its_gpu_count(new_job, monkeypatch):
    one, two, wide = new_job(), new_job(gpus=2), new_job(gpus=2, nodes=2)
    stale, stale_wide = new_job(gpus=2), new_job(nodes=3)
    with session_scope() as s:  # as if unclaimed for longer than requeue_queued_after_seconds
        s.get(Job, stale).updated_at -= timedelta(days=1)
        s.get(Job, stale_wide).updated_at -= timedelta(days=1)
    _claim_and_expire(one)
    _claim_and_expire(two)
    _claim_and_expire(wide)
    sent = Sent()
    assert sorted(runner.reap_and_requeue(sent)) == sorted([one, two, wide, stale, stale_wide])
    # A multi-node job goes back to the Ray driver workers' queue, whatever its GPUs per node.
    assert sorted(sent) == sorted([(one, "gpu"), (two, "gpu-2"), (wide, "ray"), (stale, "gpu-2"),
                                   (stale_wide, "ray")])


def test_a_machine_fault_requeues_the_job_on_its_queue(new_job):
    job_id = new_job("fake rankdied", max_attempts=2, gpus=2)
    sent = Sent()
    assert runner.run_job(job_id, enqueue=sent) == "queued"
    job = job_row(job_id)
    assert (job.status, job.attempt, job.lease_owner, job.error) == (
        JobStatus.queued, 1, None, None)
    assert sent == [(job_id, "gpu-2")]
    assert metric_steps(job_id) == [1]  # the steps before the fault were flushed
    (retried,) = [d for t, d in events(job_id) if t == "retried"]
    assert "rank 1 of 2 died" in retried["error"] and retried["attempt"] == 1
    # The last attempt: the same fault fails the job instead, and nothing is enqueued.
    assert runner.run_job(job_id, enqueue=sent) == "failed"
    job = job_row(job_id)
    assert job.status == JobStatus.failed and "rank 1 of 2 died" in job.error
    assert job.attempt == 2 and sent == [(job_id, "gpu-2")]
    assert [t for t, _ in events(job_id)][-1] == "failed"


def test_a_multi_node_job_s_machine_fault_requeues_it_for_a_ray_driver(new_job):
    job_id = new_job("fake rankdied", max_attempts=2, nodes=2)
    sent = Sent()
    assert runner.run_job(job_id, enqueue=sent) == "queued"
    assert sent == [(job_id, "ray")]


def test_a_machine_fault_after_a_cancel_request_cancels(new_job, tenant_id, monkeypatch):
    job_id = new_job("fake rankdied")
    real = runner.jobs.retry_or_fail

    def cancel_first(s, *args):  # the user's cancel lands while the ranks are dying
        jobs.request_cancel(s, tenant_id, job_id)
        return real(s, *args)

    monkeypatch.setattr(runner.jobs, "retry_or_fail", cancel_first)
    sent = Sent()
    assert runner.run_job(job_id, enqueue=sent) == "cancelled" and sent == []


def test_requeued_job_resumes_from_its_checkpoint(new_job, data_dir):
    job_id = new_job()
    with session_scope() as s:
        attempt = jobs.claim(s, job_id, "dead-worker", lease_seconds=0.01).attempt
    folder, nbytes, sha = write_checkpoint(data_dir / "artifacts" / "jobs" / job_id, 3)
    with session_scope() as s:
        jobs.record_checkpoint(s, job_id, attempt, 3, str(folder), nbytes, sha)
    time.sleep(0.05)
    assert runner.reap_and_requeue(Sent()) == [job_id]
    assert runner.run_job(job_id) == "succeeded"
    assert job_row(job_id).attempt == 2
    resumed = [d for t, d in events(job_id) if t == "stage_started"]
    assert resumed and resumed[-1].get("resumed_from_step") == 3


def test_heartbeat_renews_lease_and_sees_cancel(new_job, tenant_id):
    from store.settings import get_settings

    job_id = new_job()
    with session_scope() as s:
        claim = jobs.claim(s, job_id, "w", lease_seconds=5)
    before = job_row(job_id).lease_expires_at
    state = lease.StopState(max_wall_seconds=100)
    beat = lease.Heartbeat(job_id, claim.attempt, get_settings(), state)
    time.sleep(0.01)
    beat.beat()
    assert job_row(job_id).lease_expires_at > before and not state.should_stop()
    with session_scope() as s:
        jobs.request_cancel(s, tenant_id, job_id)
    beat.beat()
    assert state.cancel_requested and state.should_stop()


def test_reap_task_requeues_through_celery_enqueue(new_job, monkeypatch):
    from worker import entrypoints

    sent = Sent()
    monkeypatch.setattr(entrypoints, "enqueue_job", sent)
    job_id = new_job()
    _claim_and_expire(job_id)
    assert entrypoints.reap() == [job_id] and sent == [(job_id, "gpu")]
    assert entrypoints.run_job(job_id) == "succeeded"  # the task body is the runner


def test_run_task_requeues_a_machine_fault_through_celery_enqueue(new_job, monkeypatch):
    from worker import entrypoints

    sent = Sent()
    monkeypatch.setattr(entrypoints, "enqueue_job", sent)
    job_id = new_job("fake rankdied", gpus=2)
    assert entrypoints.run_job(job_id) == "queued" and sent == [(job_id, "gpu-2")]


def test_a_machine_fault_is_enqueued_to_the_broker_of_the_settings(new_job):
    from store.settings import get_settings
    from worker.celery_app import RUN_JOB_TASK, make_app

    job_id = new_job("fake rankdied", gpus=2)
    assert runner.run_job(job_id) == "queued"  # no enqueue given: the settings' broker
    with make_app(get_settings()).connection_for_read() as conn:
        message = conn.SimpleQueue("gpu-2").get(timeout=10)
    assert message.headers["task"] == RUN_JOB_TASK and message.payload[0] == [job_id]
    message.ack()


def test_worker_shutdown_stops_the_run_without_finishing_it(new_job):
    job_id = new_job("fake sleep=0.4")
    thread, result = run_in_thread(job_id)
    try:
        wait_for(lambda: job_row(job_id).step >= 1)
        lease.request_shutdown()
        thread.join(timeout=20)
    finally:
        lease.clear_shutdown()
    assert not thread.is_alive() and result["status"] is None
    job = job_row(job_id)
    assert job.status == JobStatus.running and job.attempt == 1  # left for the reaper
    assert "succeeded" not in [t for t, _ in events(job_id)]


def test_cancel_stops_builtin_tiny_during_its_warm_start(tenant_id, data_dir, monkeypatch):
    """The real trainer: a cancel lands while builtin:tiny is being warm-started (minutes of
    CPU on a fresh cache) and the job is cancelled within seconds, not after the warm start."""
    from store.settings import reset_settings_cache
    from tests.support.jobs import make_spec

    monkeypatch.setenv("BRORL_TRAINER_ENTRYPOINT", "trainer:train")
    monkeypatch.setenv("BRORL_CACHE_DIR", str(data_dir / "cache"))  # nothing cached: warm start
    reset_settings_cache()
    spec = make_spec("tiny warm start")
    spec["task"]["reasoning_gym"].update(train_size=200, eval_size=8)
    with session_scope() as s:
        job_id = jobs.create_job(s, tenant_id, spec, total_steps=3, name="tiny")[0].id
    thread, result = run_in_thread(job_id)
    wait_for(lambda: (data_dir / "cache" / "models").is_dir() and any(
        (data_dir / "cache" / "models").iterdir()), timeout=60)  # the build has begun
    with session_scope() as s:
        jobs.request_cancel(s, tenant_id, job_id)
    cancelled_at = time.monotonic()
    thread.join(timeout=30)
    assert not thread.is_alive() and result["status"] == "cancelled"
    assert time.monotonic() - cancelled_at < 15
    assert metric_steps(job_id) == []  # stopped before the first step
    assert not list((data_dir / "cache" / "models").glob("tiny-*"))  # the build was abandoned


def test_worker_rechecks_model_path_against_allowed_roots(tenant_id, tmp_path, monkeypatch):
    """A spec stored before the operator narrowed BRORL_MODEL_ROOTS (or never through the API)
    fails with a message naming model.path, and the trainer never starts."""
    from store.settings import reset_settings_cache
    from tests.support.jobs import make_spec

    root = tmp_path / "models"
    (root / "ok").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    monkeypatch.setenv("BRORL_MODEL_ROOTS", str(root))
    reset_settings_cache()

    def job_with_model(path: str) -> str:
        spec = make_spec()
        spec["model"] = {"path": path}
        with session_scope() as s:
            job, _ = jobs.create_job(s, tenant_id, spec, total_steps=3, name="m")
            return job.id

    cases = {"/etc": "allowed model root", str(root / "escape"): "allowed model root",
             "Qwen/Qwen2.5-0.5B": "BRORL_ALLOW_HUB_MODELS"}
    for path, why in cases.items():
        job_id = job_with_model(path)
        assert runner.run_job(job_id) == "failed"
        job = job_row(job_id)
        assert job.error.startswith("model.path: ") and why in job.error, job.error
        assert metric_steps(job_id) == []  # the trainer never ran
        assert events(job_id)[-1][0] == "failed"
    assert runner.run_job(job_with_model(str(root / "ok"))) == "succeeded"
    assert runner.run_job(job_with_model("builtin:tiny")) == "succeeded"


def test_sink_stores_nan_and_infinity_as_null(new_job):
    """PostgreSQL's jsonb refuses NaN (the whole write failed); the sink writes null."""
    import math

    from worker.sink import DbSink

    job_id = new_job()
    with session_scope() as s:
        attempt = jobs.claim(s, job_id, "w", lease_seconds=60).attempt
    sink = DbSink(job_id, attempt)
    sink.metrics(1, {"loss": math.nan, "grad": [1.0, math.inf], "ok": 0.5})
    with session_scope() as s:
        (row,) = s.query(Metric).filter_by(job_id=job_id).all()
        assert row.values == {"loss": None, "grad": [1.0, None], "ok": 0.5}


def test_every_write_goes_to_the_database_of_the_settings_given(new_job, tmp_path):
    """Claim, heartbeat, sink, outcome and reaper: all on `settings`' database, none on the
    process-wide one (an embedded stack or a test runs jobs with settings of its own)."""
    from store import keys
    from store.migrate import upgrade
    from store.settings import Settings
    from tests.support.jobs import make_spec

    other = Settings(data_dir=tmp_path / "other")
    other.ensure_dirs()
    upgrade(other.database_url)
    with session_scope(other.database_url) as s:
        tenant = keys.create_tenant(s, "elsewhere")
        job, _ = jobs.create_job(s, tenant.id, make_spec("fake sleep=0.3"), total_steps=3, name="x")
        job_id = job.id
    stranger = new_job()  # queued on the process-wide database: must stay untouched
    # Steps long enough for several beats: a heartbeat on the wrong database fences the run.
    assert runner.run_job(job_id, settings=other, enqueue=Sent()) == "succeeded"
    with session_scope(other.database_url) as s:
        done = s.get(Job, job_id)
        assert (done.status, done.attempt) == (JobStatus.succeeded, 1)
        assert sorted(m.step for m in s.query(Metric).filter_by(job_id=job_id)) == [1, 2, 3]
    assert job_row(stranger).status == JobStatus.queued and job_row(job_id) is None
    with session_scope(other.database_url) as s:
        assert jobs.claim(s, job_id, "w", lease_seconds=0.01) is None  # finished: not claimable
    assert runner.reap_and_requeue(Sent(), settings=other) == []


def test_the_lease_counts_from_the_start_of_the_work_not_from_the_claim(new_job):
    """Validating the stored spec may take longer than a short lease (reasoning-gym's first
    import): the work's first stop check must not take that for a lease that failed to renew."""
    from store.settings import get_settings

    settings = get_settings().model_copy(update={"lease_seconds": 0.5, "heartbeat_seconds": 30})
    claimed = lease.claim(new_job(), settings)
    time.sleep(0.6)  # no heartbeat yet: it starts with the work
    with claimed.held(max_wall_seconds=100) as state:
        assert state.should_stop() is False
        state.renewed -= 1.0  # and a lease that really went unrenewed is still lost
        with pytest.raises(Fenced):
            state.should_stop()
