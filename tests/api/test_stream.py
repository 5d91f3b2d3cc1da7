"""Events and metrics: paged lists, and the SSE stream (resume, status events, end)."""

from __future__ import annotations

import threading
import time

import pytest

from store import jobs as store_jobs
from store.db import session_scope
from store.tables import EventType, JobStatus

from tests.api.helpers import assert_error, make_spec, parse_sse


@pytest.fixture
def running_job(client, auth, database_url):
    """(job id, attempt) of a job a fake worker has claimed."""
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    with session_scope(database_url) as s:
        claim = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60)
    return job_id, claim.attempt


def _write_steps(url: str, job_id: str, attempt: int, steps, finish: JobStatus | None = None):
    for step in steps:
        with session_scope(url) as s:
            store_jobs.record_metrics(s, job_id, attempt, step,
                                      {"step": step, "reward_mean": step / 10, "loss": 1.0})
    if finish is not None:
        with session_scope(url) as s:
            store_jobs.finish(s, job_id, attempt, finish)


def test_metrics_list_pages_by_step(client, auth, database_url, running_job):
    job_id, attempt = running_job
    _write_steps(database_url, job_id, attempt, [1, 2, 3])
    page = client.get(f"/v1/jobs/{job_id}/metrics?limit=2", headers=auth).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [m["step"] for m in page["data"]] == [1, 2]
    assert page["data"][0]["values"] == {"step": 1, "reward_mean": 0.1, "loss": 1.0}
    rest = client.get(f"/v1/jobs/{job_id}/metrics?after_step=2", headers=auth).json()
    assert [m["step"] for m in rest["data"]] == [3] and rest["has_more"] is False
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["step"] == 3


def test_metrics_page_is_what_the_pydantic_models_write(client, auth, other_auth, database_url,
                                                       running_job):
    """The hot route assembles its JSON from the database's JSON text (one query, no
    re-encoding): it must say exactly what ListPublic[MetricPublic] says."""
    from api.schemas import ListPublic, MetricPublic
    from store.tables import Job

    job_id, attempt = running_job
    url = f"/v1/jobs/{job_id}/metrics"
    assert client.get(url, headers=auth).json() == {"object": "list", "data": [], "has_more": False}
    _write_steps(database_url, job_id, attempt, [1, 2, 3])
    with session_scope(database_url) as s:
        store_jobs.record_metrics(s, job_id, attempt, 4, {"eval/pass@1": 0.25, "nested": {"a": [1, None]},
                                                         "text": 'quote " and \\ é', "big": 1e300})
    with session_scope(database_url) as s:
        tenant_id = s.get(Job, job_id).tenant_id
        for after, limit in ((None, 2), (1, 10), (4, 5)):
            rows = store_jobs.list_metrics(s, tenant_id, job_id, after_step=after, limit=limit + 1)
            want = ListPublic[MetricPublic](data=[MetricPublic.model_validate(m) for m in rows[:limit]],
                                            has_more=len(rows) > limit).model_dump(mode="json")
            params = {"limit": limit} | ({} if after is None else {"after_step": after})
            resp = client.get(url, params=params, headers=auth)
            assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
            assert resp.json() == want
    assert_error(client.get(url, headers=other_auth), 404)  # another tenant's job
    assert_error(client.get("/v1/jobs/nope/metrics", headers=auth), 404)


