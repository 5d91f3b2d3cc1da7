"""The embedded default end to end: `brorl up` as a subprocess on an empty data dir.

One stack for the module (SQLite database + SQLite broker, the API and one worker with the
fake trainer), driven over HTTP and through the `brorl` CLI exactly as a user would; the last
test stops it with Ctrl-C (SIGINT) and checks every process it started is gone.
"""
from __future__ import annotations

import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.client import BrorlAPIError, BrorlClient
from tests.support.upstack import Stack, running_stack
from tests.support.jobs import FAKE_ENTRYPOINT, make_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]  # `brorl up` as a subprocess

REPO = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> set[int]:
    """Live processes below `pid` (children, grandchildren), read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(entry.name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("embedded"), {
            "BRORL_TRAINER_ENTRYPOINT": FAKE_ENTRYPOINT, "BRORL_HEARTBEAT_SECONDS": "0.5",
            "BRORL_REAPER_INTERVAL_SECONDS": "5",
            "BRORL_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}) as stack:  # the webhook test's receiver
        yield stack


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return (stack.data_dir / "local.key").read_text().strip()


@pytest.fixture(scope="module")
def client(stack: Stack, key: str) -> BrorlClient:
    return BrorlClient(stack.url, key, timeout=30)


def _final(client: BrorlClient, job_id: str, stack: Stack) -> dict:
    try:
        return client.wait(job_id, poll=0.3, timeout=90)
    except TimeoutError:
        pytest.fail(f"job {job_id} did not finish\n{stack.output()[-5000:]}")


def test_health_and_the_printed_key(stack: Stack, key: str):
    assert httpx.get(f"{stack.url}/healthz", timeout=5).status_code == 200
    assert key.startswith("brorl_") and key in stack.output()
    assert stack.url in stack.output()
    assert stat.S_IMODE((stack.data_dir / "local.key").stat().st_mode) == 0o600


def test_job_runs_to_success(client: BrorlClient, stack: Stack, tmp_path: Path):
    created = client._request("POST", "/v1/jobs", json=make_spec("embedded"))
    assert created.status_code == 201
    job = _final(client, created.json()["id"], stack)
    assert job["status"] == "succeeded", job
    assert [r["step"] for r in client.metrics(job["id"])["data"]] == [1, 2, 3]
    dest = client.download(job["id"], 3, tmp_path / "ckpt")
    assert (dest / "config.json").is_file()


def test_invalid_spec_is_a_422_naming_the_field(client: BrorlClient):
    spec = make_spec()
    spec["rollout"]["schedule"][0]["n"] = 1
    with pytest.raises(BrorlAPIError) as err:
        client.submit(spec)
    assert err.value.status == 422 and err.value.field == "rollout.schedule.0.n"


def test_pagination(client: BrorlClient):
    ids = [client.submit(make_spec(f"page {i}"))["id"] for i in range(3)]
    first = client.list_jobs(limit=2)
    assert [j["id"] for j in first["data"]] == ids[::-1][:2] and first["has_more"]
    rest = client.list_jobs(limit=100, after=first["data"][-1]["id"])
    assert ids[0] in [j["id"] for j in rest["data"]]
    assert not set(j["id"] for j in rest["data"]) & set(j["id"] for j in first["data"])


def test_idempotency_key(client: BrorlClient):
    first = client.submit(make_spec("idem"), idempotency_key="idem-1")
    again = client.submit(make_spec("idem"), idempotency_key="idem-1")
    assert again["id"] == first["id"]
    with pytest.raises(BrorlAPIError) as err:
        client.submit(make_spec("idem, other body"), idempotency_key="idem-1")
    assert err.value.status == 409


def test_tenant_scoping(stack: Stack, client: BrorlClient):
    mine = client.submit(make_spec("mine"))["id"]
    result = stack.brorl("keys", "create", "--tenant", "other", "--data-dir", str(stack.data_dir))
    assert result.returncode == 0, result.stderr
    other = BrorlClient(stack.url, result.stdout.strip().splitlines()[-1], timeout=30)
    with pytest.raises(BrorlAPIError) as err:
        other.get_job(mine)
    assert err.value.status == 404
    assert other.list_jobs()["data"] == []


def test_cancel_queued_and_running_jobs(client: BrorlClient, stack: Stack):
    # One worker runs one job at a time: while a slow job runs, the next one stays queued.
    slow = client.submit(make_spec("fake sleep=2"))["id"]
    deadline = time.monotonic() + 90
    while client.get_job(slow)["status"] != "running":
        assert time.monotonic() < deadline, stack.output()[-5000:]
        time.sleep(0.2)
    queued = client.submit(make_spec("waiting"))["id"]
    assert client.cancel(queued)["status"] == "cancelled"
    running = client.cancel(slow)
    assert running["status"] == "running" and running["cancel_requested"]
    assert _final(client, slow, stack)["status"] == "cancelled"
    assert client.get_job(queued)["status"] == "cancelled"
    with pytest.raises(BrorlAPIError) as err:
        client.cancel(queued)
    assert err.value.status == 409 and "cancelled" in err.value.message


def test_cli_round_trip(stack: Stack, key: str, tmp_path: Path):
    import yaml

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(make_spec("from the cli")))
    submitted = stack.brorl("submit", str(spec_file), "--wait", key=key)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.split()[0]
    assert re.search(r"step\s+3", submitted.stdout) and "succeeded" in submitted.stdout
    listed = stack.brorl("jobs", "list", "--limit", "5", key=key)
    assert listed.returncode == 0 and job_id[:12] in listed.stdout
    shown = stack.brorl("metrics", job_id, key=key)
    assert shown.returncode == 0 and "metrics" in shown.stdout
    out = tmp_path / "ckpt"
    downloaded = stack.brorl("download", job_id, "-o", str(out), key=key)
    assert downloaded.returncode == 0, downloaded.stderr
    assert (out / "config.json").is_file()
    spec_file.write_text(yaml.safe_dump({**make_spec(), "bogus": 1}))
    refused = stack.brorl("submit", str(spec_file), key=key)
    assert refused.returncode == 1 and "bogus" in refused.stderr and "error" in refused.stderr
    # No BRORL_API_KEY: the CLI falls back to <data dir>/local.key.
    env_data_dir = {**stack.env, "BRORL_DATA_DIR": str(stack.data_dir), "BRORL_URL": stack.url}
    env_data_dir.pop("BRORL_API_KEY", None)
    fallback = subprocess.run([sys.executable, "-m", "cli.main", "jobs", "show", job_id],
                              cwd=REPO, env=env_data_dir, capture_output=True, text=True, timeout=60)
    assert fallback.returncode == 0 and job_id in fallback.stdout


def test_dataset_upload_and_a_job_on_it(stack: Stack, key: str, client: BrorlClient,
                                        tmp_path: Path):
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1", "answer": "{i + 1}"}}\n' for i in range(30)))
    uploaded = stack.brorl("datasets", "upload", str(data), "--name", "sums", key=key)
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    dataset_id = uploaded.stdout.split()[0]
    listed = stack.brorl("datasets", "list", key=key)
    assert listed.returncode == 0 and "sums" in listed.stdout
    spec = make_spec("on a dataset")
    spec["task"] = {"dataset": {"id": dataset_id, "verifier": "numeric"}}
    job = _final(client, client.submit(spec)["id"], stack)
    assert job["status"] == "succeeded", job


def test_a_webhook_tells_of_a_job_that_succeeded(stack: Stack, key: str, client: BrorlClient):
    """Registered with the CLI, told by the running API's own dispatcher (the worker writes the
    events, the outbox carries them), signed, and shown delivered in the CLI's log."""
    from standardwebhooks import Webhook

    from tests.api.test_webhooks import Receiver

    receiver = Receiver()
    try:
        created = stack.brorl("webhooks", "create", receiver.url, "--event", "job.succeeded",
                              "--event", "job.checkpoint_saved", key=key)
        assert created.returncode == 0, created.stdout + created.stderr
        endpoint_id, secret = created.stdout.split()[0], re.search(r"whsec_\S+", created.stdout).group(0)
        job = _final(client, client.submit(make_spec("told"))["id"], stack)
        assert job["status"] == "succeeded", job
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(b"job.succeeded" in r["body"] for r in receiver.requests):
            time.sleep(0.2)
        told = [Webhook(secret).verify(r["body"], r["headers"]) for r in receiver.requests]
        assert [t["type"] for t in told] == ["job.checkpoint_saved", "job.succeeded"], told
        assert {t["data"]["id"] for t in told} == {job["id"]}
        log = stack.brorl("webhooks", "deliveries", endpoint_id, key=key)
        assert log.returncode == 0 and log.stdout.count("delivered") == 2, log.stdout
    finally:
        receiver.close()


