"""Alembic environment: the URL comes from the caller's config or SHOCKWAVE_DATABASE_URL.

``alembic upgrade head`` from the project root migrates the database SHOCKWAVE_DATABASE_URL
names; the API's tests call :func:`store.migrate.upgrade` with an explicit URL (and, on Postgres,
a schema of their own, passed as the ``schema`` attribute).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import text
from sqlmodel import SQLModel

import store.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from store.db import make_engine
from store.settings import DatabaseSettings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    return str(url) if url else DatabaseSettings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    schema = config.attributes.get("schema")
    engine = make_engine(_url())
    with engine.connect() as connection:
        if schema:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            connection.execute(text(f'SET search_path TO "{schema}"'))
            connection.commit()
            connection.dialect.default_schema_name = schema
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
