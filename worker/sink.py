"""`DbSink`: the trainer's metrics sink that writes into the database.

Each write opens its own short session and commits, so a long training run never holds a
transaction (or an SQLite write lock) open between steps. Every write carries the attempt
that claimed the job; once a newer attempt owns the job the store raises `Fenced`, the sink
reports it through `on_fenced` and re-raises, and the exception unwinds the training loop:
a worker that lost its lease must stop, not keep writing over its successor.

While the database is unreachable, metric and event rows wait in a bounded in-memory buffer
and training goes on: each later call retries (with backoff) to write the whole buffer, in
order, in one transaction, so a retry writes all of it or none of it. A fenced flush drops
the buffer (a stale attempt's rows are never written); a full buffer raises `SinkBufferFull`
and ends the attempt (the reaper retries the job from its last checkpoint). `flush()` waits
for the buffer to drain (before a checkpoint is recorded and before the outcome is).

A checkpoint is recorded in three moves: build its download archive (once, here, so the API
serves a ready file), record the row (fenced; rows past `keep_last` are deleted in the same
transaction), then delete the folders no longer recorded. A fenced record deletes the folder
it was about to register: no file of a stale attempt survives it.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from sqlalchemy.exc import OperationalError

from store import jobs
from store.db import session_scope
from store.errors import Fenced
from trainer.checkpoints import format as ckpt_format
from trainer.events import EventType, event_type

log = logging.getLogger(__name__)


class SinkBufferFull(RuntimeError):
    """The database stayed unreachable for longer than the buffer could cover."""


class DatabaseUnavailable(RuntimeError):
    """Buffered rows could not be written within the sink's retry time."""


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN/Infinity are not JSON: PostgreSQL's jsonb refuses the whole row
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Metric values as plain JSON (trainers hand over numpy / torch scalars; a diverged
    step's NaN loss is stored as null rather than failing the write)."""
    return {str(key): _plain(value) for key, value in values.items()}


class DbSink:
    """Implements `trainer.sink.MetricsSink` with fenced writes for one (job, attempt)."""

    def __init__(self, job_id: str, attempt: int,
                 on_fenced: Callable[[], None] | None = None,
                 uri_for: Callable[[Path], str] | None = None,
                 keep_last: int | None = None, retry_seconds: float = 0.0,
                 buffer_rows: int = 10_000, max_sample_bytes: int = 50 * 2**20,
                 database_url: str | None = None) -> None:
        self.job_id = job_id
        self.database_url = database_url  # None: the process-wide settings' database
        self.attempt = attempt
        self.keep_last = keep_last
        self.retry_seconds = retry_seconds
        self.buffer_rows = buffer_rows
        self.max_sample_bytes = max_sample_bytes
        self._on_fenced = on_fenced or (lambda: None)
        self._uri_for = uri_for or (lambda path: str(Path(path).resolve()))
        self._pending: deque[tuple[Callable[..., Any], tuple, dict]] = deque()
        self._retry_at = 0.0  # monotonic time of the next write attempt while the db is down
        self._pause = 0.2
        self._down_since: float | None = None
        self.max_buffered = 0  # the most rows that ever waited (logs, tests)

    def _fenced(self) -> None:
        log.warning("job %s attempt %s was fenced off; stopping", self.job_id, self.attempt)
        self._on_fenced()

    def _try_flush(self) -> bool:
        """Write every buffered row in one transaction; False if the database is still down."""
        if not self._pending:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            with session_scope(self.database_url) as s:
                for fn, args, kwargs in self._pending:
                    fn(s, self.job_id, *args, **kwargs)
        except OperationalError:
            now = time.monotonic()
            self._down_since = self._down_since or now
            self._retry_at, self._pause = now + self._pause, min(self._pause * 2, 5.0)
            log.warning("job %s: database unavailable; %d rows buffered, retrying in %.1f s",
                        self.job_id, len(self._pending), self._retry_at - now)
            return False
        except Fenced:
            self._pending.clear()  # a fenced attempt's rows are dropped, never written
            self._fenced()
            raise
        if self._down_since is not None:
            log.warning("job %s: database back after %.1f s; wrote %d buffered rows", self.job_id,
                        time.monotonic() - self._down_since, len(self._pending))
        self._pending.clear()
        self._retry_at, self._pause, self._down_since = 0.0, 0.2, None
        return True

    def _append(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if len(self._pending) >= self.buffer_rows:
            down = time.monotonic() - (self._down_since or time.monotonic())
            raise SinkBufferFull(
                f"the database has been unreachable for {down:.0f} s and {len(self._pending)} "
                f"metric/event rows are waiting (the buffer holds BRORL_SINK_BUFFER_ROWS="
                f"{self.buffer_rows}); stopping this attempt")
        self._pending.append((fn, args, kwargs))
        self.max_buffered = max(self.max_buffered, len(self._pending))
        self._try_flush()

    def flush(self) -> None:
        """Wait until every buffered row is written, retrying for up to `retry_seconds`."""
        deadline = time.monotonic() + self.retry_seconds
        while not self._try_flush():
            now = time.monotonic()
            if now >= deadline:
                raise DatabaseUnavailable(
                    f"the database stayed unreachable for {self.retry_seconds:.0f} s; "
                    f"{len(self._pending)} metric/event rows could not be written")
            time.sleep(max(0.0, min(self._retry_at, deadline) - now))

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One write that needs its answer (the checkpoint record): after the buffer, in its
        own transaction, retried with backoff for up to `retry_seconds` (the trainer waits).
        Past the lease the write answers `Fenced` anyway once the database is back."""
        self.flush()
        deadline, pause = time.monotonic() + self.retry_seconds, 0.2
        try:
            while True:
                try:
                    with session_scope(self.database_url) as s:
                        return fn(s, self.job_id, *args, **kwargs)
                except OperationalError:
                    if time.monotonic() + pause > deadline:
                        raise
                    log.warning("job %s: database unavailable; retrying in %.1f s", self.job_id, pause)
                    time.sleep(pause)
                    pause = min(pause * 2, 5.0)
        except Fenced:
            self._fenced()
            raise

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        self._append(jobs.record_metrics, self.attempt, int(step), _jsonable(values))

    def event(self, type: EventType | str, data: dict[str, Any]) -> None:
        # Raises UnknownEventType before anything is buffered: an event the API cannot list
        # is a trainer bug to fix, not a row to drop.
        self._append(jobs.add_event, event_type(type), _jsonable(data), attempt=self.attempt)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self._append(jobs.record_samples, self.attempt, int(step), [_jsonable(r) for r in rows],
                     self.max_sample_bytes)

    def checkpoint(self, step: int, path: Path, nbytes: int, sha256: str) -> None:
        try:
            ckpt_format.build_archive(Path(path))
            gone = self._write(jobs.record_checkpoint, self.attempt, int(step),
                               self._uri_for(Path(path)), int(nbytes), sha256,
                               keep_last=self.keep_last)
        except BaseException:
            ckpt_format.remove(Path(path))  # fenced, disk full...: never a file without a row
            raise
        for uri in gone:
            ckpt_format.remove(Path(uri))
