"""API keys, datasets, artifact files, settings and engines."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from store import artifacts, datasets, keys
from store.db import get_engine, get_sessionmaker, make_engine, normalize_url, session_scope
from store.tables import ApiKey, Tenant
from store.settings import Settings, get_settings, reset_settings_cache
from trainer.checkpoints import format as ckpt_format


def test_keys_store_only_hash_and_prefix(session: Session) -> None:
    key = keys.create_key(session, "acme")
    session.commit()
    assert key.startswith("brorl_") and len(key) > 40
    row = session.scalars(select(ApiKey)).one()
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert row.prefix == key[:12]
    stored = [str(v) for v in session.execute(select(ApiKey.__table__)).one()]
    assert key not in stored
    tenant = keys.authenticate(session, key)
    assert tenant is not None and tenant.name == "acme"
    assert keys.authenticate(session, key + "x") is None
    assert keys.authenticate(session, "") is None
    assert keys.create_tenant(session, "acme").id == tenant.id  # get-or-create
    key_id = session.scalar(select(ApiKey.id).where(ApiKey.key_hash == keys.hash_key(key)))
    assert keys.revoke_key(session, key_id) and not keys.revoke_key(session, key_id)
    session.commit()
    assert keys.authenticate(session, key) is None


def test_datasets_are_tenant_scoped(session: Session, tenant: Tenant) -> None:
    other = keys.create_tenant(session, "other")
    ds_id = datasets.new_dataset_id()
    assert ds_id.startswith("ds_")
    ds = datasets.create_dataset(session, tenant.id, "qa", "f" * 64, 3, 99, "/d.jsonl",
                                 dataset_id=ds_id)
    newer = datasets.create_dataset(session, tenant.id, "qa2", "e" * 64, 1, 9, "/e.jsonl")
    session.commit()
    assert ds.id == ds_id and ds.created_at.tzinfo is not None
    assert datasets.get_dataset(session, tenant.id, ds_id).rows == 3
    assert datasets.get_dataset(session, other.id, ds_id) is None
    assert [d.id for d in datasets.list_datasets(session, tenant.id)] == [newer.id, ds_id]
    assert datasets.list_datasets(session, other.id) == []


def test_artifact_paths(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    path = artifacts.dataset_path(settings, "ds_1")
    assert path == tmp_path / "artifacts" / "datasets" / "ds_1.jsonl"
    assert artifacts.job_dir(settings, "job_1") == tmp_path / "artifacts" / "jobs" / "job_1"


def test_checkpoint_paths_are_per_attempt_and_use_the_trainer_format(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    folder = artifacts.checkpoint_dir(settings, "job_1", 2, 12)
    assert folder == settings.artifact_dir / "jobs" / "job_1" / "attempt-2" / "checkpoints" / "step-00000012"
    assert ckpt_format.step_of(folder) == 12


def test_settings_derive_from_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRORL_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("BRORL_LEASE_SECONDS", "7")
    reset_settings_cache()
    s = get_settings()
    assert s.data_dir.is_dir() and s.artifact_dir.is_dir()
    assert s.database_url == f"sqlite:///{tmp_path / 'd' / 'brorl.db'}"
    assert s.broker_url == f"sqla+sqlite:///{tmp_path / 'd' / 'broker.db'}"
    assert s.artifact_dir == tmp_path / "d" / "artifacts" and s.lease_seconds == 7
    assert s.broker_visibility_timeout > s.lease_seconds and s.trainer_entrypoint == "trainer:train"
    assert get_settings() is s
    monkeypatch.setenv("BRORL_ARTIFACT_DIR", str(tmp_path / "art"))
    reset_settings_cache()
    assert get_settings().artifact_dir == tmp_path / "art"
    assert Settings(data_dir="~/x").data_dir == Path.home() / "x"


def test_sqlite_engine_pragmas_and_session_scope(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    engine.dispose()
    assert normalize_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    # Cached per settings URL; session_scope commits on success and rolls back on error.
    assert get_engine() is get_engine() and get_sessionmaker() is get_sessionmaker()
    with session_scope() as s:
        s.execute(text("CREATE TABLE t (x INTEGER)"))
        s.execute(text("INSERT INTO t VALUES (1)"))
    with pytest.raises(RuntimeError), session_scope() as s:
        s.execute(text("INSERT INTO t VALUES (2)"))
        raise RuntimeError
    with session_scope() as s:
        assert s.execute(text("SELECT x FROM t")).scalars().all() == [1]
