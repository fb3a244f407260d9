"""Fixtures for the integration tier: the API on a real PostgreSQL and on SQLite.

Each test session migrates one Postgres schema of its own (``it_<random>``, dropped at the end)
and one temporary SQLite file, both through the Alembic migrations. Tests that take ``database``
(or ``app``, ``client``, ``tokens``) run once on each. Tables are emptied before every test.

PostgreSQL must answer at ``SHOCKWAVE_TEST_POSTGRES_URL`` (default: the local server that
``scripts/services.sh`` starts); if it does not, the tests fail, they are never skipped.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, Table, create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from api.app import create_app
from api.settings import Settings
from solver_service import enqueue
from store import migrate
from store.cluster import approve_node
from store.db import make_engine
from store.principals import Role
from store.tokens import create_token

POSTGRES_URL = os.environ.get(
    "SHOCKWAVE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("SHOCKWAVE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SHOCKWAVE = Path(sys.executable).with_name("shockwave")
"""The venv's ``shockwave`` command, for the tests that start service processes."""
TENANT_A = "tenant-a"
TENANT_B = "tenant-b"
NODE = "node-1"


def unique_name(prefix: str) -> str:
    """A name no other test session uses: ``<prefix>_<8 hex digits>``."""
    return f"{prefix}_{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Database:
    """A migrated database the API can run on. ``url`` and ``schema`` are what the API's
    settings get; ``engine`` (on that schema) is shared by every app built on it."""

    kind: str
    url: str
    engine: Engine
    schema: str | None = None

    @cached_property
    def tables(self) -> list[Table]:
        """The migrated tables but ``alembic_version``, parents before children."""
        metadata = MetaData()
        metadata.reflect(self.engine)
        return [t for t in metadata.sorted_tables if t.name != "alembic_version"]

    def empty(self) -> None:
        """Delete every row of every table, children first."""
        with self.engine.begin() as connection:
            for table in reversed(self.tables):
                connection.execute(table.delete())


class RecordedPlanRequests:
    """A plan requester that records ``(cluster_id, state_version)`` instead of sending it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int]] = []

    def request(self, cluster_id: str, state_version: int) -> None:
        self.requests.append((cluster_id, state_version))

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def plan_requests() -> Iterator[RecordedPlanRequests]:
    """The plan requests the API makes in a test, recorded rather than sent to a broker (tests
    of the solver service install a real requester with ``enqueue.install``)."""
    recorder = RecordedPlanRequests()
    previous = enqueue.install(recorder)
    try:
        yield recorder
    finally:
        enqueue.install(previous)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Engine]:
    """An autocommit engine on the Postgres server (for CREATE/DROP SCHEMA and DATABASE)."""
    engine = create_engine(
        POSTGRES_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
    )
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as error:
        engine.dispose()
        pytest.fail(
            f"PostgreSQL is not reachable at {POSTGRES_URL} ({error.orig}). The integration "
            "tests need it: run scripts/services.sh (CI does), or point "
            "SHOCKWAVE_TEST_POSTGRES_URL at a server.",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@contextmanager
def postgres_schema(server: Engine, prefix: str = "it") -> Iterator[str]:
    """The name of a schema that is dropped (with everything in it) on exit."""
    schema = unique_name(prefix)
    try:
        yield schema
    finally:
        with server.connect() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@contextmanager
def migrated_postgres(server: Engine, prefix: str = "it") -> Iterator[Database]:
    """A migrated Postgres schema of the caller's own and its engine, dropped on exit."""
    with postgres_schema(server, prefix) as schema:
        migrate.upgrade(POSTGRES_URL, schema=schema)
        engine = make_engine(POSTGRES_URL, schema)
        try:
            yield Database("postgres", POSTGRES_URL, engine, schema)
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def redis_broker() -> Iterator[redis.Redis]:
    """A client of the real Redis at ``REDIS_URL``; the tests fail (never skip) without it."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({error}). Run scripts/services.sh, or "
            "point SHOCKWAVE_TEST_REDIS_URL at a server.",
            pytrace=False,
        )
    yield client
    client.close()


@pytest.fixture(scope="session", params=["postgres", "sqlite"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    if request.param == "postgres":
        server: Engine = request.getfixturevalue("postgres_server")
        with migrated_postgres(server) as database:
            yield database
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'shockwave.db'}"
        migrate.upgrade(url)
        engine = make_engine(url)
        yield Database("sqlite", url, engine)
        engine.dispose()


def build_app(database: Database, *, open_mode: bool = False) -> FastAPI:
    settings = Settings(
        database_url=database.url, database_schema=database.schema, open_mode=open_mode
    )
    return create_app(settings, engine=database.engine, request_plan=enqueue.request_plan)


@pytest.fixture
def app(database: Database) -> FastAPI:
    """The API on ``database``, emptied, requiring tokens."""
    database.empty()
    return build_app(database)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """A client that reports server errors as responses (tests assert there are none)."""
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens of each role: an admin, a user of tenant A, a user of tenant B, the agent
    of node ``NODE``; :meth:`job` makes a job-scoped token."""

    engine: Engine
    admin: str
    user_a: str
    user_b: str
    agent: str

    def job(self, job_id: str) -> str:
        with Session(self.engine) as session:
            return create_token(session, Role.JOB, job_id=job_id, name=f"job {job_id}")


@pytest.fixture
def tokens(app: FastAPI, database: Database) -> Tokens:
    with Session(database.engine) as session:
        return Tokens(
            engine=database.engine,
            admin=create_token(session, Role.ADMIN, name="admin"),
            user_a=create_token(session, Role.USER, tenant=TENANT_A, name="alice"),
            user_b=create_token(session, Role.USER, tenant=TENANT_B, name="bob"),
            agent=_approved_agent(session),
        )


def _approved_agent(session: Session) -> str:
    """The agent token of :data:`NODE`, its node approved as the tests' operator approves
    every node (64 GPUs, any type)."""
    token = create_token(session, Role.AGENT, node=NODE, name="agent")
    approve_node(session, NODE, 64)
    session.commit()
    return token
