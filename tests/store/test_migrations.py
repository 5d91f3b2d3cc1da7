"""Migrations: every revision goes up, down and up again, and the result matches the models."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from store import migrate
from store.db import make_engine
from store.tables import Base

def all_revisions() -> list[str]:
    """Every revision id, oldest first."""
    script = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def downgrade(url: str, rev: str) -> None:
    """Take the database at `url` down to `rev` ("base" removes every table)."""
    command.downgrade(migrate.alembic_config(url), rev)


TABLES = {"tenants", "api_keys", "jobs", "job_events", "job_samples", "metrics", "checkpoints", "datasets",
          "webhook_endpoints", "webhook_deliveries", "completion_usage"}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_every_revision(db_url: str) -> None:
    revisions = all_revisions()
    assert revisions and revisions[-1] == migrate.head()
    # Up one revision at a time, checking each can be undone and redone on the spot.
    previous = "base"
    for rev in revisions:
        migrate.upgrade(db_url, rev)
        assert migrate.current(db_url) == rev
        downgrade(db_url, previous)
        assert migrate.current(db_url) == (None if previous == "base" else previous)
        migrate.upgrade(db_url, rev)
        previous = rev
    assert _tables(db_url) == TABLES
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    assert _tables(db_url) == TABLES


def test_models_match_migrations(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_upgrade_defaults_to_settings_url() -> None:
    # No URL: the settings' SQLite file in the (temporary) data dir is created and migrated.
    migrate.upgrade()
    assert migrate.current() == migrate.head()


def test_model_check_is_not_vacuous(db_url: str) -> None:
    """The comparison above would notice a column the migrations lack."""
    from sqlalchemy import Column, Integer, MetaData

    migrate.upgrade(db_url)
    changed = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["jobs"].append_column(Column("priority", Integer, nullable=True))
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), changed)
    finally:
        engine.dispose()
    assert [d[0] for d in diffs] == ["add_column"]
