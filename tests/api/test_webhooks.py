"""`/v1/webhooks`: endpoints per tenant, signed deliveries from the outbox to a real receiver on
loopback (allowed by the operator), retries with backoff, rotation, the delivery log, and the
attacks a tenant-given URL brings (loopback, private, link-local, DNS rebinding, redirects)."""
from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook, WebhookVerificationError

from api.app import create_app
from api.webhooks import guard
from api.webhooks.dispatch import dispatch_once
from api.webhooks.guard import guarded_client, parse_networks
from store import webhooks
from store.tables import utcnow
from store.webhook_tables import WebhookDelivery
from tests.api.helpers import assert_error, make_spec

LOOPBACK = "127.0.0.0/8"


class Receiver:
    """A webhook receiver on 127.0.0.1: records each request, answers `status` (and a
    `Location` when it redirects); `mode` "trickle" sends its answer a byte every 0.1 s,
    "flood" a 1 GiB body."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.status, self.location, self.mode = 200, None, None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                try:
                    if receiver.mode == "trickle":
                        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                            self.wfile.write(bytes([byte]))
                            time.sleep(0.1)
                        return
                    if receiver.mode == "flood":
                        self.send_response(200)
                        self.send_header("Content-Length", str(1 << 30))
                        self.end_headers()
                        for _ in range((1 << 30) // 65536):
                            self.wfile.write(bytes(65536))
                        return
                except OSError:  # the dispatcher hung up, as it should
                    self.close_connection = True
                    return
                self.send_response(receiver.status)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def allow_loopback(settings):
    settings.webhook_allowed_networks = LOOPBACK
    return settings


def _send(app, allowed: str = LOOPBACK, deadline_s: float = 5) -> int:
    with guarded_client(parse_networks(allowed), timeout_s=deadline_s) as http:
        return dispatch_once(app.state.sessionmaker, http, lease_s=60, deadline_s=deadline_s)


def _register(client, auth, url, **body):
    resp = client.post("/v1/webhooks", json={"url": url, **body}, headers=auth)
    assert resp.status_code == 201, resp.text
    return resp.json()


def _log(client, auth, endpoint_id):
    return client.get(f"/v1/webhooks/{endpoint_id}/deliveries", headers=auth).json()["data"]


def test_endpoints_are_managed_per_tenant(client, auth, other_auth, allow_loopback, receiver):
    created = _register(client, auth, receiver.url, description="ci", event_types=["job.succeeded"])
    assert created["id"].startswith("whe_") and created["secret"].startswith("whsec_")
    eid = created["id"]
    listed = client.get("/v1/webhooks", headers=auth).json()["data"]
    assert [e["id"] for e in listed] == [eid] and listed[0]["secret"] is None  # shown once
    changed = client.patch(f"/v1/webhooks/{eid}", json={"event_types": None, "enabled": False}, headers=auth)
    assert changed.status_code == 200 and changed.json()["event_types"] is None and not changed.json()["enabled"]
    # Another tenant sees none of it, and cannot act on it.
    assert client.get("/v1/webhooks", headers=other_auth).json()["data"] == []
    for method, path in [("get", ""), ("patch", ""), ("delete", ""), ("post", "/rotate"), ("post", "/test"),
                         ("get", "/deliveries")]:
        kwargs = {"json": {"description": "x"}} if method == "patch" else {}
        assert_error(getattr(client, method)(f"/v1/webhooks/{eid}{path}", headers=other_auth, **kwargs), 404)
    assert_error(client.post("/v1/webhooks", json={"url": receiver.url, "event_types": ["job.nope"]},
                             headers=auth), 422)
    assert client.delete(f"/v1/webhooks/{eid}", headers=auth).status_code == 204
    assert_error(client.get(f"/v1/webhooks/{eid}", headers=auth), 404)


def test_endpoints_per_tenant_are_capped(client, auth, allow_loopback, receiver):
    allow_loopback.webhook_max_endpoints = 2
    for _ in range(2):
        _register(client, auth, receiver.url)
    assert_error(client.post("/v1/webhooks", json={"url": receiver.url}, headers=auth), 429, "quota_exceeded")


HOSTILE_URLS = [
    "http://127.0.0.1:8000/hook", "http://localhost/hook", "http://[::1]/hook",
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/hook", "http://192.168.1.1/hook",
    "http://100.64.0.1/hook", "http://[fd00::1]/hook", "http://[fe80::1]/hook", "http://0.0.0.0/hook",
    "http://0x7f000001/hook", "http://2130706433/hook", "http://[::ffff:127.0.0.1]/hook",
    "http://[64:ff9b::a9fe:a9fe]/hook", "http://[2002:7f00:1::]/hook", "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_INFO", "http://user:secret@127.0.0.1/hook", "http:///hook",
]


def test_urls_that_reach_inside_are_refused(client, auth):
    for url in HOSTILE_URLS:
        assert_error(client.post("/v1/webhooks", json={"url": url}, headers=auth), 422, field="url")
    assert client.get("/v1/webhooks", headers=auth).json()["data"] == []


def test_a_url_changed_to_reach_inside_is_refused(client, auth, allow_loopback, receiver):
    eid = _register(client, auth, receiver.url)["id"]
    allow_loopback.webhook_allowed_networks = ""
    assert_error(client.patch(f"/v1/webhooks/{eid}", json={"url": "http://169.254.169.254/"}, headers=auth),
                 422, field="url")
    assert client.get(f"/v1/webhooks/{eid}", headers=auth).json()["url"] == receiver.url


def test_a_job_event_is_delivered_signed_once(app, client, auth, allow_loopback, receiver):
    endpoint = _register(client, auth, receiver.url, event_types=["job.cancelled", "job.succeeded"])
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)  # queued: cancelled at once
    assert _send(app) == 1 and _send(app) == 0  # sent once, then nothing is due
    (req,) = receiver.requests
    payload = Webhook(endpoint["secret"]).verify(req["body"], req["headers"])
    assert payload["type"] == "job.cancelled" and payload["data"]["id"] == job["id"]
    assert payload["data"]["object"] == "job"
    with pytest.raises(WebhookVerificationError):
        Webhook(webhooks.new_secret()).verify(req["body"], req["headers"])
    (logged,) = _log(client, auth, endpoint["id"])
    assert logged["status"] == "delivered" and logged["attempts"] == 1 and logged["last_status_code"] == 200
    assert logged["message_id"] == req["headers"]["webhook-id"]


def test_events_an_endpoint_did_not_ask_for_are_not_sent(app, client, auth, allow_loopback, receiver):
    _register(client, auth, receiver.url, event_types=["job.succeeded"])
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert _send(app) == 0 and receiver.requests == []


def test_a_failing_receiver_is_retried_with_backoff_then_given_up(app, client, auth, allow_loopback, receiver):
    eid = _register(client, auth, receiver.url)["id"]
    receiver.status = 500
    client.post(f"/v1/webhooks/{eid}/test", headers=auth)
    assert _send(app) == 1
    (logged,) = _log(client, auth, eid)
    assert logged["status"] == "pending" and logged["attempts"] == 1 and logged["last_error"] == "HTTP 500"
    assert _send(app) == 0  # not due for 5 s
    with app.state.sessionmaker() as s:
        delays = [webhooks.retry_delay(n).total_seconds() for n in range(1, 12)]
        assert delays[:4] == [5, 20, 80, 320] and max(delays) == 6 * 3600
        # A day later the next failure is the last.
        status = webhooks.record_attempt(s, logged["id"], ok=False, status_code=500, error="HTTP 500",
                                         now=utcnow() + timedelta(days=1))
        s.commit()
    assert status == "failed" and _log(client, auth, eid)[0]["status"] == "failed"
    receiver.status = 204
    retried = client.post(f"/v1/webhooks/{eid}/deliveries/{logged['id']}/retry", headers=auth)
    assert retried.json()["status"] == "pending"
    assert _send(app) == 1 and _log(client, auth, eid)[0]["status"] == "delivered"
    assert len(receiver.requests) == 2


@pytest.mark.parametrize("mode, reason", [("trickle", "timed out: no complete answer within the 1 s deadline"),
                                          ("flood", "answer body over 64 KiB")])
def test_a_receiver_that_trickles_or_floods_its_answer_fails_by_the_deadline(
        app, client, auth, allow_loopback, receiver, mode, reason):
    """httpx's timeouts are per read: a byte every 0.1 s would hold a 1 s timeout for the whole
    3.8 s answer (and a delivery past its claim's lease). The delivery ends by its deadline, is
    logged failed with the reason, and is sent again when its backoff is over."""
    eid = _register(client, auth, receiver.url)["id"]
    receiver.mode = mode
    client.post(f"/v1/webhooks/{eid}/test", headers=auth)
    started = time.monotonic()
    assert _send(app, deadline_s=1) == 1
    elapsed = time.monotonic() - started
    assert elapsed < 1.8, f"{mode}: the delivery took {elapsed:.2f} s against a 1 s deadline"
    (logged,) = _log(client, auth, eid)
    assert logged["status"] == "pending" and logged["attempts"] == 1, logged
    assert reason in logged["last_error"], logged
    assert _send(app, deadline_s=1) == 0  # not due again before its backoff
    with app.state.sessionmaker() as s:  # the backoff over: sent again, to a receiver now well
        s.get(WebhookDelivery, logged["id"]).next_attempt_at = utcnow()
        s.commit()
    receiver.mode = None
    assert _send(app, deadline_s=1) == 1
    assert _log(client, auth, eid)[0]["status"] == "delivered" and len(receiver.requests) == 2


def test_a_rotated_secret_signs_beside_the_new_one(app, client, auth, allow_loopback, receiver):
    old = _register(client, auth, receiver.url)
    new = client.post(f"/v1/webhooks/{old['id']}/rotate", headers=auth).json()
    assert new["secret"] != old["secret"]
    client.post(f"/v1/webhooks/{old['id']}/test", headers=auth)
    _send(app)
    (req,) = receiver.requests
    assert len(req["headers"]["webhook-signature"].split(" ")) == 2
    for secret in (old["secret"], new["secret"]):  # a receiver on either secret accepts it
        assert Webhook(secret).verify(req["body"], req["headers"])["type"] == "webhook.test"


def test_dns_rebinding_is_refused_at_delivery(app, client, auth, receiver, monkeypatch):
    """Public when registered, loopback when delivered: the delivery checks the address it
    connects to, so it is refused and the receiver on loopback hears nothing."""
    port = receiver.server.server_port
    answers = {"rebind.example": "93.184.215.14"}
    real = guard.socket.getaddrinfo

    def fake(host, *args, **kwargs):
        if host in answers:
            return [(2, 1, 6, "", (answers[host], port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(guard.socket, "getaddrinfo", fake)
    eid = _register(client, auth, f"http://rebind.example:{port}/hook")["id"]
    answers["rebind.example"] = "127.0.0.1"
    client.post(f"/v1/webhooks/{eid}/test", headers=auth)
    assert _send(app, allowed="") == 1
    (logged,) = _log(client, auth, eid)
    assert logged["status"] == "pending" and "not a public address" in logged["last_error"]
    assert receiver.requests == []


def test_redirects_are_not_followed(app, client, auth, allow_loopback, receiver):
    eid = _register(client, auth, receiver.url)["id"]
    receiver.status, receiver.location = 307, "http://169.254.169.254/latest/meta-data/"
    client.post(f"/v1/webhooks/{eid}/test", headers=auth)
    _send(app)
    (logged,) = _log(client, auth, eid)
    assert logged["last_status_code"] == 307 and logged["status"] == "pending"
    assert len(receiver.requests) == 1


def test_the_outbox_survives_a_restart_and_the_app_sends_it(settings, enqueued, key, auth, receiver):
    """Events committed while no dispatcher runs are sent by the next API process's own
    dispatcher thread (the app's lifespan), with nothing lost."""
    settings.webhook_allowed_networks = LOOPBACK
    with TestClient(create_app(settings, enqueue=enqueued)) as client:  # dispatch off (conftest)
        eid = _register(client, auth, receiver.url)["id"]
        job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()
        client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    time.sleep(0.2)
    assert receiver.requests == []
    with TestClient(create_app(settings.model_copy(update={"webhook_dispatch": True}), enqueue=enqueued)) as client:
        deadline = time.monotonic() + 15
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [json.loads(r["body"])["type"] for r in receiver.requests] == ["job.cancelled"]
        assert _log(client, auth, eid)[0]["status"] == "delivered"
