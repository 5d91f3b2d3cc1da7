"""Evaluations over the API: `POST /v1/jobs/{id}/evaluations` resolves the caller's checkpoints
("latest", "best" by the training's eval/pass@1, steps) and fills in the job's sampling; bad
references are a 422 naming the field; another tenant's job or evaluation is a 404; an
Idempotency-Key replays the first evaluation even after the job saved a newer checkpoint; the
job quota counts evaluations; continuations do not list them. The run itself:
tests/e2e/test_evaluation_e2e.py."""
from __future__ import annotations

from store import evaluations
from store import jobs as store_jobs
from store.db import session_scope
from store.tables import Checkpoint
from tests.api.helpers import assert_error, make_spec
from trainer.evaluation_spec import EvaluationSpec

PASS1 = {0: 0.1, 2: 0.6, 4: 0.4, 6: 0.5}  # step -> the training's eval/pass@1


def _trained(client, auth, database_url, tmp_path, steps=(2, 4, 6), **spec) -> str:
    job_id = client.post("/v1/jobs", json=make_spec(**spec), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60)
        for step in sorted(set(steps) | set(PASS1)):
            values = {"loss": 0.1} if step not in PASS1 else {"eval/pass@1": PASS1[step]}
            store_jobs.record_metrics(s, job_id, claim.attempt, step, values)
            if step in steps:
                folder = tmp_path / job_id / f"step-{step}"
                folder.mkdir(parents=True)
                store_jobs.record_checkpoint(s, job_id, claim.attempt, step, str(folder), 1, "0" * 64)
    return job_id


def _add_checkpoint(database_url, tmp_path, job_id, step):
    with session_scope(database_url) as s:
        attempt = store_jobs.get_job_unscoped(s, job_id).attempt
        folder = tmp_path / job_id / f"step-{step}"
        folder.mkdir(parents=True)
        store_jobs.record_checkpoint(s, job_id, attempt, step, str(folder), 1, "0" * 64)


def test_latest_best_and_a_step_resolve_with_the_jobs_sampling(client, auth, database_url, tmp_path, enqueued):
    job = _trained(client, auth, database_url, tmp_path)
    resp = client.post(f"/v1/jobs/{job}/evaluations", json={"checkpoints": ["best", "latest", 6, 4], "n": 4,
                                                            "prompts": 5}, headers=auth)
    assert resp.status_code == 201, resp.text
    ev = resp.json()
    assert ev["object"] == "evaluation" and ev["id"].startswith("evl_") and ev["id"] in enqueued
    assert ev["job_id"] == job and ev["checkpoints"] == [2, 6, 4] and ev["base"] is True
    picked = {p["step"]: p for p in ev["spec"]["picked"]}
    assert picked[2]["asked"] == ["best"] and "eval/pass@1 0.6 at step 2" in picked[2]["why"]
    assert picked[6]["asked"] == ["latest", "6"]
    spec = ev["spec"]
    assert (spec["temperature"], spec["top_p"], spec["k"]) == (0.6, 0.95, [1, 4])  # the job's eval settings
    assert spec["task"]["reasoning_gym"]["name"] == "chain_sum"
    assert ev["total_steps"] == 4 * 5 * 4  # 4 models (base + 3) x 5 prompts x n = 4
    assert client.get(f"/v1/evaluations/{ev['id']}", headers=auth).json()["checkpoints"] == [2, 6, 4]
    listed = client.get(f"/v1/jobs/{job}/evaluations", headers=auth).json()["data"]
    assert [e["id"] for e in listed] == [ev["id"]]
    assert client.get(f"/v1/jobs/{job}/continuations", headers=auth).json()["data"] == []
    assert [e["id"] for e in client.get("/v1/evaluations", headers=auth).json()["data"]] == [ev["id"]]
    # An evaluation is no job and no probe, and a job is no evaluation.
    assert_error(client.get(f"/v1/jobs/{ev['id']}", headers=auth), 404)
    assert_error(client.get(f"/v1/probes/{ev['id']}", headers=auth), 404)
    assert_error(client.get(f"/v1/evaluations/{job}", headers=auth), 404)


