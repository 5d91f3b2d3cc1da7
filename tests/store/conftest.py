"""Fixtures for the store tests, each run on SQLite and on PostgreSQL.

Postgres cases use uniquely named databases on 127.0.0.1:5432 (trust auth), created here and
dropped afterwards, so they never see other suites' data in `test`. They are marked
`postgres` and skipped, with the reason shown, when the server is down.

`db_url` is a fresh, empty database per test (migration tests). `engine` is one migrated
database per backend for the whole session, emptied before each test: creating a Postgres
database costs ~0.3 s, emptying seven tables almost nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store.db import make_engine, reset_engine_cache
from store.keys import create_tenant
from store.migrate import upgrade
from store.tables import Base, Tenant
from store.settings import reset_settings_cache
from tests.support.services import require_service

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point the settings at a temporary data dir so nothing touches ~/.brorl."""
    monkeypatch.setenv("BRORL_DATA_DIR", str(tmp_path / "data"))
    for name in ("BRORL_DATABASE_URL", "BRORL_BROKER_URL", "BRORL_ARTIFACT_DIR"):
        monkeypatch.delenv(name, raising=False)
    reset_settings_cache()
    reset_engine_cache()
    yield
    reset_engine_cache()
    reset_settings_cache()


def _admin() -> psycopg.Connection:
    return psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def _postgres_up() -> None:
    try:
        _admin().close()
    except psycopg.OperationalError as exc:
        require_service("PostgreSQL", f"not reachable on 127.0.0.1:5432: {exc}")


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextmanager
def _new_database(request: pytest.FixtureRequest, backend: str, folder: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{folder / f'store-{uuid.uuid4().hex[:8]}.db'}"
        return
    request.getfixturevalue("_postgres_up")
    name = f"brorl_store_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        reset_engine_cache()
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty, unmigrated database of its own."""
    with _new_database(request, request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="session", params=BACKENDS)
def _migrated_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    folder = tmp_path_factory.mktemp("store-db")
    with _new_database(request, request.param, folder) as url:
        upgrade(url)
        engine = make_engine(url)
        yield engine
        engine.dispose()


@pytest.fixture
def engine(_migrated_engine: Engine) -> Engine:
    """An engine on a migrated database with every table empty."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with _migrated_engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        else:
            for table in tables:
                conn.exec_driver_sql(f"DELETE FROM {table}")
    return _migrated_engine


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def tenant(session: Session) -> Tenant:
    tenant = create_tenant(session, "acme")
    session.commit()
    return tenant
