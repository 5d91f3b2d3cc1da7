"""A tenant's pathological task config cannot stall the service.

Through the real stack (`brorl up`: the API, one worker, the SQLite database and broker), a
tenant submits a reasoning-gym config that passes the submission checks (every number in
bounds, a few examples build quickly) but whose full training split takes far longer than the
worker's build limit. The worker builds it in a child process: its lease keeps being renewed
while the child works, the job fails with a clear error once the limit passes, another
tenant's job queued behind it then starts and finishes, and a cancel of a second such job
takes effect within seconds instead of after the build.
"""
from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.client import BrorlClient
from tests.support.upstack import Stack, running_stack
from tests.support.jobs import FAKE_ENTRYPOINT, make_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]  # `brorl up` as a subprocess

BUILD_TIMEOUT_S = 8
LEASE_S = 4


def _pathological(name: str) -> dict:
    spec = make_spec(name)
    # In bounds (terms and digits at most 100 each) and quick for a few examples, but ten
    # million of them is minutes of work and gigabytes.
    spec["task"] = {"reasoning_gym": {"name": "chain_sum", "train_size": 10_000_000,
                                      "config": {"min_terms": 60, "max_terms": 60,
                                                 "min_digits": 90, "max_digits": 90}}}
    return spec


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("tenant-config"), {
            "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT, "BRORL_HEARTBEAT_SECONDS": "0.3",
            "BRORL_LEASE_SECONDS": str(LEASE_S), "BRORL_REAPER_INTERVAL_SECONDS": "1",
            "BRORL_TASK_BUILD_TIMEOUT_S": str(BUILD_TIMEOUT_S),
            "BRORL_TASK_BUILD_MEMORY_MB": "2048"}) as stack:
        yield stack


def _client(stack: Stack, tenant: str) -> BrorlClient:
    result = stack.brorl("keys", "create", "--tenant", tenant, "--data-dir", str(stack.data_dir))
    assert result.returncode == 0, result.stderr
    return BrorlClient(stack.url, result.stdout.strip().splitlines()[-1], timeout=30)


def _heartbeat(data_dir: Path, job_id: str) -> str | None:
    with sqlite3.connect(data_dir / "brorl.db", timeout=10) as db:
        row = db.execute("SELECT heartbeat_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return row[0] if row else None


def _wait_status(client: BrorlClient, job_id: str, wanted: set[str], timeout: float,
                 stack: Stack) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get_job(job_id)
        if job["status"] in wanted:
            return job
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} is {job['status']}, not {wanted} after {timeout} s\n"
                        f"{stack.output()[-5000:]}")
        time.sleep(0.1)


def test_a_pathological_config_fails_alone_and_the_worker_carries_on(stack: Stack):
    hostile, other = _client(stack, "hostile"), _client(stack, "bystander")
    bad = hostile.submit(_pathological("build slow"))["id"]
    theirs = other.submit(make_spec("bystander"))["id"]
    _wait_status(hostile, bad, {"running"}, 90, stack)
    beats: set[str] = set()
    deadline = time.monotonic() + BUILD_TIMEOUT_S + 30
    while hostile.get_job(bad)["status"] == "running":  # the child builds; the lease goes on
        assert time.monotonic() < deadline, stack.output()[-5000:]
        beats.add(_heartbeat(stack.data_dir, bad))
        time.sleep(0.2)
    # From the first renewal on (the claim's own timestamp comes first; a fresh worker's
    # first run also starts the fork server), no gap reaches the lease while the child works.
    times = sorted(datetime.fromisoformat(b) for b in beats - {None})[1:]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    assert len(times) >= 10 and max(gaps) < LEASE_S / 2, (len(times), max(gaps, default=None))
    failed = hostile.get_job(bad)
    assert failed["status"] == "failed", failed
    assert f"took longer than {BUILD_TIMEOUT_S} s" in failed["error"], failed
    assert failed["attempt"] == 1  # failed once, by the limit: not reaped, not retried
    done = _wait_status(other, theirs, {"succeeded", "failed", "cancelled"}, 60, stack)
    assert done["status"] == "succeeded", done


def test_a_cancel_stops_a_build_within_seconds(stack: Stack):
    hostile = _client(stack, "hostile-2")
    job = hostile.submit(_pathological("build cancel me"))["id"]
    _wait_status(hostile, job, {"running"}, 90, stack)
    time.sleep(0.5)  # into the build
    start = time.monotonic()
    hostile.cancel(job)
    final = _wait_status(hostile, job, {"cancelled", "failed", "succeeded"}, 30, stack)
    assert final["status"] == "cancelled", final
    assert time.monotonic() - start < 5
