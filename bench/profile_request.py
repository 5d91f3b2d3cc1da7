"""Where one `GET /v1/jobs/{id}/metrics` spends its CPU, in-process, on PostgreSQL.

    python bench/profile_request.py [--requests 2000] [--rows 50]

Drives the ASGI app directly (no HTTP client, no socket: only the server's own work) with
the dashboards' request of bench/load.py, one at a time, and prints (and writes to
bench/out/profile_request.txt) the CPU ms per request of the whole app and of its layers
(the route's own work now and as it was before the hot-path rewrite, the framework and
middleware on a route without a database),
then a cProfile of the whole app (thread-pool calls run inline so the profile sees them).
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


from bench.load import _setup, scratch_database  # noqa: E402


def _cpu_ms(fn, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return 1000 * (time.process_time() - t0) / n


async def _get(app, path: str, query: str, key: str) -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"x"), (b"authorization", f"Bearer {key}".encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    out: dict = {"body": b""}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["body"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=50)
    args = ap.parse_args()
    import os

    with scratch_database("brorl_prof") as url:
        lines: list[str] = []
        job_id, victims, _ = _setup(url, 1, 0)
        from store import jobs
        from store.db import session_scope

        with session_scope(url) as s:
            for step in range(args.rows):
                jobs.record_metrics(s, job_id, 1, step, {"loss": 1.0 / (step + 1), "reward_mean": 0.5})
        os.environ.update(BRORL_DATABASE_URL=url, BRORL_DATA_DIR=tempfile.mkdtemp(),
                          BRORL_RATE_LIMIT_PER_S="0")
        from store.settings import get_settings

        from api.app import create_app

        app = create_app(get_settings())
        key, path, query = victims[0], f"/v1/jobs/{job_id}/metrics", "limit=50"
        loop = asyncio.new_event_loop()
        status, body = loop.run_until_complete(_get(app, path, query, key))
        assert status == 200 and len(json.loads(body)["data"]) == min(50, args.rows), body[:200]
        n = args.requests
        figures = {"whole app (ASGI, threadpool hops)":
                   _cpu_ms(lambda: loop.run_until_complete(_get(app, path, query, key)), n)}
        tenant_id = app.state.auth_cache and next(iter(app.state.auth_cache.values()))[1].id
        make = app.state.sessionmaker

        def queries() -> None:
            with make() as s:
                jobs.get_job(s, tenant_id, job_id)
                jobs.list_metrics(s, tenant_id, job_id, limit=51)

        def route_work() -> None:
            from api.schemas import ListPublic, MetricPublic

            with make() as s:
                jobs.get_job(s, tenant_id, job_id)
                rows = jobs.list_metrics(s, tenant_id, job_id, limit=51)
                page = ListPublic[MetricPublic](data=[MetricPublic.model_validate(m) for m in rows[:50]])
                page.model_dump_json()

        from api.routes.events_metrics import _metric_page
        from store.db import get_read_engine

        read = get_read_engine(url)
        figures["route work now: one raw query + page assembly"] = _cpu_ms(
            lambda: _metric_page(read, tenant_id, job_id, None, 50), n)
        figures["route work before: session, two ORM queries"] = _cpu_ms(queries, n)
        figures["route work before: + pydantic models + JSON"] = _cpu_ms(route_work, n)
        figures["/healthz (framework + middleware, no DB)"] = _cpu_ms(
            lambda: loop.run_until_complete(_get(app, "/healthz", "", key)), n)
        for what, ms in figures.items():
            lines.append(f"{ms:7.3f} CPU ms/request  {what}")

        import anyio.to_thread

        async def inline(fn, *a, **kw):  # profile the thread-pool work in this thread
            return fn(*a)
        anyio.to_thread.run_sync = inline
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(min(n, 500)):
            loop.run_until_complete(_get(app, path, query, key))
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        lines.append(buf.getvalue())
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_request.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
