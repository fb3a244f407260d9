"""A throwaway Postgres database on a server, for runs of the distributed service that must not
touch anyone else's data: ``shockwave replay --mode distributed``, the benchmarks and the
end-to-end tests (through ``bench/servers.py``). The shared servers' URLs come from
SHOCKWAVE_TEST_POSTGRES_URL and SHOCKWAVE_TEST_REDIS_URL (``scripts/services.sh`` starts them)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

POSTGRES_URL = os.environ.get(
    "SHOCKWAVE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("SHOCKWAVE_TEST_REDIS_URL", "redis://127.0.0.1:6379")


class ServerUnavailable(RuntimeError):
    """A server the run needs cannot be reached or started; the message says how to get one."""


@contextmanager
def throwaway_database(prefix: str = "e2e", server_url: str | None = None) -> Iterator[str]:
    """A fresh Postgres database on the test server (``server_url``, default
    SHOCKWAVE_TEST_POSTGRES_URL; dropped on exit); yields its URL.

    A database of its own, not a schema, so the round driver's advisory lock (per database) and
    everything else is isolated from any other test run on the same server."""
    server_url = server_url or POSTGRES_URL
    server = create_engine(
        server_url,
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,
        connect_args={"connect_timeout": 5},
    )
    name = f"{prefix}_{secrets.token_hex(4)}"
    try:
        with server.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as error:
        server.dispose()
        raise ServerUnavailable(
            f"PostgreSQL is not reachable at {server_url} ({error.orig}). Runs of the whole "
            "service need it: run scripts/services.sh (CI does), or point "
            "SHOCKWAVE_TEST_POSTGRES_URL at a server."
        ) from None
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with server.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()
