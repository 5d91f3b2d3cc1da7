"""A job's event log and metrics: paged lists, and a live metrics stream (Server-Sent Events).

The stream polls the database (the truth, written by whichever worker runs the job) rather
than subscribing to a broker channel: one query per poll per follower is cheap, works the
same on SQLite and Postgres, and needs nothing besides the database. Each poll opens its own
short session in a worker thread and closes it, so a follower watching a day-long job holds
no connection or transaction between polls.

Wire format (one SSE event per message):
  event: metric   id: <step>   data: MetricPublic as JSON
  event: status   data: {"status", "step", "cancel_requested"}   (on every status change)
  event: progress data: EventPublic of the newest `progress` event (a long phase: warm start,
                  model load, engine start, evaluation; trainer.events), while the job runs;
                  no id, so a reconnect still resumes by step
  event: end      data: {"status"}   (after a terminal status and its last metric row)
Reconnecting clients send `Last-Event-ID` (the last step seen), or `?after_step=`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import TypeAdapter
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from store import jobs
from store.db import get_read_engine
from store.errors import NotFound
from store.tables import TERMINAL_STATUSES, EventType, JobStatus
from trainer.spec import MAX_TOTAL_STEPS

from api.deps import SessionDep, TenantDep
from api.errors import ApiError
from api.submission import job_or_404
from api.schemas import EventPublic, ListPublic, MetricPublic

router = APIRouter(prefix="/jobs/{job_id}", tags=["events & metrics"])

STREAM_BATCH = 500  # metric rows per poll; a backlog is drained without waiting between pages
PING_SECONDS = 15
# Every integer parameter is bounded, so none reaches the database as an out-of-range
# BIGINT (a 500 before). Event ids stay within what a JavaScript number holds exactly.
MAX_EVENT_ID = 2**53
MIN_STEP, MAX_STEP = -1, MAX_TOTAL_STEPS
AfterStep = Annotated[int | None, Query(ge=MIN_STEP, le=MAX_STEP,
                                        description="Only steps after this one.")]


@router.get("/events", response_model=ListPublic[EventPublic])
def list_events(
    job_id: str, session: SessionDep, tenant: TenantDep,
    after: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID,
                                       description="The last event id seen.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ListPublic[EventPublic]:
    """Events oldest first."""
    job_or_404(session, tenant.id, job_id)
    rows = jobs.list_events(session, tenant.id, job_id, after=after, limit=limit + 1)
    return ListPublic[EventPublic](data=[EventPublic.model_validate(e) for e in rows[:limit]],
                                   has_more=len(rows) > limit)


@router.get("/metrics", response_model=ListPublic[MetricPublic])
async def list_metrics(
    job_id: str, request: Request, tenant: TenantDep,
    after_step: AfterStep = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    """Metric rows by ascending step."""
    # The dashboards' hot path (bench/load.py): one thread-pool hop, one query, the page's
    # JSON assembled from the database's JSON text (docs/hardening.md, "Load").
    engine = get_read_engine(request.app.state.settings.database_url)
    body = await run_in_threadpool(_metric_page, engine, tenant.id, job_id, after_step, limit)
    if body is None:
        raise NotFound(f"job {job_id} not found")
    # A poller that sends back the ETag of an unchanged page gets a bodyless 304.
    etag = '"%s"' % hashlib.blake2b(body, digest_size=12).hexdigest()
    headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


_DATETIME = TypeAdapter(datetime)


def _metric_json(step: int, values: str, created_at: datetime) -> bytes:
    """One MetricPublic as JSON, byte for byte what pydantic writes apart from the spacing
    inside `values` (kept as the database wrote it)."""
    if "NaN" in values or "Infinity" in values:  # not JSON; only old SQLite rows can hold it
        return MetricPublic(step=step, values=json.loads(values),
                            created_at=created_at).model_dump_json().encode()
    return b'{"object":"job.metric","step":%d,"values":%s,"created_at":%s}' % (
        step, values.encode(), _DATETIME.dump_json(created_at))


def _metric_page(engine: Engine, tenant_id: int, job_id: str, after_step: int | None,
                 limit: int) -> bytes | None:
    for retry in (True, False):
        try:
            with engine.connect() as conn:
                rows = jobs.metric_page_raw(conn, tenant_id, job_id, after_step, limit + 1)
            break
        except DBAPIError as exc:  # a connection the server dropped (no pre-ping): once more
            if not (retry and exc.connection_invalidated):
                raise
    if rows is None:
        return None
    data = b",".join(_metric_json(*row) for row in rows[:limit])
    more = b"true" if len(rows) > limit else b"false"
    return b'{"object":"list","data":[%s],"has_more":%s}' % (data, more)


def _resume_step(last_event_id: str | None, after_step: int | None) -> int | None:
    """Last-Event-ID wins over ?after_step= (it is what the browser resends on reconnect)."""
    if last_event_id is None or last_event_id.strip() == "":
        return after_step
    try:
        step = int(last_event_id)
    except ValueError:
        step = None
    if step is None or not MIN_STEP <= step <= MAX_STEP:
        raise ApiError(422, f"Last-Event-ID must be a step number from {MIN_STEP} to {MAX_STEP}",
                       field="Last-Event-ID")
    return step


PROGRESS_LOOKBACK = 20  # events read back on a first poll to find the phase in progress


class _ProgressCursor:
    """The newest `progress` event not sent yet; `last_id`: the newest event id read."""

    def __init__(self) -> None:
        self.last_id: int | None = None

    def newest(self, session: Session, tenant_id: int, job_id: str) -> EventPublic | None:
        # Progress events are rate-limited at the source (about one a second per phase), so
        # one page after the cursor holds every new event; the first read looks back a little.
        if self.last_id is None:
            rows = jobs.list_events(session, tenant_id, job_id, limit=PROGRESS_LOOKBACK, newest_first=True)[::-1]
        else:
            rows = jobs.list_events(session, tenant_id, job_id, after=self.last_id, limit=STREAM_BATCH)
        if rows:
            self.last_id = rows[-1].id
        progress = [e for e in rows if e.type == EventType.progress]
        return EventPublic.model_validate(progress[-1]) if progress else None


def _poll(make: sessionmaker[Session], tenant_id: int, job_id: str, after_step: int | None,
          cursor: _ProgressCursor) -> tuple[dict[str, Any] | None, list[MetricPublic], EventPublic | None]:
    """(the job's state or None if it is gone, new metric rows, the newest progress event
    while it runs) from one short session."""
    with make() as session:
        # Status first, rows second: if the job was already terminal when read, every row it
        # wrote is committed before this SELECT, so "terminal and nothing left" really is the end.
        job = jobs.get_job(session, tenant_id, job_id)
        if job is None:
            return None, [], None
        state = {"status": job.status.value, "step": job.step,
                 "cancel_requested": job.cancel_requested}
        rows = jobs.list_metrics(session, tenant_id, job_id, after_step=after_step,
                                 limit=STREAM_BATCH)
        # Only a running attempt writes progress: other statuses cost no events query.
        progress = cursor.newest(session, tenant_id, job_id) if job.status == JobStatus.running else None
        return state, [MetricPublic.model_validate(m) for m in rows], progress


async def _metric_events(make: sessionmaker[Session], tenant_id: int, job_id: str,
                         after_step: int | None,
                         poll_seconds: float) -> AsyncIterator[ServerSentEvent]:
    # No disconnect check here: EventSourceResponse watches the connection and cancels this
    # generator (at its next await) when the client goes away.
    last_status: str | None = None
    cursor = _ProgressCursor()
    while True:
        state, rows, progress = await anyio.to_thread.run_sync(_poll, make, tenant_id, job_id, after_step, cursor)
        if state is None:  # deleted under us
            yield ServerSentEvent(event="end", data=json.dumps({"status": None}))
            return
        for row in rows:
            after_step = row.step
            yield ServerSentEvent(event="metric", id=str(row.step), data=row.model_dump_json())
        if state["status"] != last_status:
            last_status = state["status"]
            yield ServerSentEvent(event="status", data=json.dumps(state))
        if progress is not None:
            yield ServerSentEvent(event="progress", data=progress.model_dump_json())
        if len(rows) == STREAM_BATCH:
            continue  # a backlog: fetch the next page at once
        if JobStatus(state["status"]) in TERMINAL_STATUSES:
            yield ServerSentEvent(event="end", data=json.dumps({"status": state["status"]}))
            return
        await anyio.sleep(poll_seconds)


@router.get(
    "/metrics/stream",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}},
                     "description": "`metric`, `status`, `progress` and `end` events (see the module doc)."}},
)
def stream_metrics(
    job_id: str, request: Request, session: SessionDep, tenant: TenantDep,
    after_step: AfterStep = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> EventSourceResponse:
    """Follow a job's metrics live; the stream closes after the job ends."""
    job_or_404(session, tenant.id, job_id)
    start = _resume_step(last_event_id, after_step)
    tenant_id = tenant.id
    # The request's session has done its part (auth, 404); release its connection now
    # instead of holding it for as long as the stream stays open.
    session.close()
    state = request.app.state
    release = state.stream_slots.acquire(tenant_id, state.settings.max_streams_per_tenant)
    # Released when the generator ends and, in case it never started, after the response.
    return EventSourceResponse(
        _released_after(_metric_events(state.sessionmaker, tenant_id, job_id, start,
                                       state.stream_poll_seconds), release),
        ping=PING_SECONDS,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(release),
    )


async def _released_after(events: AsyncIterator[ServerSentEvent],
                          release: Callable[[], None]) -> AsyncIterator[ServerSentEvent]:
    try:
        async for event in events:
            yield event
    finally:
        release()