def test_what_cannot_be_evaluated_is_refused(client, auth, database_url, tmp_path, enqueued):
    job = _trained(client, auth, database_url, tmp_path)
    post = lambda body, j=job: client.post(f"/v1/jobs/{j}/evaluations", json=body, headers=auth)  # noqa: E731
    err = assert_error(post({"checkpoints": [3]}), 422, field="checkpoints")
    assert "no checkpoint at step 3" in err["message"] and "[2, 4, 6]" in err["message"]
    assert_error(post({"checkpoints": ["newest"]}), 422)
    assert_error(post({"checkpoints": []}), 422, field="checkpoints")
    assert_error(post({"checkpoints": [-1]}), 422)
    assert_error(post({"checkpoints": list(range(9))}), 422, field="checkpoints")
    assert_error(post({"n": 4, "k": [8]}), 422, field="k")
    assert_error(post({"k": [32]}), 422, field="k")  # beyond the job's eval.samples_per_prompt (16)
    assert_error(post({"max_new_tokens": 2}), 422, field="max_new_tokens")
    assert_error(post({"job": "job_01OTHER"}), 422, field="job")
    assert_error(post({"unknown": 1}), 422)
    assert_error(post({"task": {"dataset": {"id": "ds_01NOPE"}}}), 422, field="task.dataset.id")
    assert_error(post({"task": {"reasoning_gym": {"name": "no_such_task"}}}), 422)
    assert_error(post({"prompts": 1025}), 422, field="prompts")
    assert_error(post({"n": 4096}), 422, field="n")
    empty = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    assert "no checkpoint yet" in assert_error(post({}, empty), 422, field="checkpoints")["message"]
    no_evals = _trained(client, auth, database_url, tmp_path, steps=(3,))
    assert "eval/pass@1" in assert_error(post({"checkpoints": ["best"]}, no_evals), 422, field="checkpoints")["message"]
    assert_error(post({}, "job_01NOPE"), 404)
    assert enqueued == [job, empty, no_evals]  # nothing refused was queued


def test_another_tenants_job_and_evaluation_are_404(client, auth, other_auth, database_url, tmp_path, enqueued):
    job = _trained(client, auth, database_url, tmp_path)
    ev = client.post(f"/v1/jobs/{job}/evaluations", json={}, headers=auth).json()
    assert_error(client.post(f"/v1/jobs/{job}/evaluations", json={}, headers=other_auth), 404)
    assert_error(client.get(f"/v1/jobs/{job}/evaluations", headers=other_auth), 404)
    assert_error(client.get(f"/v1/evaluations/{ev['id']}", headers=other_auth), 404)
    assert_error(client.post(f"/v1/evaluations/{ev['id']}/cancel", headers=other_auth), 404)
    assert_error(client.get(f"/v1/evaluations/{ev['id']}/events", headers=other_auth), 404)
    assert client.get("/v1/evaluations", headers=other_auth).json()["data"] == []
    # Their Idempotency-Key cannot reach our evaluation either.
    replay = client.post(f"/v1/jobs/{job}/evaluations", json={}, headers={**other_auth, "Idempotency-Key": "k1"})
    assert_error(replay, 404)


