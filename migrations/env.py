"""Alembic environment: the URL comes from the caller or the settings, the schema from the models.

Precedence for the URL: `config.attributes["url"]` (store.migrate), then `sqlalchemy.url`
from the ini or `-x url=...` on the CLI, then `BRORL_DATABASE_URL` / the settings' default.
A live connection in `config.attributes["connection"]` is used as is (tests, embedding).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from store.db import make_engine, normalize_url
from store.tables import Base
from store.settings import get_settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def _url() -> str:
    url = (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or get_settings().database_url
    )
    return normalize_url(url)


def _configure(**kwargs: object) -> None:
    url_or_conn = kwargs.get("connection") or kwargs.get("url")
    dialect = (
        url_or_conn.dialect.name if isinstance(url_or_conn, Connection)
        else str(url_or_conn).split(":", 1)[0].split("+", 1)[0]
    )
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode recreates the table instead.
        render_as_batch=dialect == "sqlite",
        compare_type=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    """`alembic upgrade --sql`: emit SQL for the URL's dialect without connecting."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
