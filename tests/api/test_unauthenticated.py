"""Clients without a valid key: limited per address, answered before their body is read.

Before: random keys at 300 requests/s all got 401s and never a 429 (another tenant's p99
went from ~10 to 69 ms), `/metrics` took ~220 requests/s from anyone, and a client without a
key trickling a JSON body to `POST /v1/jobs` held its connection for 45 s with no answer.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.api.helpers import assert_error, make_spec
from tests.api.live import serve


def _app(settings, enqueued, **overrides):
    return create_app(settings.model_copy(update=overrides), enqueue=enqueued)


def test_failed_authentications_are_rate_limited_per_address(settings, enqueued, auth):
    app = _app(settings, enqueued, auth_failures_per_s=0.5, auth_failures_burst=5)
    with TestClient(app) as client:
        assert client.get("/v1/jobs", headers=auth).status_code == 200  # a key found valid
        codes = [client.get("/v1/jobs", headers={"Authorization": f"Bearer guess{i}"}).status_code
                 for i in range(8)]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
        resp = client.get("/v1/jobs", headers={"Authorization": "Bearer guess-again"})
        err = assert_error(resp, 429, "rate_limited")
        assert "failed authentications" in err["message"] and int(resp.headers["Retry-After"]) >= 1
        # The tenant whose key was just found valid is not locked out with the guesser.
        assert client.get("/v1/jobs", headers=auth).status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/readyz", "/openapi.json", "/healthz",
                                  "/static/shell.html", "/docs"])
def test_unauthenticated_routes_are_rate_limited_per_address(settings, enqueued, path):
    # One token per 100 s: a slow first answer (building /openapi.json under load took over
    # a second in CI) must not refill the bucket between the third and fourth request.
    app = _app(settings, enqueued, anon_rate_limit_per_s=0.01, anon_rate_limit_burst=3)
    with TestClient(app) as client:
        codes = [client.get(path).status_code for _ in range(5)]
    assert codes[3:] == [429, 429], codes
    assert all(c != 429 for c in codes[:3]), codes


def test_the_body_is_not_read_before_authentication(settings, enqueued):
    # Headers announce a body, none of it is sent: without a valid key the answer is a 401
    # at once, not a wait for the body (and not a 408 after body_idle_timeout_s).
    app = _app(settings, enqueued, body_idle_timeout_s=30)
    with serve(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
            start = time.monotonic()
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 401"), answer
        assert time.monotonic() - start < 2


def test_a_valid_key_still_posts_its_body(settings, enqueued, auth):
    with TestClient(_app(settings, enqueued)) as client:
        assert client.post("/v1/jobs", json=make_spec(), headers=auth).status_code == 201
        assert_error(client.post("/v1/jobs", json=make_spec()), 401)


def test_requests_without_a_key_are_capped_per_address(settings, enqueued, auth):
    app = _app(settings, enqueued, max_concurrent_per_address=2)
    with serve(app) as url:
        host, port = url.removeprefix("http://").split(":")
        socks = []
        for _ in range(2):  # two keyless requests whose bodies never finish
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")
            socks.append(sock)
        try:
            time.sleep(0.5)
            resp = httpx.get(f"{url}/healthz", timeout=5)
            err = assert_error(resp, 429, "too_many_requests")
            assert "address without an API key" in err["message"]
            assert httpx.get(f"{url}/v1/jobs", headers=auth, timeout=5).status_code == 200
        finally:
            for sock in socks:
                sock.close()
