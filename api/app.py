"""The FastAPI application factory: `uvicorn api.app:create_app --factory`.

There is deliberately no module-level `app = create_app()`: importing this module must not
read the environment or open a database, so tests (and `brorl up`) build apps with the
settings they want. Creating the app connects to nothing either: the engine connects on the
first request.

Layout: `/v1/...` resource routers (jobs, events & metrics, checkpoints, datasets), the
unauthenticated health checks `/healthz`, `/readyz`, `/metrics` at the root, `/docs` (OpenAPI, its
assets served from the package: it works offline), and the browser dashboard (`api.web`) at `/`.
Every error leaves in the shape of `api.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi_offline import FastAPIOffline
from starlette.middleware.trustedhost import TrustedHostMiddleware
from prometheus_client import CollectorRegistry

from store.db import get_sessionmaker
from store.settings import Settings, get_settings

from api.deps import Enqueue, celery_enqueue
from api.edge import StorableTextMiddleware
from api.errors import install_error_handlers
from api.headers import SecurityHeadersMiddleware, install_access_log_filter
from api.guards import GuardMiddleware
from api.quotas import StreamSlots
from api.prometheus import ApiMetrics, JobsByStatusCollector, PrometheusMiddleware
from api.ratelimit import RateLimitMiddleware
from api.task_check import TaskCheck
from api.routes import (checkpoints, continuations, datasets, evaluations, events_metrics, graders, health, jobs,
                        probes, samples)
from api.openai import openai_router
from api.web import install_dashboard
from api.webhooks import routes as webhook_routes
from api.webhooks.dispatch import Dispatcher

API_VERSION = "1.0.0"
DEFAULT_STREAM_POLL_SECONDS = 1.0

DESCRIPTION = """\
Submit BroRL training jobs, follow their metrics and download checkpoints.

Authenticate with `Authorization: Bearer <key>` (`brorl keys create --tenant NAME`).
Errors always look like `{"error": {"type", "message", "field"?}}`.
"""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """While the app serves: this process's webhook dispatcher, unless turned off."""
    dispatcher = None
    if app.state.settings.webhook_dispatch:
        dispatcher = Dispatcher(app.state.settings, app.state.sessionmaker)
        dispatcher.start()
    try:
        yield
    finally:
        if dispatcher is not None:
            dispatcher.stop()


def _v1_router() -> APIRouter:
    v1 = APIRouter(prefix="/v1")
    for module in (jobs, continuations, events_metrics, samples, checkpoints, datasets, graders, probes,
                   evaluations):
        v1.include_router(module.router)
    v1.include_router(webhook_routes.router)
    v1.include_router(openai_router())  # /v1/files, /v1/fine_tuning/...: OpenAI's shapes
    return v1


def create_app(settings: Settings | None = None, *, enqueue: Enqueue | None = None,
               stream_poll_seconds: float | None = None) -> FastAPI:
    """Build the API for `settings` (default: from the `BRORL_*` environment).

    `enqueue(job_id, gpus=G)` sends a committed job id to the workers (default: Celery, by
    task name, to the queue of G-GPU workers);
    tests pass a recorder. `stream_poll_seconds` is how often the metrics stream polls
    (default: `settings.stream_poll_seconds` if the settings have one, else 1 s).
    """
    settings = settings or get_settings()
    settings.ensure_dirs()
    # FastAPIOffline: /docs and /redoc load Swagger UI / ReDoc from the package, not a CDN.
    app = FastAPIOffline(
        lifespan=_lifespan,
        title="BroRL as a service",
        version=API_VERSION,
        description=DESCRIPTION,
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    app.state.settings = settings
    app.state.sessionmaker = get_sessionmaker(settings.database_url)
    # `is None`, not `or`: a recorder that is an (empty, so falsy) list is still an enqueue.
    app.state.enqueue = enqueue if enqueue is not None else celery_enqueue(settings)
    app.state.auth_cache = {}  # api.deps: key hash -> (valid until, tenant)
    app.state.stream_slots = StreamSlots()
    app.state.upload_slots = StreamSlots("uploads in progress")
    app.state.task_check = TaskCheck(settings)
    app.state.stream_poll_seconds = (
        stream_poll_seconds
        if stream_poll_seconds is not None
        else float(getattr(settings, "stream_poll_seconds", DEFAULT_STREAM_POLL_SECONDS)))

    # Per-route series and job counts describe every tenant's activity: a registry of their
    # own, shown only with the operator's token; the public one holds totals by status class.
    app.state.private_metrics = CollectorRegistry()
    app.state.metrics = ApiMetrics(app.state.private_metrics)
    app.state.private_metrics.register(JobsByStatusCollector(lambda: app.state.sessionmaker))
    # Added innermost first: trusted hosts run first, every answer gets the security headers,
    # Prometheus sees every answer, rate limiting runs before the guards.
    app.add_middleware(StorableTextMiddleware)
    app.add_middleware(GuardMiddleware, settings=settings)
    app.add_middleware(RateLimitMiddleware, settings=settings)
    app.add_middleware(PrometheusMiddleware, metrics=app.state.metrics)
    app.add_middleware(SecurityHeadersMiddleware)
    if settings.allowed_hosts != ["*"]:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.allowed_hosts)
    install_access_log_filter()

    install_error_handlers(app)
    app.include_router(_v1_router())
    app.include_router(health.router)
    install_dashboard(app)
    return app

