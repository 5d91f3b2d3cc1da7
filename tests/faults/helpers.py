"""The fault suite's servers and job checks: a private Redis, worker processes, job state.

Redis is a `redis-server` of our own on a free port (never the shared one): the tests restart
and empty it. Workers are real `brorl worker` processes (prefork, one child, embedded beat for
the reaper) running the trainer double with a short lease, so a lost worker is noticed in
seconds. The fixtures that start them are in conftest.py.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from store.db import session_scope
from store.tables import Checkpoint, Job, JobEvent, Metric
from tests.support.jobs import FAKE_ENTRYPOINT, make_spec
from tests.support.services import redis_server_missing, require_service
from trainer.checkpoints import format as ckpt_format

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, logs: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tail = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                           for p in sorted(logs.glob("*.log"))) if logs else ""
            pytest.fail(f"{what}: not within {timeout} s{tail}")
        time.sleep(0.1)


class RedisServer:
    """A private redis-server without persistence: a restart empties it."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port, self.proc = folder, free_port(), None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        require_service("redis-server", redis_server_missing())
        exe = shutil.which("redis-server")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=open(self.folder / "redis.log", "ab"), stderr=subprocess.STDOUT)
        import redis

        client = redis.Redis(port=self.port)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False
        wait_for(up, 10, "redis-server up")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


class Stack:
    """Settings shared by this process and the worker processes it starts."""

    def __init__(self, folder: Path, pg_url: str, redis: RedisServer) -> None:
        self.folder, self.redis = folder, redis
        self.env = {**os.environ, "BRORL_DATA_DIR": str(folder / "data"),
                    "BRORL_DATABASE_URL": pg_url, "BRORL_BROKER_URL": redis.url,
                    "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT,
                    "BRORL_HEARTBEAT_SECONDS": "0.3", "BRORL_LEASE_SECONDS": "2",
                    "BRORL_REAPER_INTERVAL_SECONDS": "0.5",
                    "BRORL_REQUEUE_QUEUED_AFTER_SECONDS": "3", "PYTHONUNBUFFERED": "1"}
        self.workers: list[subprocess.Popen] = []

    def start_worker(self, pool: str = "prefork") -> subprocess.Popen:
        """A worker process: `prefork` (one fresh child per job, production's GPU workers) or
        `solo` (the job in the worker's main process, as `brorl up` runs it)."""
        log = open(self.folder / f"worker-{len(self.workers)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", "--beat", "--pool", pool],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers.append(proc)
        return proc

    def kill_workers(self) -> None:
        """SIGKILL every worker process group (the main process, its child, its beat)."""
        for proc in self.workers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        self.workers.clear()

    def submit(self, name: str, **kwargs) -> str:
        """Create a job row and enqueue it, as the API does (commit, then send)."""
        from store import jobs, keys
        from store.db import session_scope
        from worker.celery_app import enqueue_job

        with session_scope() as s:
            tenant = keys.create_tenant(s, "acme")
            job, _ = jobs.create_job(s, tenant.id, make_spec(name, **kwargs), total_steps=3, name=name)
            job_id = job.id
        enqueue_job(job_id)
        return job_id


def job(job_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, job_id)


def checkpoint_steps(job_id: str) -> list[int]:
    with session_scope() as s:
        return sorted(c.step for c in s.query(Checkpoint).filter_by(job_id=job_id))


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
