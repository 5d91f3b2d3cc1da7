"""Jobs over HTTP: create, idempotency, pagination, filters, cancel, auth and tenant scoping."""

from __future__ import annotations

import pytest

from store import jobs as store_jobs
from store.db import session_scope
from store.tables import JobStatus

from tests.api.helpers import assert_error, make_spec


def _create(client, auth, **spec_overrides):
    resp = client.post("/v1/jobs", json=make_spec(**spec_overrides), headers=auth)
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_create_returns_the_queued_job_and_enqueues_after_commit(client, auth, enqueued):
    job = _create(client, auth, name="first")
    assert job["object"] == "job" and job["id"].startswith("job_")
    assert job["status"] == "queued" and job["name"] == "first"
    assert job["total_steps"] == 5 and job["step"] == 0 and job["attempt"] == 0
    assert job["cancel_requested"] is False and job["error"] is None
    assert job["started_at"] is None and job["finished_at"] is None and job["created_at"]
    # The stored spec has the defaults filled in.
    assert job["spec"]["spec_version"] == 1 and job["spec"]["optim"]["lr"] == 1e-6
    assert enqueued == [job["id"]]
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth).json() == job


def test_enqueue_failure_still_answers_201_and_the_job_stays_queued(app, client, auth):
    def broker_down(job_id: str) -> None:
        raise ConnectionError("broker down")

    app.state.enqueue = broker_down
    job = _create(client, auth)
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth).json()["status"] == "queued"


