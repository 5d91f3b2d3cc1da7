"""`DbSink`: the trainer's metrics sink that writes into the database.

Each call opens its own short session and commits, so a long training run never holds a
transaction (or an SQLite write lock) open between steps. Every write carries the attempt
that claimed the job; once a newer attempt owns the job the store raises `Fenced`, the sink
reports it through `on_fenced` and re-raises, and the exception unwinds the training loop:
a worker that lost its lease must stop, not keep writing over its successor.

A checkpoint is recorded in three moves: build its download archive (once, here, so the API
serves a ready file), record the row (fenced; rows past `keep_last` are deleted in the same
transaction), then delete the folders no longer recorded. A fenced record deletes the folder
it was about to register: no file of a stale attempt survives it.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from sqlalchemy.exc import OperationalError

from store import jobs
from store.db import session_scope
from store.errors import Fenced
from store.models import EventType
from trainer import ckpt_format

log = logging.getLogger(__name__)
_EVENT_TYPES = frozenset(t.value for t in EventType)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Metric values as plain JSON numbers (trainers hand over numpy / torch scalars)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if hasattr(value, "item"):
            value = value.item()
        out[str(key)] = value
    return out


class DbSink:
    """Implements `trainer.sink.MetricsSink` with fenced writes for one (job, attempt)."""

    def __init__(self, job_id: str, attempt: int,
                 on_fenced: Callable[[], None] | None = None,
                 uri_for: Callable[[Path], str] | None = None,
                 keep_last: int | None = None, retry_seconds: float = 0.0) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.keep_last = keep_last
        self.retry_seconds = retry_seconds
        self._on_fenced = on_fenced or (lambda: None)
        self._uri_for = uri_for or (lambda path: str(Path(path).resolve()))

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One write in its own transaction; a lost database connection is retried with
        backoff for up to `retry_seconds` (the trainer waits: no metric is dropped). Every
        write is an upsert or a fenced append, so a retry cannot fork the job's history;
        past the lease the write answers `Fenced` anyway once the database is back."""
        deadline, pause = time.monotonic() + self.retry_seconds, 0.2
        try:
            while True:
                try:
                    with session_scope() as s:
                        return fn(s, self.job_id, *args, **kwargs)
                except OperationalError:
                    if time.monotonic() + pause > deadline:
                        raise
                    log.warning("job %s: database unavailable; retrying in %.1f s", self.job_id, pause)
                    time.sleep(pause)
                    pause = min(pause * 2, 5.0)
        except Fenced:
            log.warning("job %s attempt %s was fenced off; stopping", self.job_id, self.attempt)
            self._on_fenced()
            raise

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        self._write(jobs.record_metrics, self.attempt, int(step), _jsonable(values))

    def event(self, type: str, data: dict[str, Any]) -> None:
        if type not in _EVENT_TYPES:
            # The events table holds a closed set of types (the API documents them); a
            # trainer-only event is logged here rather than failing the whole run.
            log.info("job %s: event %s %s (not stored: unknown type)", self.job_id, type, data)
            return
        self._write(jobs.add_event, type, _jsonable(data), attempt=self.attempt)

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
            ckpt_format.remove(Path(uri.removeprefix("file://")))
