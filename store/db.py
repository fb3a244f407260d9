"""Database engines and sessions. Engines come from a factory, never at import time."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import String, any_, event, literal
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, create_engine

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def make_engine(url: str, schema: str | None = None) -> Engine:
    """An engine for ``url``: Postgres through psycopg 3, or SQLite with foreign keys on.

    ``schema`` (Postgres only) becomes every connection's search_path, so the same tables can
    live in a schema of their own (see :func:`store.migrate.upgrade`)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    # Every statement is planned at each execution for the tables as they are then
    # (plan_cache_mode=force_custom_plan): psycopg prepares a statement at its fifth execution on
    # a connection, and Postgres would keep the generic plan it chose then, until the tables'
    # statistics change. A node's view, polled by every agent from its start, is prepared while
    # no lease exists yet; kept, its plan read every lease the cluster ever issued at each poll
    # (a sequential scan) where the index reads the node's few, and the token lookups read every
    # token ever minted. Statistics would mend it only where autovacuum runs; this does not
    # depend on them, and planning costs a fraction of a millisecond (the parse is still saved).
    options = ["-cplan_cache_mode=force_custom_plan"]
    if schema is not None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"not a plain schema name: {schema!r}")
        options.append(f"-csearch_path={schema}")
    connect_args = {"options": " ".join(options)}
    # Ten connections and no overflow: the API admits as many requests at once as its pool
    # holds (api.admission), and on a busy machine more requests in progress at once only
    # contend for the GIL and churn overflow connections (each one a new Postgres backend):
    # docs/reliability.md, "Load", measured a boundary burst's worst latency at 620 ms with
    # 10 + 20 overflow and 190 ms with 10 + 0.
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=0, connect_args=connect_args
    )


def sessions(engine: Engine) -> Iterator[Session]:
    with Session(engine) as session:
        yield session


def among(column: Any, ids: Sequence[str], session: Session) -> ColumnElement[bool]:
    """``column`` is one of ``ids``. On Postgres one array parameter (``column = ANY(...)``):
    a statement of thousands of ids is then as cheap to send and to plan as one of a few (an
    ``IN`` list binds, renders and parses a parameter per id: at 10,000 ids that took a
    snapshot hundreds of milliseconds). Elsewhere an ``IN`` list."""
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(literal(list(ids), ARRAY(String)))  # type: ignore[no-any-return]
    return column.in_(list(ids))  # type: ignore[no-any-return]


def one_statement(session: Session) -> bool:
    """Whether a statement may name any number of ids (:func:`among`: Postgres)."""
    return session.get_bind().dialect.name == "postgresql"