def test_idempotency_key_replays_the_same_job(client, auth, enqueued):
    headers = {**auth, "Idempotency-Key": "req-1"}
    first = client.post("/v1/jobs", json=make_spec(), headers=headers)
    again = client.post("/v1/jobs", json=make_spec(), headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert enqueued == [first.json()["id"]]  # a replay does not enqueue twice
    other = client.post("/v1/jobs", json=make_spec(seed=7), headers=headers)
    assert_error(other, 409, "idempotency_conflict")
    assert first.json()["id"] in other.json()["error"]["message"]


def test_idempotency_keys_are_per_tenant(client, auth, other_auth):
    a = client.post("/v1/jobs", json=make_spec(), headers={**auth, "Idempotency-Key": "k"})
    b = client.post("/v1/jobs", json=make_spec(seed=1),
                    headers={**other_auth, "Idempotency-Key": "k"})
    assert a.status_code == b.status_code == 201 and a.json()["id"] != b.json()["id"]


def test_list_paginates_newest_first(client, auth, other_auth):
    ids = [_create(client, auth, name=f"job-{i}")["id"] for i in range(5)]
    _create(client, other_auth)  # another tenant's job never shows up
    page1 = client.get("/v1/jobs?limit=2", headers=auth).json()
    assert page1["object"] == "list" and page1["has_more"] is True
    assert [j["id"] for j in page1["data"]] == ids[::-1][:2]
    page2 = client.get(f"/v1/jobs?limit=2&after={page1['data'][-1]['id']}", headers=auth).json()
    assert [j["id"] for j in page2["data"]] == ids[::-1][2:4] and page2["has_more"] is True
    page3 = client.get(f"/v1/jobs?limit=2&after={page2['data'][-1]['id']}", headers=auth).json()
    assert [j["id"] for j in page3["data"]] == ids[:1] and page3["has_more"] is False
    default = client.get("/v1/jobs", headers=auth).json()
    assert [j["id"] for j in default["data"]] == ids[::-1] and default["has_more"] is False


@pytest.mark.parametrize("limit", [0, 101, "x"])
def test_list_limit_bounds(client, auth, limit):
    assert_error(client.get(f"/v1/jobs?limit={limit}", headers=auth), 422, field="query.limit")


def test_list_filters_by_status(client, auth):
    keep = _create(client, auth)["id"]
    gone = _create(client, auth)["id"]
    assert client.post(f"/v1/jobs/{gone}/cancel", headers=auth).status_code == 200
    queued = client.get("/v1/jobs?status=queued", headers=auth).json()["data"]
    cancelled = client.get("/v1/jobs?status=cancelled", headers=auth).json()["data"]
    assert [j["id"] for j in queued] == [keep] and [j["id"] for j in cancelled] == [gone]
    assert_error(client.get("/v1/jobs?status=done", headers=auth), 422, field="query.status")


def test_cancel_rules(client, auth, database_url):
    queued = _create(client, auth)["id"]
    resp = client.post(f"/v1/jobs/{queued}/cancel", headers=auth)
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelled" and resp.json()["finished_at"]
    err = assert_error(client.post(f"/v1/jobs/{queued}/cancel", headers=auth), 409, "conflict")
    assert "cancelled" in err["message"]

    running = _create(client, auth)["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, running, "test-worker", lease_seconds=60)
    resp = client.post(f"/v1/jobs/{running}/cancel", headers=auth)
    assert resp.json()["status"] == "running" and resp.json()["cancel_requested"] is True
    # Asking twice is harmless while the worker has not stopped yet.
    assert client.post(f"/v1/jobs/{running}/cancel", headers=auth).status_code == 200

    # A run that completes after the cancel request ends cancelled, not succeeded.
    with session_scope(database_url) as s:
        assert store_jobs.finish(s, running, claim.attempt, JobStatus.succeeded) == "cancelled"
    err = assert_error(client.post(f"/v1/jobs/{running}/cancel", headers=auth), 409)
    assert "already cancelled" in err["message"]
    types = [e["type"] for e in client.get(f"/v1/jobs/{queued}/events", headers=auth).json()["data"]]
    assert types == ["created", "cancel_requested", "cancelled"]


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer brorl_wrong"}, {"Authorization": "Bearer "},
    {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "brorl_no_scheme"},
])
def test_missing_or_wrong_key_is_401(client, headers):
    for method, url in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/datasets"),
                        ("GET", "/v1/jobs/job_x/metrics/stream")]:
        resp = client.request(method, url, headers=headers, json=make_spec())
        assert_error(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"] == "Bearer"


def test_other_tenants_job_is_404_like_an_unknown_id(client, auth, other_auth):
    job = _create(client, auth)["id"]
    for url in [f"/v1/jobs/{job}", f"/v1/jobs/{job}/events", f"/v1/jobs/{job}/metrics",
                f"/v1/jobs/{job}/checkpoints", f"/v1/jobs/{job}/metrics/stream"]:
        assert_error(client.get(url, headers=other_auth), 404, "not_found")
        assert_error(client.get(url.replace(job, "job_unknown"), headers=auth), 404, "not_found")
    assert_error(client.post(f"/v1/jobs/{job}/cancel", headers=other_auth), 404, "not_found")
    assert client.get(f"/v1/jobs/{job}", headers=auth).json()["status"] == "queued"


def test_pause_and_resume(client, auth, database_url, enqueued):
    """Queued: paused at once, resumed to queued and enqueued again; running: the pause is a
    request the worker acts on (tests/worker/test_pause.py), shown as pause_requested."""
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    paused = client.post(f"/v1/jobs/{job_id}/pause", headers=auth).json()
    assert paused["status"] == "paused"
    assert client.get("/v1/jobs?status=paused", headers=auth).json()["data"][0]["id"] == job_id
    assert client.post(f"/v1/jobs/{job_id}/resume", headers=auth).json()["status"] == "queued"
    assert enqueued == [job_id, job_id]
    assert client.post(f"/v1/jobs/{job_id}/resume", headers=auth).status_code == 409
    with session_scope(database_url) as s:
        store_jobs.claim(s, job_id, "w", lease_seconds=60)
    running = client.post(f"/v1/jobs/{job_id}/pause", headers=auth).json()
    assert running["status"] == "running" and running["pause_requested"] is True
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert client.post(f"/v1/jobs/{job_id}/pause", headers=auth).status_code == 409
