"""Fixtures for the API tests: one app per test on a fresh database, SQLite and PostgreSQL.

Every test that takes `client` runs twice: on a SQLite file in its tmp dir, and (marker
`postgres`) on a brand-new PostgreSQL database created on 127.0.0.1:5432 and dropped
afterwards. Migrations run once per backend per session with `store.migrate.upgrade(url)`
into a template (a SQLite file that is copied; a Postgres database used as `TEMPLATE`), which
makes a fresh, migrated database per test cost milliseconds instead of a migration run.
When no PostgreSQL server answers, the postgres variants are skipped with that reason (in CI
they fail: tests/support/services.py).

Enqueueing is replaced by a recorder (`enqueued`): these are API tests; the real Celery
round trip is tested in tests/worker and tests/e2e.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from api.app import create_app
from store import keys
from store.db import reset_engine_cache, session_scope
from store.migrate import upgrade
from store.settings import Settings
from tests.api.helpers import UPLOAD_LIMIT
from tests.support.services import require_service

PG_ADMIN_URL = os.environ.get(
    "BRORL_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


# --------------------------------------------------------------------------- databases


def _pg_admin():
    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


def _pg_url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade(f"sqlite:///{path}")
    reset_engine_cache()  # release the file before it is copied
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    admin = _pg_admin()
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # no server: the postgres variants are skipped (failed in CI)
        admin.dispose()
        require_service("PostgreSQL", f"not reachable at {PG_ADMIN_URL}: {type(exc).__name__}")
    name = f"brorl_api_tpl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        upgrade(_pg_url(name))
        reset_engine_cache()  # a TEMPLATE database must have no open connections
        yield name
    finally:
        reset_engine_cache()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated, empty database for one test."""
    if request.param == "sqlite":
        path = tmp_path / "brorl.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        reset_engine_cache()
        return
    template = request.getfixturevalue("pg_template")
    name = f"brorl_api_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield _pg_url(name)
    finally:
        reset_engine_cache()  # close the app's pooled connections first
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# --------------------------------------------------------------------------- app


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    data_dir = tmp_path / "data"
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url=f"sqla+sqlite:///{data_dir / 'broker.db'}",
        max_upload_bytes=UPLOAD_LIMIT,
        webhook_dispatch=False,  # tests/api/test_webhooks.py sends deliveries itself
    )


class Enqueued(list):
    """A stand-in enqueue: the job ids sent, in order (it compares as that list), and the queue
    each went to in `queues`."""

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[str, str] = {}

    def __call__(self, job_id: str, gpus: int = 1, nodes: int = 1) -> None:
        from worker.celery_app import queue_for

        self.append(job_id)
        self.queues[job_id] = queue_for(gpus, nodes)


@pytest.fixture
def enqueued() -> Enqueued:
    """Job ids the app sent to the workers, in order (`.queues`: where each went)."""
    return Enqueued()


@pytest.fixture
def app(settings: Settings, enqueued: Enqueued):
    return create_app(settings, enqueue=enqueued, stream_poll_seconds=0.05)


@pytest.fixture
def client(app) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def _new_key(url: str, tenant: str) -> str:
    with session_scope(url) as s:
        return keys.create_key(s, tenant)


@pytest.fixture
def key(database_url: str) -> str:
    return _new_key(database_url, "acme")


@pytest.fixture
def other_key(database_url: str) -> str:
    return _new_key(database_url, "globex")


@pytest.fixture
def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def other_auth(other_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {other_key}"}
