"""Probes, Prometheus, the error shape for 404/405/500, streaming limits, and no torch."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from api.app import create_app
from trainer.graders import sandbox_layer

from tests.api.helpers import UPLOAD_LIMIT, assert_error, make_spec

REPO = Path(__file__).resolve().parents[2]


def test_healthz_needs_no_auth(client):
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}


def test_readyz_checks_database_and_broker(client, settings):
    resp = client.get("/readyz")
    assert resp.status_code == 200, resp.text
    assert resp.json()["checks"] == {"database": "ok", "broker": "ok"}
    assert resp.json()["sandbox"] == sandbox_layer()  # the grader sandbox layer in use
    assert resp.json()["sandbox"] in ("bubblewrap", "landlock", "unsafe", "none")


def test_readyz_says_why_tenant_code_cannot_run_here(client, monkeypatch):
    from trainer.graders.sandbox import detect, layer

    why = "bubblewrap: not installed; landlock: the kernel has no Landlock"
    monkeypatch.setattr(detect, "_detect", lambda: detect.LayerStatus("none", why))
    monkeypatch.delenv(layer.UNSAFE_ENV, raising=False)
    body = client.get("/readyz").json()
    assert body["sandbox"] == "none" and body["sandbox_reason"] == why


def test_readyz_is_503_naming_the_broker(settings, enqueued):
    bad = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(bad, enqueue=enqueued)) as client:
        resp = client.get("/readyz")
    err = assert_error(resp, 503, "unavailable")
    assert "broker" in err["message"] and "database" not in err["message"]
    assert resp.json()["checks"]["database"] == "ok"
    assert resp.json()["checks"]["broker"].startswith("broker unreachable")
    assert resp.json()["sandbox"] == sandbox_layer()


def test_prometheus_metrics(app, client, auth):
    job = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    client.get(f"/v1/jobs/{job}", headers=auth)
    client.get("/v1/jobs/job_nope", headers=auth)
    client.get("/no/such/path")
    # Without the operator's token: totals by status class, nothing per route or per job.
    public = client.get("/metrics", headers=auth).text
    assert 'brorl_http_responses_total{class="2xx"}' in public
    assert "route=" not in public and "brorl_jobs" not in public
    app.state.settings.metrics_token = "ops-secret"
    text = client.get("/metrics", headers={"Authorization": "Bearer ops-secret"}).text
    assert ('brorl_http_requests_total{method="POST",route="/v1/jobs",status="201"} 1.0'
            in text)
    assert ('brorl_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"} 1.0'
            in text)
    assert 'route="/v1/jobs/{job_id}",status="404"' in text  # templates, not raw ids
    assert 'route="<unmatched>",status="404"' in text and "job_nope" not in text
    assert "brorl_http_request_duration_seconds_bucket" in text
    assert 'brorl_jobs{status="queued"} 1.0' in text
    assert 'brorl_jobs{status="succeeded"} 0.0' in text


def test_unknown_route_and_method_use_the_error_shape(client, auth):
    assert_error(client.get("/v1/nothing", headers=auth), 404, "not_found")
    assert_error(client.delete("/v1/jobs", headers=auth), 405, "method_not_allowed")


def test_unhandled_errors_are_500_without_internals(app, auth):
    def explode():
        raise RuntimeError("secret internal detail")

    from api.deps import get_session
    app.dependency_overrides[get_session] = explode
    with TestClient(app, raise_server_exceptions=False) as client:
        resp = client.get("/v1/jobs", headers=auth)
    err = assert_error(resp, 500, "internal_error")
    assert "secret" not in resp.text and "Traceback" not in resp.text
    assert err["message"] == "internal server error"


def test_upload_stops_reading_past_the_limit(app, auth):
    """A body streamed without Content-Length is cut off once the file passes the limit."""
    sent = {"bytes": 0}
    chunk = b'{"prompt": "1+1", "answer": "2"}\n' * 500

    async def body():
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        for _ in range(1000):  # ~16 MB, far past the 64 KiB limit
            sent["bytes"] += len(chunk)
            yield chunk
        yield b"\r\n--b--\r\n"

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/v1/datasets", content=body(),
                                headers={**auth, "Content-Type": "multipart/form-data; boundary=b"})

    # In a thread of its own: a browser test earlier in the session leaves Playwright's event
    # loop running in this thread, where asyncio.run() refuses to start.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        resp = pool.submit(asyncio.run, go()).result()
    assert_error(resp, 413)
    assert sent["bytes"] < 4 * UPLOAD_LIMIT


def test_the_api_never_imports_torch(tmp_path):
    """In a fresh interpreter: build the app, exercise every route family, check sys.modules."""
    script = textwrap.dedent(f"""
        import sys
        from fastapi.testclient import TestClient
        from api.app import create_app
        from store.db import session_scope
        from store.keys import create_key
        from store.migrate import upgrade
        from store.settings import Settings

        url = "sqlite:///{tmp_path}/t.db"
        upgrade(url)
        with session_scope(url) as s:
            key = create_key(s, "t")
        h = {{"Authorization": "Bearer " + key}}
        settings = Settings(data_dir="{tmp_path}/d", database_url=url)
        app = create_app(settings)  # the real Celery enqueue, to a SQLite broker
        app.state.enqueue("job_probe")  # raises if the message cannot be sent
        with TestClient(app) as c:
            ds = c.post("/v1/datasets", headers=h,
                        files={{"file": ("d.jsonl", b'{{"prompt": "p", "answer": "1"}}\\n')}})
            assert ds.status_code == 201, ds.text
            spec = {make_spec()!r}
            job = c.post("/v1/jobs", json=spec, headers=h).json()["id"]
            spec["task"] = {{"dataset": {{"id": ds.json()["id"], "verifier": "numeric"}}}}
            assert c.post("/v1/jobs", json=spec, headers=h).status_code == 201
            c.post("/v1/jobs", json={{**spec, "seed": "x"}}, headers=h)
            for url in ["/v1/jobs", f"/v1/jobs/{{job}}", f"/v1/jobs/{{job}}/events",
                        f"/v1/jobs/{{job}}/metrics", f"/v1/jobs/{{job}}/checkpoints",
                        "/healthz", "/readyz", "/metrics", "/openapi.json"]:
                assert c.get(url, headers=h).status_code < 500, url
            c.post(f"/v1/jobs/{{job}}/cancel", headers=h)
            c.get(f"/v1/jobs/{{job}}/metrics/stream", headers=h)
        heavy = sorted(m for m in ("torch", "vllm", "transformers") if m in sys.modules)
        print("HEAVY", heavy)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout
