"""Jobs for the trainer double, on an isolated data dir or a throwaway PostgreSQL database.

`data_dir` gives a test its own `BRORL_DATA_DIR` (so its own SQLite database and artifact
dir), the trainer double (tests/support/fake_trainer.py) as the entrypoint, and a fast
heartbeat so cancel and fencing show up quickly; `tenant_id` and `new_job` build on it. The
rooms that use these fixtures import them in their conftest (tests/worker, tests/cli).
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import jobs, keys
from store.db import reset_engine_cache, session_scope
from store.migrate import upgrade
from store.tables import Tenant
from store.settings import get_settings, reset_settings_cache
from tests.support.services import require_service

FAKE_ENTRYPOINT = "tests.support.fake_trainer:train"
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"

BASE_SPEC: dict[str, Any] = {
    "spec_version": 1,
    "name": "fake",
    "task": {"reasoning_gym": {"name": "chain_sum", "train_size": 10, "eval_size": 2}},
    "rollout": {"engine": "hf", "schedule": [{"n": 2, "prompts_per_step": 2, "steps": 3}],
                "max_new_tokens": 24},
    "eval": {"every": 0, "samples_per_prompt": 2, "k": [1, 2]},
    "checkpoint": {"every": 0, "keep_last": 1},
    "algo": {"mini_batches": 1},
}


def make_spec(name: str = "fake", max_attempts: int = 3,
              max_wall_seconds: int = 3600, gpus: int = 1, nodes: int = 1) -> dict[str, Any]:
    """A small valid spec; the trainer double reads its options from `name`."""
    spec = copy.deepcopy(BASE_SPEC)
    spec["name"] = name
    spec["limits"] = {"max_attempts": max_attempts, "max_wall_seconds": max_wall_seconds}
    spec["resources"] = {"gpus_per_node": gpus, "nodes": nodes}
    return spec


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh data dir with a migrated SQLite database; settings point at it."""
    root = tmp_path / "data"
    monkeypatch.setenv("BRORL_DATA_DIR", str(root))
    for name in ("BRORL_DATABASE_URL", "BRORL_BROKER_URL", "BRORL_ARTIFACT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BRORL_TRAINER_ENTRYPOINT", FAKE_ENTRYPOINT)
    monkeypatch.setenv("BRORL_HEARTBEAT_SECONDS", "0.1")
    monkeypatch.setenv("BRORL_LEASE_SECONDS", "30")
    monkeypatch.setenv("BRORL_WORKER_ID", "test-worker")
    reset_settings_cache()
    reset_engine_cache()
    upgrade(get_settings().database_url)
    yield root
    reset_engine_cache()
    reset_settings_cache()


@pytest.fixture
def tenant_id(data_dir: Path) -> int:
    with session_scope() as s:
        tenant: Tenant = keys.create_tenant(s, "acme")
        return tenant.id


@pytest.fixture
def new_job(tenant_id: int):
    """new_job(name=..., max_attempts=..., max_wall_seconds=..., gpus=..., nodes=...) -> a queued job's id."""

    def make(name: str = "fake", **kwargs: Any) -> str:
        spec = make_spec(name, **kwargs)
        with session_scope() as s:
            job, _ = jobs.create_job(s, tenant_id, spec, total_steps=3, name=name)
            return job.id

    return make


@contextlib.contextmanager
def fresh_pg_database(prefix: str) -> Iterator[str]:
    """A brand-new PostgreSQL database (its SQLAlchemy URL), dropped afterwards; skips the
    test (fails it in CI) when no server answers on 127.0.0.1:5432."""
    import uuid

    import psycopg

    try:
        admin = psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        require_service("PostgreSQL", f"not reachable on 127.0.0.1:5432: {exc}")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        reset_engine_cache()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
