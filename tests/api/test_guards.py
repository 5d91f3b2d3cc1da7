"""Slow and greedy clients: stalled uploads hold no database connection,
bodies time out, a key's concurrency and request rate are capped (429 + Retry-After)."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.ratelimit import TokenBuckets
from tests.api.helpers import assert_error, make_spec
from tests.api.live import serve, stalled_upload


def _app(settings, enqueued, **overrides):
    return create_app(settings.model_copy(update=overrides), enqueue=enqueued)


def test_stalled_uploads_do_not_exhaust_the_pool(settings, enqueued, key, other_auth):
    # 20 stalled uploads (more than the pool's 5 + 10 connections) from one tenant; another
    # tenant's request still answers at once. Before: each upload held a session, 500 after 30 s.
    app = _app(settings, enqueued, max_concurrent_per_key=100,
               max_concurrent_uploads_per_tenant=100)
    with serve(app) as url:
        socks = [stalled_upload(url, key) for _ in range(20)]
        try:
            time.sleep(0.5)
            start = time.monotonic()
            resp = httpx.get(f"{url}/v1/jobs", headers=other_auth, timeout=10)
            assert resp.status_code == 200, resp.text
            assert time.monotonic() - start < 2
        finally:
            for s in socks:
                s.close()


def test_per_key_concurrency_cap_answers_429(settings, enqueued, key, auth, other_auth):
    app = _app(settings, enqueued, max_concurrent_per_key=3, max_concurrent_uploads_per_tenant=10)
    with serve(app) as url:
        socks = [stalled_upload(url, key) for _ in range(3)]
        try:
            time.sleep(0.5)
            resp = httpx.get(f"{url}/v1/jobs", headers=auth, timeout=10)
            assert_error(resp, 429, "too_many_requests")
            assert resp.headers["Retry-After"] == "1"
            # Other keys are not affected.
            assert httpx.get(f"{url}/v1/jobs", headers=other_auth, timeout=10).status_code == 200
        finally:
            for s in socks:
                s.close()
        time.sleep(0.3)  # the slots free up when the connections go
        assert httpx.get(f"{url}/v1/jobs", headers=auth, timeout=10).status_code == 200


def test_a_stalled_body_times_out_with_408(settings, enqueued, key):
    app = _app(settings, enqueued, body_idle_timeout_s=0.3)
    with serve(app) as url:
        sock = stalled_upload(url, key)
        try:
            sock.settimeout(10)
            answer = sock.recv(4096).decode()
        finally:
            sock.close()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "request_timeout" in answer


def test_a_stalled_json_body_times_out_with_408(settings, enqueued, key):
    import socket

    app = _app(settings, enqueued, body_idle_timeout_s=0.3)
    with serve(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall((f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
                          ).encode())
            sock.settimeout(10)
            answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408"), answer


def test_rate_limit_is_429_with_retry_after(settings, enqueued, auth, other_auth):
    # 0.1/s: the bucket gains no token while 5 requests run, even on a loaded machine (at
    # 1/s four requests on PostgreSQL under a load average of 9 took over a second).
    app = _app(settings, enqueued, rate_limit_per_s=0.1, rate_limit_burst=3)
    with TestClient(app) as client:
        codes = [client.get("/v1/jobs", headers=auth).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        resp = client.get("/v1/jobs", headers=auth)
        assert_error(resp, 429, "rate_limited")
        assert int(resp.headers["Retry-After"]) >= 1
        assert client.get("/v1/jobs", headers=other_auth).status_code == 200
        assert client.get("/healthz").status_code == 200  # probes are not limited


def test_token_bucket_refills_at_the_rate():
    now = [0.0]
    buckets = TokenBuckets(rate=20, burst=40, clock=lambda: now[0])
    assert all(buckets.take("k") == 0 for _ in range(40))
    assert buckets.take("k") == pytest.approx(0.05)
    now[0] += 1.0  # 20 tokens later
    assert sum(buckets.take("k") == 0 for _ in range(25)) == 20


def test_open_streams_are_capped_per_key(settings, enqueued, auth):
    app = _app(settings, enqueued, max_streams_per_key=0)
    with TestClient(app) as client:
        job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
        resp = client.get(f"/v1/jobs/{job}/metrics/stream", headers=auth)
        err = assert_error(resp, 429, "too_many_requests")
        assert "stream" in err["message"]


def test_a_revoked_key_stops_working_within_the_auth_cache_time(settings, enqueued, key,
                                                                  auth, database_url):
    from store import keys
    from store.db import session_scope

    app = _app(settings, enqueued, auth_cache_seconds=0.5)
    with TestClient(app) as client:
        assert client.get("/v1/jobs", headers=auth).status_code == 200
        with session_scope(database_url) as s:
            (found,) = keys.find_keys(s, key[:keys.DISPLAY_PREFIX_CHARS])
            assert keys.revoke_key(s, found.id)
        time.sleep(0.6)
        assert_error(client.get("/v1/jobs", headers=auth), 401)


def test_open_streams_are_capped_per_tenant(settings, enqueued, auth, other_auth):
    app = _app(settings, enqueued, max_streams_per_tenant=0)
    with TestClient(app) as client:
        job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
        err = assert_error(client.get(f"/v1/jobs/{job}/metrics/stream", headers=auth), 429,
                           "quota_exceeded")
        assert "streams per tenant" in err["message"]


def test_stream_slots_are_given_back():
    from api.quotas import StreamSlots

    slots = StreamSlots()
    release = slots.acquire(1, limit=1)
    with pytest.raises(Exception, match="streams per tenant"):
        slots.acquire(1, limit=1)
    release()
    release()  # twice is harmless
    slots.acquire(1, limit=1)()
    assert slots.acquire(2, limit=1)  # other tenants have their own


def test_a_finished_stream_gives_its_slot_back(settings, enqueued, auth):
    app = _app(settings, enqueued, max_streams_per_tenant=1)
    with TestClient(app) as client:
        job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
        client.post(f"/v1/jobs/{job}/cancel", headers=auth)  # terminal: the stream ends at once
        for _ in range(3):
            resp = client.get(f"/v1/jobs/{job}/metrics/stream", headers=auth)
            assert resp.status_code == 200 and "event: end" in resp.text