def test_brorl_continue_starts_a_job_from_the_parents_checkpoint(stack: Stack, key: str, client: BrorlClient):
    """`brorl continue JOB --broad` submits the continuation; the worker hands the trainer the
    parent's checkpoint folder (the test trainer names it in its first event)."""
    parent = _final(client, client.submit(make_spec("parent"))["id"], stack)
    assert parent["status"] == "succeeded", parent
    out = stack.brorl("continue", parent["id"], "--broad", "--optimizer", "--wait", key=key)
    assert out.returncode == 0, out.stdout + out.stderr
    child_id = out.stdout.split()[0]
    child = client.get_job(child_id)
    assert child["status"] == "succeeded" and child["parent_job_id"] == parent["id"]
    assert child["spec"]["continue_from"] == {"job": parent["id"], "step": 3, "optimizer": True}
    assert child["spec"]["rollout"]["schedule"][0]["n"] == 4 * parent["spec"]["rollout"]["schedule"][-1]["n"]
    started = [e for e in client.events(child_id)["data"] if e["type"] == "stage_started"]
    from trainer.checkpoints.format import folder_name

    assert (started[0]["data"]["continued_from"], started[0]["data"]["optimizer"]) == (folder_name(3), True), started
    assert [j["id"] for j in client.continuations(parent["id"])["data"]] == [child_id]


def test_ctrl_c_stops_everything(stack: Stack):
    children = _descendants(stack.proc.pid)
    assert len(children) >= 2, "expected the API and the worker under brorl up"
    stack.proc.send_signal(signal.SIGINT)
    try:
        code = stack.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stack.proc.send_signal(signal.SIGUSR1)  # `brorl up` dumps every thread's stack (faulthandler)
        time.sleep(2)
        pytest.fail("brorl up still running 60 s after Ctrl-C:\n" + stack.output()[-6000:])
    assert code == 0, stack.output()[-3000:]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in children if _alive(pid)], stack.output()[-3000:]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{stack.url}/healthz", timeout=2)
    assert "stopped" in stack.output()
