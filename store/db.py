"""Database engines and sessions. Engines come from a factory, never at import time."""

from __future__ import annotations

import re
from collections.abc import Iterator

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
SQLITE_SYNCHRONOUS = ("full", "normal")
"""SQLite's ``synchronous`` settings a caller may choose (WAL journal either way)."""


def make_engine(url: str, schema: str | None = None, *, sqlite_synchronous: str = "full") -> Engine:
    """An engine for ``url``: Postgres through psycopg 3, or SQLite with foreign keys on.

    ``schema`` (Postgres only) becomes every connection's search_path, so the same tables can
    live in a schema of their own (see :func:`store.migrate.upgrade`).

    ``sqlite_synchronous`` (SQLite only): ``full`` (SQLite's default) syncs the journal to disk
    at every commit, so a committed transaction survives a power loss; ``normal`` syncs at WAL
    checkpoints only: a commit is then a write to the OS, not to the disk (measured on the
    development machine: 3.7 ms against 0.02 ms a commit), and a power loss or an OS crash may
    undo the last transactions, never corrupt the file; a crash of the process loses nothing."""
    if sqlite_synchronous not in SQLITE_SYNCHRONOUS:
        raise ValueError(f"sqlite_synchronous: one of {SQLITE_SYNCHRONOUS}")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.execute(f"PRAGMA synchronous={sqlite_synchronous.upper()}")
            cursor.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    connect_args: dict[str, str] = {}
    if schema is not None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"not a plain schema name: {schema!r}")
        connect_args["options"] = f"-csearch_path={schema}"
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
