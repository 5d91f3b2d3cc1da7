"""Health checks and scrape endpoints, all without auth: `/healthz`, `/readyz`, `/metrics`.

`/healthz` only says the process serves HTTP (a liveness check must not fail because the
database is down, or the orchestrator would restart healthy API pods in a loop). `/readyz`
checks what a request needs: the database answers `SELECT 1` and the broker accepts a
connection; it answers 503 naming what is down, so a load balancer stops routing to us. It
also reports the grader sandbox layer this process would use (`sandbox`: bubblewrap, landlock,
unsafe or none) and why no better one works (`sandbox_reason`, where one does not); `none` is
not "down": only python and code graders need a layer, and those are refused with the reason.
`/metrics` is Prometheus' text format from this app's own registry; the per-status job
counts (every tenant's) are added only for a caller with the operator's metrics token.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from api.deps import SettingsDep
from api.errors import error_body
from api.schemas import StatusPublic
from trainer.graders.sandbox.detect import layer_status

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])

BROKER_TIMEOUT_S = 2.0


@router.get("/healthz", response_model=StatusPublic, response_model_exclude_none=True)
def healthz() -> StatusPublic:
    return StatusPublic(status="ok")


def _check_database(make: sessionmaker[Session]) -> str | None:
    try:
        with make() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:
        log.warning("readyz: database check failed: %s", exc)
        return f"database unreachable: {type(exc).__name__}"
    return None


def _check_broker(url: str) -> str | None:
    # kombu, not celery: connecting needs no app and imports nothing heavy.
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=BROKER_TIMEOUT_S,
                        transport_options={"max_retries": 1}) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2,
                                   timeout=BROKER_TIMEOUT_S)
    except Exception as exc:
        log.warning("readyz: broker check failed: %s", exc)
        return f"broker unreachable: {type(exc).__name__}"
    return None


@router.get("/readyz", response_model=StatusPublic,
            responses={503: {"description": "The database or the broker is down."}})
def readyz(request: Request, settings: SettingsDep) -> Response:
    problems = {
        "database": _check_database(request.app.state.sessionmaker),
        "broker": _check_broker(settings.broker_url),
    }
    down = {k: v for k, v in problems.items() if v}
    checks = {k: (v or "ok") for k, v in problems.items()}
    sandbox = layer_status()
    reason = sandbox.reason or None
    if down:
        body = error_body(503, "not ready: " + "; ".join(down.values()))
        body["checks"], body["sandbox"], body["sandbox_reason"] = checks, sandbox.layer, reason
        return JSONResponse(body, status_code=503)
    return JSONResponse(StatusPublic(status="ok", checks=checks, sandbox=sandbox.layer,
                                     sandbox_reason=reason).model_dump(exclude_none=True))


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request, settings: SettingsDep) -> Response:
    """Prometheus exposition: responses by status class; per-route requests and latencies
    and `brorl_jobs{status}` (every tenant's activity) only with
    `Authorization: Bearer <BRORL_METRICS_TOKEN>`."""
    data = generate_latest(request.app.state.metrics.public)
    token = settings.metrics_token
    sent = request.headers.get("authorization", "")
    if token and hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        data += generate_latest(request.app.state.private_metrics)
    return Response(content=data, media_type=CONTENT_TYPE_LATEST)
