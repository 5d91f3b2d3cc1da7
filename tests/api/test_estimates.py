"""Estimates (`POST /v1/jobs?dry_run=true`), a queued job's place in its queue and a running
job's ETA (`GET /v1/jobs/{id}`), on SQLite and PostgreSQL. The figures are computed by hand
from the spec and from the metric rows each test writes through the store."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from store import jobs as store_jobs
from store.db import session_scope
from store.tables import Job, JobStatus
from trainer.spec import JobSpec

from tests.api.helpers import assert_error, make_spec

# 3 steps x 2 prompts x 4 + 2 steps x 1 prompt x 8 = 40 samples; 2 evaluations (before the
# first update and at the end; eval.every 50 > 5 steps) x 10 prompts x 16 = 320 samples.
ROLLOUT = {"engine": "hf", "max_new_tokens": 32,
           "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 3},
                        {"n": 8, "prompts_per_step": 1, "steps": 2}]}
# Qwen2-7B's shape: ~7.6 B parameters.
QWEN_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
           "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "vocab_size": 152064, "tie_word_embeddings": False}


def _dry_run(client, auth, **overrides):
    resp = client.post("/v1/jobs?dry_run=true", json=make_spec(rollout=ROLLOUT, **overrides),
                       headers=auth)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture
def app_with(settings, enqueued):
    """Builds an app on the test database with some settings changed."""
    made = []

    def build(**changes):
        client = TestClient(create_app(settings.model_copy(update=changes), enqueue=enqueued))
        made.append(client.__enter__())
        return made[-1]

    yield build
    for client in made:
        client.__exit__(None, None, None)


def test_dry_run_counts_the_schedule_and_the_evaluations(client, auth):
    est = _dry_run(client, auth)
    assert est["object"] == "job.estimate" and est["steps"] == 5 and est["gpus"] == 1
    assert [(s["samples"], s["response_tokens_max"]) for s in est["stages"]] == [(24, 768), (16, 512)]
    assert est["evaluation"] == {"count": 2, "prompts": 10, "samples_per_prompt": 16,
                                 "samples": 320, "response_tokens_max": 10240}
    assert est["samples"] == 360 and est["response_tokens_max"] == 360 * 32
    assert "max_new_tokens" in est["tokens_note"]
    # No finished job yet: the small-model default (20 s start-up, 1/1800 s per step token,
    # 1/10000 s per generated one): 20 + 1280/1800 + 10240/10000.
    wall = est["wall_time"]
    assert wall["throughput"]["source"] == "default" and wall["throughput"]["jobs"] == 0
    assert "no measurements yet" in wall["derivation"]
    assert wall["parts"] == {"startup": 20.0, "steps": 0.7, "evaluation": 1.0, "total": 21.7}
    assert wall["past_accuracy"]["jobs"] == 0
    # builtin:tiny's 604,800 parameters; no BRORL_WORKER_MEMORY_GB: the fit is not checked.
    assert est["memory"]["params"] == 604_800 and est["memory"]["params_from"] == "builtin"
    assert est["fits"] is None and "not set" in est["memory"]["note"]


def test_dry_run_stores_and_enqueues_nothing(client, auth, enqueued, database_url):
    _dry_run(client, auth)
    assert enqueued == []
    assert client.get("/v1/jobs", headers=auth).json()["data"] == []
    with session_scope(database_url) as s:
        assert s.query(Job).count() == 0


def test_dry_run_runs_the_submission_checks(app_with, auth):
    client = app_with(max_active_jobs_per_tenant=1)
    bad = make_spec(rollout=ROLLOUT, resources={"gpus_per_node": 2})
    assert_error(client.post("/v1/jobs?dry_run=true", json=bad, headers=auth), 422,
                 field="resources.gpus_per_node")
    assert client.post("/v1/jobs", json=make_spec(), headers=auth).status_code == 201
    # A real submission would now be over the quota, so the dry run is refused as it would be.
    assert_error(client.post("/v1/jobs?dry_run=true", json=make_spec(), headers=auth), 429,
                 "quota_exceeded")


def test_a_spec_too_big_for_the_workers_memory_is_named(app_with, auth, tmp_path: Path):
    model = tmp_path / "models" / "qwen-7b"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN_7B))
    client = app_with(model_roots=str(tmp_path / "models"), worker_memory_gb=80)
    full = _dry_run(client, auth, model={"path": str(model)})
    mem = full["memory"]
    assert mem["params_from"] == "config.json" and 7.5e9 < mem["params"] < 7.7e9
    # bf16 weights 2 + float32 masters 4, gradients 4, AdamW 8 + a bf16 reference 2: 20 bytes
    # a parameter, ~141 GiB before activations.
    assert mem["bytes"]["gradients_and_optimizer"] == mem["params"] * 16
    assert full["fits"] is False and mem["total_gb"] > 140 and mem["worker_gb"] == 80
    # The default 7B rates (no measurements): far slower than the tiny model's.
    assert full["wall_time"]["throughput"]["step_seconds_per_token"] == pytest.approx(mem["params"] / 1.2e13)
    lora = _dry_run(client, auth, model={"path": str(model), "lora": {"rank": 16}})
    assert lora["fits"] is True and lora["memory"]["total_gb"] < 30
    assert "gradients_and_optimizer" not in lora["memory"]["bytes"]


def _finished_job(database_url: str, tenant_key_job: str, steps: list[dict], wall_s: float) -> None:
    """Runs a submitted job through the store: claimed, its step rows, succeeded, with the
    wall time `wall_s`."""
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, tenant_key_job, "w", lease_seconds=60)
        store_jobs.record_metrics(s, tenant_key_job, claim.attempt, 0, {"eval/pass@1": 0.1})
        for i, values in enumerate(steps, start=1):
            store_jobs.record_metrics(s, tenant_key_job, claim.attempt, i, values)
        store_jobs.finish(s, tenant_key_job, claim.attempt, JobStatus.succeeded)
        job = s.get(Job, tenant_key_job)
        job.finished_at = job.started_at + timedelta(seconds=wall_s)


def test_history_changes_the_estimate(client, auth, other_auth, database_url):
    # Another tenant's finished run of builtin:tiny: 2 steps of 4 x 2 samples of 32 tokens,
    # each 4 s (1 s generating), 100 s in all with 2 evaluations of 10 x 16 samples.
    past = client.post("/v1/jobs", json=make_spec(rollout={
        **ROLLOUT, "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 2}]}), headers=other_auth)
    step = {"n": 4, "prompts": 2, "samples": 8, "step_s": 4.0, "gen_s": 1.0}
    _finished_job(database_url, past.json()["id"], [step, step], wall_s=100)
    est = _dry_run(client, auth)
    wall = est["wall_time"]
    # step: 8 s / (16 x 32) tokens; generation: 2 s / (16 x 32); start-up: 100 - 8 - 10240 x
    # 2/512 = 52 s. The spec: 52 + 1280 x 8/512 + 10240 x 2/512 = 52 + 20 + 40.
    assert wall["throughput"] == {"source": "measured", "jobs": 1, "step_seconds_per_token": 8 / 512,
                                  "generation_seconds_per_token": 2 / 512, "startup_seconds": 52.0}
    assert wall["parts"] == {"startup": 52.0, "steps": 20.0, "evaluation": 40.0, "total": 112.0}
    assert "measured on 1 finished job" in wall["derivation"]
    # How far off: the default (no other job of the model) would have said 20 + 512/1800 +
    # 10240/10000 s for a run that took 100 s.
    acc = wall["past_accuracy"]
    assert acc["jobs"] == 1
    assert acc["median_actual_over_estimate"] == pytest.approx(100 / (20 + 512 / 1800 + 1.024), abs=1e-3)
    assert past.json()["id"] not in json.dumps(est)  # numbers only, never another tenant's ids


def test_queue_position_counts_other_tenants_without_showing_them(client, auth, other_auth, database_url):
    ids = [client.post("/v1/jobs", json=make_spec(), headers=h).json()["id"]
           for h in (auth, other_auth, auth, other_auth)]
    mine, theirs = client.get(f"/v1/jobs/{ids[2]}", headers=auth).json(), ids[1]
    assert mine["queue"] == {"position": 3, "gpus": 1, "multi_node": False, "ahead": 2,
                             "yours_ahead": [ids[0]], "others_ahead": 1, "running": 0}
    assert theirs not in json.dumps(mine)
    with session_scope(database_url) as s:
        store_jobs.claim(s, ids[0], "w", lease_seconds=60)
    assert client.get(f"/v1/jobs/{ids[2]}", headers=auth).json()["queue"] == {
        "position": 2, "gpus": 1, "multi_node": False, "ahead": 1, "yours_ahead": [], "others_ahead": 1,
        "running": 1}
    last = client.get(f"/v1/jobs/{ids[3]}", headers=other_auth).json()["queue"]
    assert last["position"] == 3 and last["yours_ahead"] == [ids[1]] and last["others_ahead"] == 1
    running = client.get(f"/v1/jobs/{ids[0]}", headers=auth).json()
    assert running["queue"] is None



def test_multi_node_jobs_queue_apart_from_one_node_jobs(settings, enqueued, auth):
    """A multi-node job waits on its Ray drivers' queue, not on its GPU count's: neither kind
    counts ahead of the other, and the estimate names the queue it would join."""
    served = settings.model_copy(update={"ray_address": "head:6379", "ray_max_nodes": 4,
                                         "ray_gpus_per_node": 1})
    with TestClient(create_app(served, enqueue=enqueued)) as client:
        one = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
        two = client.post("/v1/jobs", json=make_spec(resources={"nodes": 2}), headers=auth).json()["id"]
        three = client.post("/v1/jobs", json=make_spec(resources={"nodes": 3}), headers=auth).json()["id"]
        last = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
        place = {j: client.get(f"/v1/jobs/{j}", headers=auth).json()["queue"] for j in (one, two, three, last)}
        est = client.post("/v1/jobs?dry_run=true", json=make_spec(resources={"nodes": 2}), headers=auth).json()
        single = client.post("/v1/jobs?dry_run=true", json=make_spec(), headers=auth).json()
    assert enqueued.queues == {one: "gpu", two: "ray", three: "ray", last: "gpu"}
    assert (place[one]["position"], place[one]["multi_node"]) == (1, False)
    assert (place[two]["position"], place[two]["multi_node"]) == (1, True)
    assert place[three]["position"] == 2 and place[three]["yours_ahead"] == [two]
    assert place[last]["position"] == 2 and place[last]["yours_ahead"] == [one]
    assert (est["multi_node"], est["queued_ahead"]) == (True, 2)
    assert (single["multi_node"], single["queued_ahead"]) == (False, 2)


def test_a_running_job_has_an_eta_from_its_own_steps(client, auth, database_url):
    job_id = client.post("/v1/jobs", json=make_spec(rollout=ROLLOUT), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "w", lease_seconds=60)
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["eta_seconds"] is None
    step = {"n": 4, "prompts": 2, "samples": 8, "step_s": 2.0, "gen_s": 0.5}
    with session_scope(database_url) as s:
        store_jobs.record_metrics(s, job_id, claim.attempt, 0, {"eval/pass@1": 0.1})
        for i in (1, 2):
            store_jobs.record_metrics(s, job_id, claim.attempt, i, step)
    body = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    # Left: 1 step of 8 samples + 2 of 8 = 24 samples x 32 tokens x 4/512 s = 6 s, and the
    # final evaluation's 160 samples x 32 x 1/512 s = 10 s.
    assert body["eta_seconds"] == 16.0 and body["eta_at"] and body["queue"] is None


def test_estimate_model_counts_evaluations_like_the_loop():
    from api.estimate_model import evaluation_count, work

    assert evaluation_count(100, 50) == 3 and evaluation_count(101, 50) == 4
    assert evaluation_count(7, 0) == 2
    spec = JobSpec.model_validate(make_spec(rollout=ROLLOUT, eval={"every": 2}))
    assert work(spec, 10)["evaluation"]["count"] == 4  # before, at 2 and 4, at the end (5)


def _cli(client, auth, monkeypatch, *args: str):
    """Runs `brorl ARGS` against the test app (the CLI's client over the TestClient)."""
    from typer.testing import CliRunner

    from cli import remote
    from cli.client import BrorlClient
    from cli.main import app as cli_app

    brorl = BrorlClient("http://testserver", None)
    brorl._http.close()
    brorl._http = client
    client.headers.update(auth)
    monkeypatch.setattr(remote, "make_client", lambda *a, **k: brorl)
    monkeypatch.setattr(BrorlClient, "close", lambda self: None)  # the test owns the TestClient
    return CliRunner().invoke(cli_app, list(args))


def test_cli_dry_run_and_jobs_show(client, auth, enqueued, monkeypatch, tmp_path: Path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(make_spec(rollout=ROLLOUT)))
    result = _cli(client, auth, monkeypatch, "submit", "--dry-run", str(spec))
    assert result.exit_code == 0, result.output
    assert "stage 1: 2 steps x 1 prompts x n=8 = 16 samples, <= 512 tokens" in result.output
    assert "about 22 s" in result.output and "no measurements yet" in result.output
    assert enqueued == []
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    result = _cli(client, auth, monkeypatch, "jobs", "show", job_id)
    assert result.exit_code == 0, result.output
    assert "queued: position 1 on the 1-GPU queue" in result.output and job_id in result.output


def test_progress_line_of_a_running_job():
    from cli.estimates import duration, progress_line

    assert duration(59) == "59 s" and duration(200) == "3 min 20 s" and duration(7500) == "2 h 05 min"
    job = {"queue": None, "eta_seconds": 200.0, "eta_at": "2026-01-01T10:00:00Z", "step": 2,
           "total_steps": 5}
    assert progress_line(job) == "running: step 2/5, about 3 min 20 s left (ETA 2026-01-01T10:00:00Z)"
    assert progress_line({"queue": None, "eta_seconds": None}) is None


def test_a_long_past_job_is_measured_from_its_first_rows(client, auth, database_url):
    from api.estimates import _past_job
    from store.estimates import finished_jobs

    past = client.post("/v1/jobs", json=make_spec(rollout=ROLLOUT), headers=auth).json()["id"]
    small = {"n": 4, "prompts": 2, "samples": 8, "step_s": 4.0, "gen_s": 1.0}
    big = {"n": 8, "prompts": 1, "samples": 8, "step_s": 4.0, "gen_s": 1.0}
    _finished_job(database_url, past, [small, small, small, big, big], wall_s=100)
    with session_scope(database_url) as s:
        (job, read), = finished_jobs(s, steps=2)
        assert read.rows == 2 and read.step_s == 8.0
        # 2 rows of 8 scheduled samples read; the schedule's 40 samples at that pace: 20 s.
        measured = _past_job(s, job, read)
        assert measured.step_s == 20.0 and measured.budget_tokens == 40 * 32
        (job, full), = finished_jobs(s)
        assert _past_job(s, job, full).step_s == 20.0


def test_a_dry_run_of_a_continuation_estimates_the_resolved_spec(client, auth, other_auth, database_url,
                                                                  tmp_path: Path, enqueued):
    parent = client.post("/v1/jobs", json=make_spec(model={"path": "builtin:tiny", "lora": {"rank": 8}}),
                         headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, parent, "w", lease_seconds=60)
        (tmp_path / "ck").mkdir()
        store_jobs.record_checkpoint(s, parent, claim.attempt, 2, str(tmp_path / "ck"), 1, "0" * 64)
    body = make_spec(rollout=ROLLOUT, continue_from={"job": parent})
    del body["model"]  # left out: the parent's (a LoRA adapter), as a real submission fills it in
    resp = client.post("/v1/jobs?dry_run=true", json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    assert "adapter_and_optimizer" in resp.json()["memory"]["bytes"]
    assert_error(client.post("/v1/jobs?dry_run=true", json=body, headers=other_auth), 404)
    assert enqueued == [parent]
