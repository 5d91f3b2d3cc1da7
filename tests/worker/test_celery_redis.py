"""A round trip through real servers: uvicorn + Redis + a `brorl worker` process + Postgres.

submit over HTTP -> the API commits and enqueues -> Redis -> the worker claims -> the fake
trainer writes 3 metric steps and a checkpoint -> the API serves them (download included).
Then the same message is delivered twice more and the job still runs exactly once.

The worker runs the production shape (prefork, one fresh child per job). The database is
a fresh Postgres database for this module; Redis uses its own DB number, flushed before and
after. Skipped (with the reason) when either server is down.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli.client import BrorlClient
from tests.support.jobs import FAKE_ENTRYPOINT, fresh_pg_database, make_spec
from tests.support.services import require_service

# A `brorl worker` process and uvicorn: the stack, started for real.
pytestmark = [pytest.mark.integration, pytest.mark.redis, pytest.mark.postgres,
              pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
REDIS_DB = 14  # not 0: keep clear of anything a developer runs by hand
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis():
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        require_service("Redis", f"not reachable on 127.0.0.1:6379: {exc}")
    return client


@pytest.fixture(scope="module")
def pg_url():
    with fresh_pg_database("brorl_worker") as url:
        yield url


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    from cli.server import stop_process

    stop_process(proc, timeout=15)


@pytest.fixture(scope="module")
def stack(pg_url, tmp_path_factory):
    """(client, env, logs dir): the API and a worker as subprocesses, torn down afterwards."""
    from store import keys
    from store.db import session_scope
    from store.migrate import upgrade

    redis_client = _redis()
    redis_client.flushdb()
    tmp = tmp_path_factory.mktemp("celery-redis")
    env = {**os.environ, "BRORL_DATA_DIR": str(tmp / "data"), "BRORL_DATABASE_URL": pg_url,
           "BRORL_BROKER_URL": REDIS_URL, "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT,
           "BRORL_HEARTBEAT_SECONDS": "0.5", "PYTHONUNBUFFERED": "1"}
    upgrade(pg_url)
    with session_scope(pg_url) as s:
        key = keys.create_key(s, "acme")
    port = _free_port()
    procs = [
        _start([sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory",
                "--host", "127.0.0.1", "--port", str(port)], env, tmp / "api.log"),
        _start([sys.executable, "-m", "cli.main", "worker", "--pool", "prefork"], env,
               tmp / "worker.log"),
    ]
    try:
        client = BrorlClient(f"http://127.0.0.1:{port}", key, timeout=30)
        deadline = time.monotonic() + 90
        while not client.ready():
            assert all(p.poll() is None for p in procs), _logs(tmp)
            assert time.monotonic() < deadline, "API not ready in 90 s\n" + _logs(tmp)
            time.sleep(0.5)
        yield client, env, tmp
    finally:
        for proc in procs:
            _stop(proc)
        redis_client.flushdb()


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(folder.glob("*.log")))


def _wait_final(client: BrorlClient, job_id: str, folder: Path) -> dict:
    try:
        return client.wait(job_id, poll=0.3, timeout=120)
    except TimeoutError:
        pytest.fail(f"job {job_id} did not finish\n{_logs(folder)}")


def test_submit_runs_on_the_worker_and_the_api_serves_results(stack, tmp_path):
    client, _, logs = stack
    job = client.submit(make_spec("redis round trip"))
    assert job["status"] == "queued"
    final = _wait_final(client, job["id"], logs)
    assert final["status"] == "succeeded", final
    assert final["step"] == 3 and final["attempt"] == 1
    rows = client.metrics(job["id"])["data"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["values"]["loss"] == pytest.approx(1 / 3)
    (ckpt,) = client.list_checkpoints(job["id"])["data"]
    assert ckpt["step"] == 3
    dest = client.download(job["id"], None, tmp_path / "ckpt")
    assert (dest / "config.json").is_file() and (dest / "model.safetensors").stat().st_size == 2048


def test_same_message_twice_runs_once(stack):
    from store.settings import Settings
    from worker.celery_app import make_app

    client, env, logs = stack
    job = client.submit(make_spec("delivered three times"))
    sender = make_app(Settings(data_dir=Path(env["BRORL_DATA_DIR"]), broker_url=REDIS_URL))
    try:
        for _ in range(2):  # the API already sent one
            sender.send_task("brorl.run_job", args=[job["id"]], queue="gpu")
    finally:
        sender.close()
    final = _wait_final(client, job["id"], logs)
    assert final["status"] == "succeeded" and final["attempt"] == 1
    # Wait until the worker has actually consumed both duplicates (and refused them).
    refused = f"job {job['id']} is not claimable"
    deadline = time.monotonic() + 60
    while (logs / "worker.log").read_text(errors="replace").count(refused) < 2:
        assert time.monotonic() < deadline, "duplicates not consumed\n" + _logs(logs)
        time.sleep(0.3)
    types = [e["type"] for e in client.events(job["id"])["data"]]
    assert types.count("started") == 1, types
    assert types.count("succeeded") == 1
    assert client.get_job(job["id"])["attempt"] == 1


def test_unauthenticated_request_is_refused(stack):
    client, _, _ = stack
    response = httpx.get(f"{client.base_url}/v1/jobs", timeout=10)
    assert response.status_code == 401