def test_unchanged_metrics_page_is_a_304(client, auth, database_url, running_job):
    job_id, attempt = running_job
    _write_steps(database_url, job_id, attempt, [1])
    url = f"/v1/jobs/{job_id}/metrics"
    first = client.get(url, headers=auth)
    etag = first.headers["ETag"]
    again = client.get(url, headers={**auth, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["ETag"] == etag
    _write_steps(database_url, job_id, attempt, [2])
    changed = client.get(url, headers={**auth, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
    assert [m["step"] for m in changed.json()["data"]] == [1, 2]


# Terminating backends is PostgreSQL's: this test has no SQLite variant.
@pytest.mark.parametrize("database_url", [pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_metrics_page_survives_connections_the_server_dropped(client, auth, database_url,
                                                             running_job):
    """The hot route's engine has no pre-ping: a dropped pooled connection is retried once."""
    from sqlalchemy import text

    job_id, attempt = running_job
    _write_steps(database_url, job_id, attempt, [1])
    url = f"/v1/jobs/{job_id}/metrics"
    assert client.get(url, headers=auth).status_code == 200  # a pooled connection now exists
    with session_scope(database_url) as s:
        s.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    resp = client.get(url, headers=auth)
    assert resp.status_code == 200 and [m["step"] for m in resp.json()["data"]] == [1]


def test_events_list_pages_by_id(client, auth, database_url, running_job):
    job_id, attempt = running_job
    _write_steps(database_url, job_id, attempt, [], finish=JobStatus.succeeded)
    events = client.get(f"/v1/jobs/{job_id}/events", headers=auth).json()["data"]
    assert [e["type"] for e in events] == ["created", "started", "succeeded"]
    assert all(e["object"] == "job.event" and e["job_id"] == job_id for e in events)
    after = client.get(f"/v1/jobs/{job_id}/events?after={events[0]['id']}&limit=1",
                       headers=auth).json()
    assert [e["type"] for e in after["data"]] == ["started"] and after["has_more"] is True


def test_stream_sends_every_metric_then_ends(client, auth, database_url, running_job):
    job_id, attempt = running_job
    _write_steps(database_url, job_id, attempt, [1, 2, 3], finish=JobStatus.succeeded)
    resp = client.get(f"/v1/jobs/{job_id}/metrics/stream", headers=auth)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(resp.text)
    metrics = [e for e in events if e["event"] == "metric"]
    assert [e["id"] for e in metrics] == ["1", "2", "3"]
    assert [e["data"]["step"] for e in metrics] == [1, 2, 3]
    assert metrics[1]["data"]["values"]["reward_mean"] == 0.2
    assert [e["event"] for e in events] == ["metric"] * 3 + ["status", "end"]
    assert events[-2]["data"]["status"] == "succeeded"
    assert events[-1]["data"] == {"status": "succeeded"}


@pytest.mark.parametrize("resume", [{"headers": {"Last-Event-ID": "1"}},
                                    {"params": {"after_step": 1}}])
def test_stream_resumes_after_the_last_event_id(client, auth, database_url, running_job, resume):
    job_id, attempt = running_job
    _write_steps(database_url, job_id, attempt, [1, 2, 3], finish=JobStatus.failed)
    headers = {**auth, **resume.get("headers", {})}
    resp = client.get(f"/v1/jobs/{job_id}/metrics/stream", headers=headers,
                      params=resume.get("params"))
    events = parse_sse(resp.text)
    assert [e["id"] for e in events if e["event"] == "metric"] == ["2", "3"]
    assert events[-1] == {"event": "end", "data": {"status": "failed"}}


def test_stream_follows_a_live_job(client, auth, database_url, running_job):
    job_id, attempt = running_job

    def worker():  # a fake worker writing while the client follows
        time.sleep(0.2)
        _write_steps(database_url, job_id, attempt, [1, 2])
        time.sleep(0.2)
        _write_steps(database_url, job_id, attempt, [3], finish=JobStatus.succeeded)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        resp = client.get(f"/v1/jobs/{job_id}/metrics/stream", headers=auth)
    finally:
        thread.join()
    events = parse_sse(resp.text)
    assert [e["id"] for e in events if e["event"] == "metric"] == ["1", "2", "3"]
    statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses == ["running", "succeeded"]
    assert events[-1]["event"] == "end"


def test_stream_sends_the_newest_progress_event_while_the_job_runs(client, auth, database_url, running_job):
    job_id, attempt = running_job
    with session_scope(database_url) as s:  # before the stream opens: its first poll looks back
        store_jobs.add_event(s, job_id, EventType.progress, {"phase": "task", "done": 0, "finished": True},
                             attempt=attempt)
        store_jobs.add_event(s, job_id, EventType.progress, {"phase": "warm_start", "done": 0, "total": 9,
                                                            "finished": False}, attempt=attempt)

    def worker():  # the trainer's progress, then its first step, then the end
        for done, finished in ((3, False), (9, True)):
            time.sleep(0.3)  # several polls apart: each is sent
            with session_scope(database_url) as s:
                store_jobs.add_event(s, job_id, EventType.progress, {
                    "phase": "warm_start", "done": done, "total": 9, "finished": finished}, attempt=attempt)
        time.sleep(0.3)
        _write_steps(database_url, job_id, attempt, [1], finish=JobStatus.succeeded)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        events = parse_sse(client.get(f"/v1/jobs/{job_id}/metrics/stream", headers=auth).text)
    finally:
        thread.join()
    progress = [e for e in events if e["event"] == "progress"]
    # The first poll sends only the newest of what it finds; each later one what is new.
    assert [(p["data"]["data"]["phase"], p["data"]["data"]["done"]) for p in progress] == [
        ("warm_start", 0), ("warm_start", 3), ("warm_start", 9)]
    assert all("id" not in p and p["data"]["type"] == "progress" and p["data"]["job_id"] == job_id
               for p in progress)  # no id: a reconnect still resumes by step
    assert [e["event"] for e in events][-3:] == ["metric", "status", "end"]
    assert [e["id"] for e in events if e["event"] == "metric"] == ["1"]


def test_stream_of_a_cancelled_queued_job_ends_at_once(client, auth):
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    events = parse_sse(client.get(f"/v1/jobs/{job_id}/metrics/stream", headers=auth).text)
    assert [e["event"] for e in events] == ["status", "end"]


def test_bad_last_event_id_is_422(client, auth, running_job):
    job_id, _ = running_job
    resp = client.get(f"/v1/jobs/{job_id}/metrics/stream",
                      headers={**auth, "Last-Event-ID": "abc"})
    assert_error(resp, 422, field="Last-Event-ID")
