"""The fault suite's servers: a fresh PostgreSQL database, a private Redis, worker processes
(tests/faults/helpers.py). Skipped, with the reason, when PostgreSQL or redis-server is missing.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.helpers import RedisServer, Stack
from tests.support.jobs import fresh_pg_database


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    from store.migrate import upgrade

    with fresh_pg_database("brorl_faults") as url:
        upgrade(url)
        yield url


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stack(pg_url, redis_server, tmp_path, monkeypatch) -> Iterator[Stack]:
    from store.db import reset_engine_cache
    from store.settings import reset_settings_cache
    from worker import celery_app

    st = Stack(tmp_path, pg_url, redis_server)
    for key, value in st.env.items():
        if key.startswith("BRORL_"):
            monkeypatch.setenv(key, value)
    reset_settings_cache()
    reset_engine_cache()
    # The module-level app read its settings lazily; point its broker at our Redis.
    from store.settings import get_settings

    monkeypatch.setattr(celery_app, "app", celery_app.make_app(get_settings()))
    try:
        yield st
    finally:
        st.kill_workers()
        reset_engine_cache()
        reset_settings_cache()
