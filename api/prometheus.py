"""Prometheus instrumentation: request counters and latencies, and jobs by status.

Each app gets its own `CollectorRegistry` (not the process-global default) so that tests can
build many apps in one process without "duplicated timeseries" errors, and so that `/metrics`
shows exactly this app's numbers.

Requests are labelled by the route *template* (`/v1/jobs/{job_id}`), never the raw path, so
that the number of series stays bounded; requests matching no route share `<unmatched>`.
Per-route counts and latencies show what the tenants do (who cancels, who uploads, when), so
they live in the private registry, shown only with the operator's metrics token, like the
job counts; anyone else sees `brorl_http_responses_total` by status class only.
The `brorl_jobs` gauge is computed when Prometheus scrapes, from the database, so it is
right however many API replicas run and whoever changed the jobs (the worker, the reaper).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from store.jobs import count_jobs_by_status
from store.tables import JobStatus

log = logging.getLogger(__name__)

UNMATCHED = "<unmatched>"


class ApiMetrics:
    """The per-app metric objects: `public` totals, per-route series in `registry`."""

    def __init__(self, registry: CollectorRegistry, public: CollectorRegistry | None = None):
        self.registry = registry
        self.public = public if public is not None else CollectorRegistry()
        self.responses = Counter(
            "brorl_http_responses", "HTTP responses by status class (1xx-5xx).", ["class"],
            registry=self.public)
        self.requests = Counter(
            "brorl_http_requests", "HTTP requests handled.",
            ["method", "route", "status"], registry=registry)
        self.latency = Histogram(
            "brorl_http_request_duration_seconds",
            "Time to the end of the response (for streams: until the stream closes).",
            ["method", "route", "status"], registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))


class JobsByStatusCollector(Collector):
    """`brorl_jobs{status}` read from the database at scrape time."""

    def __init__(self, make_session: Callable[[], sessionmaker[Session]]):
        # A callable, not the sessionmaker itself: the app may swap its sessionmaker later.
        self._make_session = make_session

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("brorl_jobs", "Jobs by status.", labels=["status"])
        counts: dict[str, int] = {s.value: 0 for s in JobStatus}
        try:
            with self._make_session()() as session:
                for status, n in count_jobs_by_status(session).items():
                    counts[getattr(status, "value", status)] = int(n)
        except Exception:  # a scrape must not fail because the database is down
            log.warning("brorl_jobs: could not count jobs", exc_info=True)
            return
        for status, n in sorted(counts.items()):
            family.add_metric([status], n)
        yield family


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


class PrometheusMiddleware:
    """Pure ASGI middleware (not BaseHTTPMiddleware, which buffers and breaks streaming)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}  # if the app dies before answering, it was a 500

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            # The router fills scope["route"] in place, so the template is known by now.
            labels = (scope["method"], _route_template(scope), str(status["code"]))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.responses.labels(f"{str(status['code'])[:1]}xx").inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - start)
