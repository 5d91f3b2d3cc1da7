"""Engines and sessions: one cached engine per database URL, and a commit/rollback scope.

SQLite (the embedded default) is shared by the API, a worker process and its heartbeat
thread, so it runs in WAL mode (readers never block the writer) with a long busy timeout
(writers queue instead of failing with "database is locked").
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from store.settings import get_settings

SQLITE_BUSY_TIMEOUT_MS = 30_000

_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_read_engines: dict[str, Engine] = {}  # get_read_engine
_sessionmakers: dict[str, sessionmaker[Session]] = {}


def normalize_url(url: str) -> str:
    """Point bare `postgresql://` / `postgres://` URLs at psycopg 3 (psycopg2 isn't installed)."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg://" + url[len(bare):]
    return url


def _on_sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA foreign_keys = ON")
        # NORMAL is durable across application crashes in WAL mode; only an OS crash can lose
        # the last transactions, which the lease/reaper tolerates.
        cur.execute("PRAGMA synchronous = NORMAL")
    finally:
        cur.close()


def make_engine(url: str, pre_ping: bool = True, **kwargs: Any) -> Engine:
    """A new engine for `url`, configured for its backend (not cached)."""
    url = normalize_url(url)
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        # The state machine's compare-and-set updates use UPDATE ... RETURNING.
        if sqlite3.sqlite_version_info < (3, 35):
            raise RuntimeError(f"SQLite >= 3.35 needed, found {sqlite3.sqlite_version}")
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _on_sqlite_connect)
        return engine
    # Postgres connections can be cut by restarts or idle timeouts between requests.
    return create_engine(url, pool_pre_ping=pre_ping, **kwargs)


def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for `url` (default: the settings' database URL)."""
    url = normalize_url(url or get_settings().database_url)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url)
        return engine


def get_read_engine(url: str | None = None) -> Engine:
    """An autocommit engine with a pool of its own for the API's hottest reads: no
    BEGIN/ROLLBACK and no pre-ping, so a read is one round trip. Without the pre-ping a
    connection the server dropped fails once: callers retry on `connection_invalidated`."""
    url = normalize_url(url or get_settings().database_url)
    with _lock:
        engine = _read_engines.get(url)
        if engine is None:
            engine = _read_engines[url] = make_engine(url, pre_ping=False).execution_options(
                isolation_level="AUTOCOMMIT")
    return engine


def get_sessionmaker(url: str | None = None) -> sessionmaker[Session]:
    """Sessions bound to get_engine(url).

    expire_on_commit=False: the API serialises rows after committing, and the worker keeps
    using what it read; reloading every attribute after each commit would only add queries.
    """
    url = normalize_url(url or get_settings().database_url)
    engine = get_engine(url)
    with _lock:
        maker = _sessionmakers.get(url)
        if maker is None:
            maker = _sessionmakers[url] = sessionmaker(engine, expire_on_commit=False)
        return maker


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session that commits when the block succeeds and rolls back when it raises."""
    session = get_sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def reset_engine_cache() -> None:
    """Dispose of every cached engine (tests switch databases between cases)."""
    with _lock:
        for engine in [*_engines.values(), *_read_engines.values()]:
            engine.dispose()
        _engines.clear()
        _read_engines.clear()
        _sessionmakers.clear()
