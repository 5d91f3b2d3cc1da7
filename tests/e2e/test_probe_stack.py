"""Probes through the embedded stack: `brorl up` as a subprocess (SQLite, SQLite broker, the API
and one real worker), a real probe of builtin:tiny, driven over HTTP as a user would.

Queued -> running with progress events -> succeeded with a result; a cancel that reaches a
running probe between chunks; another tenant's probe is a 404. (A retry after a killed worker:
tests/faults/test_probe_retry.py, which needs worker processes it can SIGKILL.)
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from store import keys
from store.db import reset_engine_cache, session_scope
from tests.support.tinyprebuild import prebuild
from tests.support.upstack import Stack, running_stack
from trainer.probe_spec import ProbeSpec, base_job_spec
from trainer.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TASK = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
                          "train_size": 500, "eval_size": 16}}
BODY = {"task": TASK, "n": 32, "prompts": 4, "max_new_tokens": 24, "chunk_samples": 32, "engine": "hf",
        "seed": 1}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    # The worker finds builtin:tiny in the suite's cache (BRORL_CACHE_DIR is inherited).
    prebuild(base_job_spec(ProbeSpec.model_validate(BODY)), sft_steps=150)
    with running_stack(tmp_path_factory.mktemp("probes"), {
            "BRORL_HEARTBEAT_SECONDS": "0.5", "BRORL_REAPER_INTERVAL_SECONDS": "5",
            "BRORL_TORCH_THREADS": "1"}) as st:
        yield st


def _client(stack: Stack, key: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key or stack.key}"},
                        timeout=30)


def _wait(client: httpx.Client, probe_id: str, until, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = client.get(f"/v1/probes/{probe_id}").json()
        if until(row):
            return row
        assert time.monotonic() < deadline, row
        time.sleep(0.5)


def _events(client: httpx.Client, probe_id: str) -> list[dict]:
    return client.get(f"/v1/probes/{probe_id}/events", params={"limit": 1000}).json()["data"]


def test_probe_queued_progress_result(stack):
    client = _client(stack)
    created = client.post("/v1/probes", json=BODY)
    assert created.status_code == 201, created.text
    probe_id = created.json()["id"]
    assert created.json()["status"] == "queued"
    row = _wait(client, probe_id, lambda r: r["status"] not in ("queued", "running"))
    assert row["status"] == "succeeded", (row, stack.output()[-3000:])
    types = [e["type"] for e in _events(client, probe_id)]
    assert types[:2] == ["created", "started"] and types[-1] == "succeeded"
    progress = [e["data"] for e in _events(client, probe_id) if e["type"] == "progress"]
    assert [p["done"] for p in progress] == [32, 64, 96, 128] and progress[-1]["total"] == 128
    assert row["step"] == row["total_steps"] == 128
    result = row["result"]
    assert len(result["per_prompt"]) == 4 and list(result["pass_at_k"]) == ["1", "2", "4", "8", "16", "32"]
    assert result["samples"] == 128 and result["recommendation"]["reason"]
    # Another tenant sees nothing of it.
    with session_scope(f"sqlite:///{stack.data_dir / 'brorl.db'}") as s:
        other = keys.create_key(s, "other-tenant")
    reset_engine_cache()
    with _client(stack, other) as foreign:
        assert foreign.get(f"/v1/probes/{probe_id}").status_code == 404
        assert foreign.post(f"/v1/probes/{probe_id}/cancel").status_code == 404
        assert foreign.get("/v1/probes").json()["data"] == []


def test_cancel_reaches_a_running_probe(stack):
    client = _client(stack)
    probe_id = client.post("/v1/probes", json={**BODY, "n": 2048, "chunk_samples": 64}).json()["id"]
    _wait(client, probe_id, lambda r: r["step"] > 0)  # at least one chunk done: it is running
    resp = client.post(f"/v1/probes/{probe_id}/cancel")
    assert resp.status_code == 200 and resp.json()["cancel_requested"]
    row = _wait(client, probe_id, lambda r: r["status"] not in ("queued", "running"), timeout=120)
    assert row["status"] == "cancelled" and row["result"] is None
    assert row["step"] < row["total_steps"]  # it stopped between chunks, long before the end


def test_cli_probe_on_the_service_then_submit_the_recommendation(stack, tmp_path):
    spec = {"name": "probe-cli", "seed": 1, "model": {"path": "builtin:tiny"}, "task": TASK,
            "rollout": {"engine": "hf", "max_new_tokens": 24,
                        "schedule": [{"n": 16, "prompts_per_step": 8, "steps": 20}]}}
    spec_file, written = tmp_path / "spec.yaml", tmp_path / "recommended.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    out = stack.brorl("probe", str(spec_file), "--n", "32", "--prompts", "4", "--remote", "--submit",
                      "--poll", "0.5", "--write", str(written), key=stack.key, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "pass@k" in text and "submitted job" in text, text
    recommended = JobSpec.model_validate(yaml.safe_load(written.read_text()))
    assert recommended.task.reasoning_gym.name == "chain_sum"
    assert recommended.rollout.schedule[0].prompts_per_step == 8  # the given spec's prompts kept
    client = _client(stack)
    jobs = client.get("/v1/jobs").json()["data"]
    assert len(jobs) == 1 and jobs[0]["name"] == "probe-cli"
    client.post(f"/v1/jobs/{jobs[0]['id']}/cancel")  # the job itself is not this test's business