def test_an_idempotency_key_replays_the_request_not_the_resolution(client, auth, database_url, tmp_path, enqueued):
    job = _trained(client, auth, database_url, tmp_path)
    headers = {**auth, "Idempotency-Key": "eval-1"}
    first = client.post(f"/v1/jobs/{job}/evaluations", json={"checkpoints": ["latest"]}, headers=headers)
    assert first.status_code == 201 and first.json()["checkpoints"] == [6]
    _add_checkpoint(database_url, tmp_path, job, 8)  # "latest" now means step 8
    again = client.post(f"/v1/jobs/{job}/evaluations", json={"checkpoints": ["latest"]}, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["checkpoints"] == [6]
    assert_error(client.post(f"/v1/jobs/{job}/evaluations", json={"checkpoints": [2]}, headers=headers),
                 409, type_="idempotency_conflict")
    other = client.post("/v1/jobs", json=make_spec(), headers=headers)  # the key is taken, by another kind
    assert other.status_code == 409
    fresh = client.post(f"/v1/jobs/{job}/evaluations", json={"checkpoints": ["latest"]}, headers=auth)
    assert fresh.json()["checkpoints"] == [8]
    assert enqueued == [job, first.json()["id"], fresh.json()["id"]]


def test_a_continued_jobs_base_is_its_parents_checkpoint(client, auth, database_url, tmp_path):
    parent = _trained(client, auth, database_url, tmp_path)
    body = make_spec(continue_from={"job": parent, "step": 4})
    del body["model"]
    child_id = client.post("/v1/jobs", json=body, headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, child_id, "test-worker", lease_seconds=60)
        (tmp_path / "child-2").mkdir()
        store_jobs.record_checkpoint(s, child_id, claim.attempt, 2, str(tmp_path / "child-2"), 1, "0" * 64)
    with session_scope(database_url) as s:  # what the worker will load
        job_row = store_jobs.get_job_unscoped(s, child_id)
        _, found = evaluations.folders(s, job_row.tenant_id, EvaluationSpec(job=child_id, checkpoints=[2], n=2))
        assert found.base == tmp_path / parent / "step-4" and found.steps == {2: tmp_path / "child-2"}
    assert client.post(f"/v1/jobs/{child_id}/evaluations", json={}, headers=auth).status_code == 201
    with session_scope(database_url) as s:  # the parent's checkpoint rotated out: no base to compare with
        s.query(Checkpoint).filter_by(job_id=parent, step=4).delete()
    err = assert_error(client.post(f"/v1/jobs/{child_id}/evaluations", json={}, headers=auth), 422, field="base")
    assert "base: false" in err["message"] and str(tmp_path) not in err["message"]
    assert client.post(f"/v1/jobs/{child_id}/evaluations", json={"base": False}, headers=auth).status_code == 201


def test_cancel_and_events(client, auth, database_url, tmp_path):
    job = _trained(client, auth, database_url, tmp_path)
    ev = client.post(f"/v1/jobs/{job}/evaluations", json={"base": False}, headers=auth).json()
    cancelled = client.post(f"/v1/evaluations/{ev['id']}/cancel", headers=auth).json()
    assert cancelled["status"] == "cancelled" and cancelled["base"] is False
    types = [e["type"] for e in client.get(f"/v1/evaluations/{ev['id']}/events", headers=auth).json()["data"]]
    assert types[0] == "created" and types[-1] == "cancelled"
    err = assert_error(client.post(f"/v1/evaluations/{ev['id']}/cancel", headers=auth), 409)
    assert err["message"] == f"cannot cancel evaluation {ev['id']}: it is already cancelled", err


def test_webhooks_announce_evaluations_as_evaluations(client, auth, database_url, tmp_path):
    from store import webhooks
    from store.webhook_tables import WebhookDelivery

    job = _trained(client, auth, database_url, tmp_path)
    with session_scope(database_url) as s:
        tenant = store_jobs.get_job_unscoped(s, job).tenant_id
        endpoint = webhooks.create_endpoint(s, tenant, "https://hooks.example.com/x",
                                            event_types=["evaluation.cancelled"]).id
    ev = client.post(f"/v1/jobs/{job}/evaluations", json={}, headers=auth).json()
    client.post(f"/v1/evaluations/{ev['id']}/cancel", headers=auth)
    client.post(f"/v1/jobs/{job}/cancel", headers=auth)  # a job.cancelled: not subscribed
    with session_scope(database_url) as s:
        sent = s.query(WebhookDelivery).filter_by(endpoint_id=endpoint).all()
        assert [(d.event_type, d.payload["data"]["object"], d.payload["data"]["id"]) for d in sent] == \
            [("evaluation.cancelled", "evaluation", ev["id"])]


def test_the_job_quota_counts_evaluations(client, auth, database_url, tmp_path, settings, app):
    job = _trained(client, auth, database_url, tmp_path)
    limit = settings.max_active_jobs_per_tenant
    made = 1  # the job itself is running
    while made < limit:
        assert client.post(f"/v1/jobs/{job}/evaluations", json={}, headers=auth).status_code == 201
        made += 1
    assert_error(client.post(f"/v1/jobs/{job}/evaluations", json={}, headers=auth), 429)
