"""Run the Alembic migrations from code: `brorl up`, the compose `migrate` service, tests.

The Alembic Config is built here rather than read from alembic.ini, with script_location
pointing at the `migrations/` folder next to this package, so it works from any working
directory and from an installed checkout. (alembic.ini at the repo root serves the `alembic`
CLI and points at the same folder.)
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from store.db import make_engine, normalize_url
from store.settings import get_settings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config for `url` (default: the settings' database URL).

    The URL travels in `config.attributes` (read by migrations/env.py), not in the ini
    options, where ConfigParser would choke on a `%` in a password.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["url"] = normalize_url(url or get_settings().database_url)
    return config


def upgrade(url: str | None = None, rev: str = "head") -> None:
    """Bring the database at `url` up to `rev` (default: the newest revision)."""
    command.upgrade(alembic_config(url), rev)


def head() -> str:
    """The newest revision id."""
    head_rev = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head_rev is not None
    return head_rev


def current(url: str | None = None, engine: Engine | None = None) -> str | None:
    """The revision the database is at (None: not migrated yet). /readyz can compare it to
    head() to refuse traffic against a stale schema."""
    own = engine is None
    engine = engine or make_engine(normalize_url(url or get_settings().database_url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        if own:
            engine.dispose()
