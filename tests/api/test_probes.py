"""`/v1/probes`: create, list, show, cancel and events, tenant-scoped, on SQLite and PostgreSQL.

The worker side (a real probe run, progress, a retry after a killed worker) is in
tests/e2e/test_probe_stack.py; here enqueueing is the recorder of tests/api/conftest.py.
"""
from __future__ import annotations

from store import jobs
from store.db import session_scope
from tests.api.helpers import assert_error, make_spec

TASK = {"reasoning_gym": {"name": "chain_sum", "train_size": 100, "eval_size": 10}}


def _probe(client, auth, **body):
    return client.post("/v1/probes", json={"task": TASK, "n": 32, "prompts": 4,
                                           "max_new_tokens": 24, **body}, headers=auth)


def test_create_list_show_cancel(client, auth, enqueued):
    resp = _probe(client, auth)
    assert resp.status_code == 201, resp.text
    probe = resp.json()
    assert probe["id"].startswith("prb_") and probe["object"] == "probe"
    assert probe["status"] == "queued" and probe["total_steps"] == 32 * 4 and probe["result"] is None
    assert probe["spec"]["n"] == 32 and probe["spec"]["task"]["reasoning_gym"]["name"] == "chain_sum"
    assert enqueued == [probe["id"]] and enqueued.queues[probe["id"]] == "gpu"
    listed = client.get("/v1/probes", headers=auth).json()
    assert [p["id"] for p in listed["data"]] == [probe["id"]]
    assert listed["data"][0]["model"]["path"] == "builtin:tiny" and "result" not in listed["data"][0]
    assert client.get("/v1/jobs", headers=auth).json()["data"] == []  # probes are not jobs
    assert client.get(f"/v1/probes/{probe['id']}", headers=auth).json()["status"] == "queued"
    cancelled = client.post(f"/v1/probes/{probe['id']}/cancel", headers=auth)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    events = client.get(f"/v1/probes/{probe['id']}/events", headers=auth).json()["data"]
    assert [e["type"] for e in events] == ["created", "cancel_requested", "cancelled"]
    assert_error(client.post(f"/v1/probes/{probe['id']}/cancel", headers=auth), 409)


def test_defaults_are_the_documented_ones(client, auth):
    resp = client.post("/v1/probes", json={"task": TASK}, headers=auth)
    assert resp.status_code == 201, resp.text
    spec = resp.json()["spec"]
    assert (spec["n"], spec["prompts"], spec["temperature"]) == (512, 64, 1.0)


def test_another_tenants_probe_is_a_404(client, auth, other_auth):
    probe_id = _probe(client, auth).json()["id"]
    for path in (f"/v1/probes/{probe_id}", f"/v1/probes/{probe_id}/events"):
        assert_error(client.get(path, headers=other_auth), 404)
    assert_error(client.post(f"/v1/probes/{probe_id}/cancel", headers=other_auth), 404)
    assert client.get("/v1/probes", headers=other_auth).json()["data"] == []
    # Nor does either route answer for the other kind's ids.
    assert_error(client.get(f"/v1/jobs/{probe_id}", headers=auth), 404)
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    assert_error(client.get(f"/v1/probes/{job_id}", headers=auth), 404)


def test_bad_input_is_a_422_naming_the_field(client, auth):
    assert_error(_probe(client, auth, n=5000), 422, field="n")
    assert_error(_probe(client, auth, prompts=0), 422, field="prompts")
    assert_error(_probe(client, auth, max_new_tokens=8), 422, field="max_new_tokens")
    assert_error(client.post("/v1/probes", json={"n": 64}, headers=auth), 422, field="task")
    assert_error(_probe(client, auth, model={"job": "job_NOPE", "step": 1}), 422, field="model.job")
    assert_error(_probe(client, auth, model={"path": "/etc"}), 422, field="model.path")
    assert_error(_probe(client, auth, task={"dataset": {"id": "ds_nope"}}), 422, field="task.dataset.id")


def test_probe_of_a_checkpoint_takes_the_jobs_task(client, auth, other_auth, database_url, tmp_path):
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()
    assert_error(client.post("/v1/probes", json={"model": {"job": job["id"], "step": 2}}, headers=auth),
                 422, field="model.step")
    with session_scope(database_url) as s:
        claim = jobs.claim(s, job["id"], "w", 60)
    with session_scope(database_url) as s:
        jobs.record_checkpoint(s, job["id"], claim.attempt, 2, str(tmp_path / "ckpt"), 10, "0" * 64)
    resp = client.post("/v1/probes", json={"model": {"job": job["id"], "step": 2}, "n": 16}, headers=auth)
    assert resp.status_code == 201, resp.text
    spec = resp.json()["spec"]
    assert spec["model"] == {"job": job["id"], "step": 2} and spec["task"] == job["spec"]["task"]
    # builtin:tiny's answers need 24 tokens: the job's model makes a shorter probe a 422 too.
    assert_error(client.post("/v1/probes", json={"model": {"job": job["id"]}, "max_new_tokens": 8},
                             headers=auth), 422, field="max_new_tokens")
    # Another tenant cannot point a probe at it.
    assert_error(client.post("/v1/probes", json={"model": {"job": job["id"], "step": 2}}, headers=other_auth),
                 422, field="model.job")


def test_a_probe_goes_through_the_reward_check_of_a_job(client, auth, enqueued, monkeypatch):
    """A probe is submitted as a job is (api.submission): a grader whose judge this server
    lacks is a 422 naming it, for both, and neither row is stored nor enqueued."""
    monkeypatch.delenv("BRORL_JUDGES", raising=False)
    judge = {"type": "score_model", "name": "j", "model": "no-such-judge",
             "input": [{"role": "user", "content": "{{ sample.output_text }}"}]}
    task = {**TASK, "grader": judge}
    assert_error(_probe(client, auth, task=task), 422, field="task.grader.model")
    assert_error(client.post("/v1/jobs", json=make_spec(task=task), headers=auth), 422, field="task.grader.model")
    assert client.get("/v1/probes", headers=auth).json()["data"] == [] and enqueued == []
    assert client.get("/v1/jobs", headers=auth).json()["data"] == []


def test_routes_share_rules_through_modules_not_each_other():
    """No route module imports another route module: shared rules live in api.submission and
    api.dataset_upload. The one exception mounts the same handlers again: OpenAI's
    `/v1/fine_tuning/alpha/graders/*` are the `/v1/graders/*` functions themselves."""
    import ast
    from pathlib import Path

    allowed = {("api/openai/graders.py", "api.routes")}
    root = Path(__file__).resolve().parents[2]
    for path in [*(root / "api/routes").glob("*.py"), *(root / "api/openai").glob("*.py")]:
        name = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("api.routes"):
                assert (name, node.module) in allowed, f"{name} imports {node.module}"
