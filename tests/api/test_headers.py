"""What protects the key a browser tab holds: CSP and frame-ancestors on every response,
trusted Host headers, no query strings in the access log, no hub id with a trailing newline."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from store.model_paths import model_path_problem
from tests.api.helpers import assert_error, make_spec


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/static/shell.html", "/openapi.json",
                                  "/healthz", "/", "/v1/jobs", "/no/such/page"])
def test_every_response_forbids_framing(client, path):
    resp = client.get(path)
    csp = resp.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp, (path, resp.headers)
    assert "object-src 'none'" in csp and "base-uri 'none'" in csp
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_docs_allow_only_their_own_scripts(client):
    csp = client.get("/docs").headers["content-security-policy"]
    assert "script-src 'self' 'unsafe-inline'" in csp and "connect-src 'self'" in csp
    # The dashboard keeps its stricter policy: no inline script where the key is typed.
    assert "unsafe-inline" not in client.get("/").headers["content-security-policy"].split(
        "script-src")[1].split(";")[0]


def test_allowed_hosts_refuse_a_forged_host(settings, enqueued):
    app = create_app(settings.model_copy(update={"allowed_hosts": ["api.example", "localhost"]}),
                     enqueue=enqueued)
    with TestClient(app) as client:
        assert client.get("/healthz", headers={"Host": "api.example"}).status_code == 200
        resp = client.get("/docs/", headers={"Host": "evil.example"}, follow_redirects=False)
        assert resp.status_code == 400 and "evil.example" not in resp.headers.get("location", "")


def test_allowed_hosts_from_the_environment(monkeypatch, tmp_path):
    from store.settings import Settings

    monkeypatch.setenv("BRORL_ALLOWED_HOSTS", "api.example, *.corp.example")
    assert Settings(data_dir=tmp_path).allowed_hosts == ["api.example", "*.corp.example"]


def test_access_log_redacts_query_strings(app, caplog):
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    # The call uvicorn's h11 and httptools protocols make for each request.
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "10.0.0.1:5000", "GET",
        "/v1/jobs?limit=5&api_key=brorl_s3cret", "1.1", 401)
    assert "brorl_s3cret" not in caplog.text
    assert "/v1/jobs?limit=<redacted>&api_key=<redacted>" in caplog.text


@pytest.mark.parametrize("path", ["gpt2\n", "org/model\n", "gpt2\r", "\u0433pt2"])
def test_hub_ids_are_anchored_at_the_very_end(settings, path):
    hub = settings.model_copy(update={"allow_hub_models": True})
    assert model_path_problem("org/model", hub) is None
    assert model_path_problem(path, hub) == \
        f"{path!r} is neither builtin:tiny, an absolute folder path nor a model hub id"


def test_a_hub_id_with_a_newline_is_422(settings, enqueued, auth):
    app = create_app(settings.model_copy(update={"allow_hub_models": True}), enqueue=enqueued)
    with TestClient(app) as client:
        resp = client.post("/v1/jobs", json=make_spec(model={"path": "gpt2\n"}), headers=auth)
        assert_error(resp, 422, field="model.path")
