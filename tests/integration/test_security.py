"""Security checks (docs/reliability.md, "Security"), on Postgres and SQLite.

- The role x operation matrix, generated from ``app.openapi()``: every operation declares, per
  role, what that role may do (``x-access``, see :class:`api.auth.Access`); the test calls every
  operation as every caller (an admin, a user of each of two tenants, the agent of each of two
  nodes, the token of each of two jobs, no token), against its own scope and the other one, and
  checks the answer's class (allowed, 401, 403, 404), that a refused call wrote nothing, and that
  an allowed answer shows nothing of the other scope. An operation without a declaration fails.
- Per-token (per-address without a token) rate limits: 429 problem with Retry-After.
- Body limits, also for a chunked body (no Content-Length) and a lying Content-Length; a body
  that does not arrive in time gets 408 and holds no admission slot meanwhile.
- No token and no database password in the logs of the real API at DEBUG
  (``test_secrets_never_reach_the_logs``, Postgres).

One command runs it all: ``.venv/bin/python -m pytest tests/integration/test_security.py -q -s``
(``-s`` shows the matrix's figures).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.engine import Engine, make_url
from sqlmodel import Session

from api.app import create_app
from api.auth import Access
from api.ratelimit import RateLimiter
from api.settings import Settings
from shockwave_cli.runtime.supervision import Supervised, free_port, wait_http
from store.cluster import approve_node
from store.db import make_engine
from store.principals import Role
from store.tokens import create_token, issue_token
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import (
    POSTGRES_URL,
    TENANT_A,
    TENANT_B,
    Database,
    Tokens,
    postgres_schema,
)
from tests.integration.driving import driver_on, leases, now, register, submit
from tests.integration.live_server import serving
from tests.integration.openapi_requests import Operation, body_properties, call, operations

ROLES = ("anonymous", "admin", "user", "agent", "job")
OUTCOMES: dict[str, tuple[str, str]] = {
    Access.ANY: ("allowed", "allowed"),
    Access.OWN: ("allowed", "404"),
    Access.SEE_ONLY: ("403", "404"),
    Access.HIDDEN: ("404", "404"),
    Access.DENIED: ("403", "403"),
    Access.TOKEN: ("401", "401"),
}
"""What each declared rule means: (answer in the caller's own scope, answer in another's)."""
SCOPE_PARAMETERS = {"job_id", "event_id", "attempt_id", "tenant_path", "node"}
"""The path parameters the matrix fills from a scope; another one fails the test (teach it)."""
UNSCOPED_PARAMETERS = {"token_id"}
"""Path parameters of what no tenant, node or job owns (admins' resources): filled from the
world, the same for every caller."""
NODES = ("node-1", "node-2")


@dataclass(frozen=True)
class Scope:
    """One side of the matrix: a tenant's job, its first event, the node and the attempt that
    run it."""

    tenant: str
    job: str
    job_name: str
    event: int
    node: str
    attempt: str

    def values(self) -> dict[str, Any]:
        return {
            "job_id": self.job,
            "event_id": self.event,
            "attempt_id": self.attempt,
            "node": self.node,
            "tenant_path": self.tenant,
        }

    def markers(self, role: str) -> set[str]:
        """What a caller of the other scope, in ``role``, must never be shown."""
        found = {self.job, self.attempt}
        if role in ("user", "job"):
            found |= {self.tenant, self.job_name}
        return found


@dataclass(frozen=True)
class Caller:
    label: str
    role: str
    scope: int | None
    token: str | None


@dataclass(frozen=True)
class World:
    scopes: tuple[Scope, Scope]
    callers: tuple[Caller, ...]
    unscoped: dict[str, Any] = field(default_factory=dict)


def build_world(client: TestClient, database: Database) -> World:
    """An emptied database with two nodes, each running one job of its own tenant (through a
    real round), and a caller of every kind."""
    database.empty()
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN, name="admin")
        users = [create_token(session, Role.USER, tenant=t) for t in (TENANT_A, TENANT_B)]
    for node in NODES:
        register(client, admin, gpus=1, node=node)
    names = [f"job-of-{tenant}" for tenant in (TENANT_A, TENANT_B)]
    jobs = [submit(client, users[i], name=names[i]) for i in range(2)]
    with driver_on(database) as (driver, _):
        driver.step(now())
    lease_of = {lease.job_id: lease for lease in leases(database)}
    assert sorted(lease_of) == sorted(jobs), "the round must lease both jobs"
    assert {lease.node_id for lease in lease_of.values()} == set(NODES), "one job per node"
    scopes = tuple(
        Scope(
            tenant=tenant,
            job=job,
            job_name=name,
            event=_first_event(database, job),
            node=lease_of[job].node_id,
            attempt=lease_of[job].id,
        )
        for tenant, job, name in zip((TENANT_A, TENANT_B), jobs, names, strict=True)
    )
    callers = [Caller("admin", "admin", None, admin), Caller("no token", "anonymous", None, None)]
    with Session(database.engine) as session:
        _, spare = issue_token(session, Role.USER, tenant=TENANT_A, name="spare")
        session.commit()
        unscoped = {"token_id": spare.id}
        for index, scope in enumerate(scopes):
            agent = create_token(session, Role.AGENT, node=scope.node)
            job = create_token(session, Role.JOB, job_id=scope.job)
            callers += [
                Caller(f"user of {scope.tenant}", "user", index, users[index]),
                Caller(f"agent of {scope.node}", "agent", index, agent),
                Caller(f"token of job {index}", "job", index, job),
            ]
    return World(scopes=(scopes[0], scopes[1]), callers=tuple(callers), unscoped=unscoped)


def _first_event(database: Database, job_id: str) -> int:
    with database.engine.connect() as connection:
        found = connection.execute(
            text("SELECT min(id) FROM job_events WHERE job_id = :job"), {"job": job_id}
        ).scalar_one()
    assert found is not None
    return int(found)


def count(database: Database, query: str, **parameters: Any) -> int:
    with database.engine.connect() as connection:
        return int(connection.execute(text(query), parameters).scalar_one())


BOOKKEEPING = {("tokens", "last_used_at")}
"""Columns that authentication itself writes, whatever the request then gets (a refused
request still used its token)."""


def fingerprint(database: Database) -> str:
    """A digest of every row of every table (but :data:`BOOKKEEPING`): equal digests, nothing
    written."""
    digest = hashlib.sha256()
    with database.engine.connect() as connection:
        for table in database.tables:
            columns = [c for c in table.columns if (table.name, c.name) not in BOOKKEEPING]
            query = select(*columns)
            rows = sorted(repr(tuple(row)) for row in connection.execute(query))
            digest.update(f"{table.name}:{rows}".encode())
    return digest.hexdigest()


def outcome(response: httpx.Response) -> str:
    """The answer's class: ``allowed`` (2xx, or a 409: the state forbids it, the caller may),
    ``401``/``403``/``404``, or the unexpected status."""
    if 200 <= response.status_code < 300 or response.status_code == 409:
        return "allowed"
    return str(response.status_code)


def rules_of(operation: Operation) -> dict[str, str]:
    declared = operation.spec.get("x-access")
    assert isinstance(declared, dict), (
        f"{operation.label} declares no x-access: add openapi_extra=access(...) (api.auth) to it"
    )
    assert set(declared) == set(ROLES), f"{operation.label}: x-access must name {ROLES}"
    unknown = {rule for rule in declared.values() if rule not in OUTCOMES}
    assert not unknown, f"{operation.label}: unknown rules {unknown}"
    return declared


def scoped(app: FastAPI, operation: Operation) -> bool:
    """Whether the operation names a scope (a job, event, attempt or node)."""
    path = {p["name"] for p in operation.path_parameters()}
    unknown = path - SCOPE_PARAMETERS - UNSCOPED_PARAMETERS
    assert not unknown, f"{operation.label}: the matrix cannot fill {unknown}; teach it"
    query = {p["name"] for p in operation.spec.get("parameters", []) if p.get("in") == "query"}
    named = path | query | body_properties(app.openapi(), operation.spec)
    return bool(named & (SCOPE_PARAMETERS | {"node"}))


@dataclass
class Tally:
    """The matrix's figures: requests made, refusals as declared, and what went wrong."""

    checks: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)


def check_operation(
    client: TestClient, app: FastAPI, database: Database, operation: Operation, tally: Tally
) -> None:
    """Call ``operation`` as every caller of a fresh world, on each scope it can name."""
    rules = rules_of(operation)
    world = build_world(client, database)
    failures = tally.failures
    targets: list[int | None] = [0, 1] if scoped(app, operation) else [None]
    before = fingerprint(database)
    for caller in world.callers:
        for target in targets:
            own = caller.scope is None or target is None or caller.scope == target
            expected = OUTCOMES[rules[caller.role]][0 if own else 1]
            values = world.scopes[target].values() if target is not None else {}
            values = {**world.unscoped, **values}
            headers = bearer(caller.token) if caller.token else {}
            response = call(client, app, operation, values, headers)
            got = outcome(response)
            where = "" if target is None else f" on {'its own' if own else 'another'} scope"
            label = f"{operation.label} as {caller.label}{where}"
            tally.checks += 1
            after = fingerprint(database)
            if got != expected:
                failures.append(f"{label}: expected {expected}, got {got} {response.text[:200]}")
            elif got == "allowed":
                other = None if caller.scope is None else world.scopes[1 - caller.scope]
                shown = sorted(
                    m for m in (other.markers(caller.role) if other else ()) if m in response.text
                )
                if shown:
                    failures.append(f"{label}: shows the other scope's {shown}")
            else:
                tally.refused += 1
                if after != before:
                    failures.append(f"{label}: refused with {got} but wrote to the database")
                assert_problem(response, int(got))
                if got == "404":
                    assert response.json()["title"] == "Not found", label
            before = after


def test_every_operation_answers_every_role_as_declared(
    client: TestClient, app: FastAPI, database: Database
) -> None:
    """The matrix. Also proves it can fail: the declared outcomes include each class."""
    tally = Tally()
    ops = list(operations(app))
    for operation in ops:
        check_operation(client, app, database, operation, tally)

    print(
        f"\nsecurity matrix ({database.kind}): {len(ops)} operations x 8 callers, "
        f"{tally.checks} requests, {tally.refused} refused as declared, "
        f"{len(tally.failures)} failures"
    )
    assert not tally.failures, "\n".join(tally.failures)
    declared = {rule for op in ops for rule in rules_of(op).values()}
    assert declared >= {"any", "own", "denied", "hidden", "see-only", "token"}, declared
    assert tally.refused > len(ops), "hardly anything was refused: the matrix checked nothing"


def test_an_operation_without_a_declaration_fails_the_matrix(database: Database) -> None:
    app = create_app(Settings(database_url=database.url), engine=database.engine)

    @app.get("/v1/undeclared")
    def undeclared() -> dict[str, str]:
        return {}

    (operation,) = [op for op in operations(app) if op.template == "/v1/undeclared"]
    with pytest.raises(AssertionError, match="declares no x-access"):
        rules_of(operation)


def test_a_job_token_posts_only_its_own_jobs_events(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    mine = submit(client, tokens.user_a)
    other = submit(client, tokens.user_a)
    token = tokens.job(mine)
    event = {"seq": 1, "kind": "progress", "epoch": 1, "samples": 10, "seconds": 1.0}

    refused = client.post(
        f"/v1/jobs/{other}/events", json={**event, "batch_size": 32}, headers=bearer(token)
    )
    assert_problem(refused, 404)
    accepted = client.post(
        f"/v1/jobs/{mine}/events", json={**event, "batch_size": 32}, headers=bearer(token)
    )
    assert accepted.status_code == 201, accepted.json()
    events = "SELECT count(*) FROM job_events WHERE job_id = :job AND kind = 'progress'"
    assert count(database, events, job=other) == 0
    assert count(database, events, job=mine) == 1


# Rate limits ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited_app(database: Database, **limits: Any) -> tuple[FastAPI, FakeClock]:
    database.empty()
    app = create_app(
        Settings(database_url=database.url, database_schema=database.schema, **limits),
        engine=database.engine,
    )
    clock = FakeClock()
    app.state.rate_limiter.clock = clock
    return app, clock


def test_a_token_over_its_rate_gets_429_with_retry_after_and_others_do_not(
    database: Database,
) -> None:
    app, clock = limited_app(database, rate_limit_per_s=0.5, rate_limit_burst=3)
    with Session(database.engine) as session:
        alice = create_token(session, Role.USER, tenant=TENANT_A)
        bob = create_token(session, Role.USER, tenant=TENANT_B)
        admin = create_token(session, Role.ADMIN)
    with TestClient(app) as client:
        passed = [client.get("/v1/jobs", headers=bearer(alice)).status_code for _ in range(3)]
        limited = client.post("/v1/jobs", json=job_body(), headers=bearer(alice))
        others = [client.get("/v1/jobs", headers=bearer(bob)).status_code for _ in range(3)]
        admins = [client.get("/v1/jobs", headers=bearer(admin)).status_code for _ in range(20)]
        clock.now += 1.0
        still = client.get("/v1/jobs", headers=bearer(alice))
        clock.now += 1.0
        again = client.get("/v1/jobs", headers=bearer(alice))

    assert passed == [200, 200, 200]
    assert_problem(limited, 429, path="/v1/jobs")
    assert limited.headers["retry-after"] == "2", "one request per 2 s: wait 2 whole seconds"
    assert others == [200] * 3 and admins == [200] * 20
    assert_problem(still, 429)
    assert still.headers["retry-after"] == "1"
    assert again.status_code == 200
    assert count(database, "SELECT count(*) FROM jobs") == 0


def test_admins_are_limited_only_when_configured(database: Database) -> None:
    app, _ = limited_app(database, rate_limit_per_s=1, rate_limit_burst=2, rate_limit_admin=True)
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN)
    with TestClient(app) as client:
        answers = [client.get("/v1/cluster", headers=bearer(admin)) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[-1].headers["retry-after"] == "1"


def test_guessing_tokens_is_limited_by_address(database: Database) -> None:
    app, _ = limited_app(database, rate_limit_per_s=0.1, rate_limit_burst=4)
    with Session(database.engine) as session:
        valid = create_token(session, Role.USER, tenant=TENANT_A)
    with TestClient(app) as client:
        guesses = [
            client.get("/v1/jobs", headers=bearer(f"swk_guess{i}")).status_code for i in range(6)
        ]
        anonymous = client.get("/v1/jobs")
        with_token = client.get("/v1/jobs", headers=bearer(valid))

    assert guesses == [401] * 4 + [429] * 2
    assert_problem(anonymous, 429)
    assert anonymous.headers["retry-after"] == "10"
    assert with_token.status_code == 200, "a valid token has a bucket of its own"


def test_the_default_limit_never_throttles_a_polling_agent() -> None:
    """An agent polls every 2 s and heartbeats every 3 s, with bursts of reports: far below the
    default (``Settings()``); a client looping as fast as it can is stopped."""
    defaults = Settings(database_url="sqlite://")
    clock = FakeClock()
    limiter = RateLimiter(defaults.rate_limit_per_s, defaults.rate_limit_burst, clock=clock)
    refused = 0
    for tick in range(3600):
        clock.now += 1.0
        requests = (tick % 2 == 0) + (tick % 3 == 0) + (8 if tick % 300 == 0 else 0)
        refused += sum(limiter.acquire("token:agent") > 0 for _ in range(requests))
    runaway = sum(limiter.acquire("token:loop") > 0 for _ in range(1000))

    assert refused == 0
    assert runaway == 1000 - defaults.rate_limit_burst


def test_the_limiter_counts_exactly_under_threads() -> None:
    limiter = RateLimiter(per_second=1e-9, burst=500)
    passed: list[int] = []
    lock = threading.Lock()

    def hammer() -> None:
        mine = sum(limiter.acquire("token:shared") == 0 for _ in range(200))
        with lock:
            passed.append(mine)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(passed) == 500


def test_the_limiter_forgets_buckets_beyond_its_bound() -> None:
    clock = FakeClock()
    limiter = RateLimiter(per_second=1.0, burst=1, max_keys=100, clock=clock)
    for i in range(1000):
        limiter.acquire(f"ip:10.0.{i // 256}.{i % 256}")
    assert len(limiter._buckets) <= 100
    assert limiter.acquire("ip:10.0.3.231") > 0, "the newest buckets are kept"


# Body limits ---------------------------------------------------------------------------------

MAX_BODY = 2_000
JSON = {"Content-Type": "application/json"}


def body_app(database: Database) -> FastAPI:
    database.empty()
    return create_app(
        Settings(
            database_url=database.url, database_schema=database.schema, max_body_bytes=MAX_BODY
        ),
        engine=database.engine,
    )


def chunks(size: int, piece: int = 500) -> Iterator[bytes]:
    """A valid JSON job of about ``size`` bytes, in pieces (httpx sends it chunked): without
    a limit it would be accepted."""
    body = job_body(name="big", command=["x" * 40] * max(1, (size - 120) // 44))
    raw = json.dumps(body).encode()
    for start in range(0, len(raw), piece):
        yield raw[start : start + piece]


def test_bodies_over_the_limit_are_413_with_or_without_content_length(
    database: Database,
) -> None:
    app = body_app(database)
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN)
    with TestClient(app) as client:
        declared = client.post("/v1/jobs", content=b"x" * (MAX_BODY + 1), headers=bearer(admin))
        chunked = client.post(
            "/v1/jobs", content=chunks(3 * MAX_BODY), headers=JSON | bearer(admin)
        )
        small = client.post("/v1/jobs", content=chunks(300), headers=JSON | bearer(admin))

    assert_problem(declared, 413, path="/v1/jobs")
    assert_problem(chunked, 413, path="/v1/jobs")
    assert small.status_code == 201, small.json()
    assert count(database, "SELECT count(*) FROM jobs") == 1


def test_the_live_server_limits_chunked_and_lying_bodies(database: Database) -> None:
    app = body_app(database)
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN)
    with serving(app) as base:
        with httpx.Client(base_url=base) as http:
            chunked = http.post(
                "/v1/jobs", content=chunks(3 * MAX_BODY), headers=JSON | bearer(admin)
            )
            assert "content-length" not in chunked.request.headers
        port = int(base.rsplit(":", 1)[1])
        lying = raw_request(port, admin, declared=60, body=b'{"name": "x"' + b" " * 5000 + b"}")
        with httpx.Client(base_url=base) as http:
            healthy = http.get("/healthz")

    assert_problem(chunked, 413, path="/v1/jobs")
    # The server reads only the declared 60 bytes: uvicorn on h11 answers them (422, not
    # JSON); on httptools the bytes after them are an invalid request and it answers 400 and
    # closes. Either way nothing past the declared length reaches the app.
    assert lying.startswith((b"HTTP/1.1 422", b"HTTP/1.1 400")), lying[:200]
    assert healthy.status_code == 200
    assert count(database, "SELECT count(*) FROM jobs") == 0


def test_slow_bodies_hold_no_admission_slot_and_get_408(database: Database) -> None:
    """Clients that send a request's head and then trickle (here: stall) its body must not take
    the few requests in progress a process admits (api.admission): the body is read first,
    within ``body_timeout_s``. Before, 4 such connections stalled the process, /healthz too."""
    database.empty()
    settings = Settings(
        database_url=database.url, database_schema=database.schema, body_timeout_s=1.0
    )
    app = create_app(settings, engine=database.engine)
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN)
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {admin}\r\nContent-Length: 300\r\n\r\n{{"
    ).encode()
    stalled = 3 * 2 * settings.worker_threads  # three times the requests in progress allowed
    with serving(app) as base, contextlib.ExitStack() as stack:
        port = int(base.rsplit(":", 1)[1])
        slow = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(stalled)
        ]
        for connection in slow:
            connection.sendall(head)
        time.sleep(0.3)
        with httpx.Client(base_url=base, timeout=3) as http:
            healthy = http.get("/healthz")
            job = http.post("/v1/jobs", json=job_body(), headers=bearer(admin))
        answers = [connection.recv(65536) for connection in slow]  # within 1 s: 408
        closed = [connection.recv(65536) for connection in slow]

    assert healthy.status_code == 200
    assert job.status_code == 201, job.text
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
    assert b"did not arrive within 1 s" in answers[0]
    assert closed == [b""] * stalled, "the server closes a connection whose body timed out"
    assert count(database, "SELECT count(*) FROM jobs") == 1


def raw_request(port: int, token: str, *, declared: int, body: bytes) -> bytes:
    """POST /v1/jobs with a Content-Length of ``declared`` but ``body`` sent; the raw answer."""
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {declared}\r\n\r\n"
    ).encode()
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        with contextlib.suppress(OSError):
            connection.sendall(head + body)
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except OSError:
            pass
    return received


# Secrets in logs -----------------------------------------------------------------------------

BOOT = (
    "import logging, sys; logging.basicConfig(level=logging.DEBUG, stream=sys.stderr); "
    "logging.getLogger('sqlalchemy').setLevel(logging.DEBUG); "
    "from shockwave_cli.main import app; app()"
)
"""``shockwave api`` with every logger at DEBUG (SQLAlchemy's too: statements, parameters, rows)."""
TOKEN_PATTERN = re.compile(r"swk_[A-Za-z0-9_-]{16,}")


def test_secrets_never_reach_the_logs(postgres_server: Engine, tmp_path: Path) -> None:
    """``shockwave api`` at DEBUG (root logger too: SQL, parameters and rows), on Postgres
    through a URL with a password; requests of every role, a job token handed out by the API,
    and errors (401, 403, 404, 413, 422, 429). Neither a token nor the password is logged."""
    password = "pw-" + secrets.token_hex(12)
    url = make_url(POSTGRES_URL).set(password=password).render_as_string(hide_password=False)
    log_path = tmp_path / "api.log"
    with postgres_schema(postgres_server, "sec") as schema:
        port = free_port()
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "SHOCKWAVE_DATABASE_URL": url,
            "SHOCKWAVE_DATABASE_SCHEMA": schema,
            "SHOCKWAVE_RATE_LIMIT_PER_S": "0.1",
            "SHOCKWAVE_RATE_LIMIT_BURST": "20",
            "SHOCKWAVE_MAX_BODY_BYTES": "5000",
        }
        command = [sys.executable, "-c", BOOT, "api", "--port", str(port), "--log-level", "debug"]
        server = Supervised("the API", command, env, log_path, grace_s=20.0).start()
        engine = make_engine(url, schema)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/healthz", server, 300)
            database = Database("postgres", url, engine, schema)
            plain = {**exercise(base, database), "database password": password}
        finally:
            server.stop()
            engine.dispose()
    logs = log_path.read_text(errors="replace")

    assert "DEBUG" in logs and "/v1/agent/leases/" in logs and " 429" in logs, logs[-3000:]
    assert "SELECT" in logs, "SQL is logged at DEBUG, so parameters were exposed to the check"
    leaked = [name for name, secret in plain.items() if secret in logs]
    assert not leaked, f"logged: {leaked}"
    assert not TOKEN_PATTERN.findall(logs)


def exercise(base: str, database: Database) -> dict[str, str]:
    """Calls of every role and every kind of refusal; the plain secrets involved."""
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN)
        user = create_token(session, Role.USER, tenant=TENANT_A)
        agent = create_token(session, Role.AGENT, node="node-1")
        approve_node(session, "node-1", 1)
        session.commit()
    fake = "swk_" + secrets.token_urlsafe(32)
    with httpx.Client(base_url=base, timeout=10) as http:
        ok = http.post(
            "/v1/agent/register",
            headers=bearer(agent),
            json={"gpus": 1, "gpu_type": "A100", "hostname": "h"},
        )
        assert ok.status_code == 200, ok.text
        job = http.post(
            "/v1/jobs", json=job_body(), headers={**bearer(user), "Idempotency-Key": "k1"}
        )
        assert job.status_code == 201, job.text
        with driver_on(database) as (driver, _):
            driver.step(now())
        (lease,) = http.get("/v1/agent/leases", headers=bearer(agent)).json()["leases"]
        issued = http.post(f"/v1/agent/leases/{lease['attempt_id']}/token", headers=bearer(agent))
        assert issued.status_code == 201, issued.text
        job_token = issued.json()["token"]
        event = {
            "seq": 1,
            "kind": "progress",
            "epoch": 1,
            "samples": 10,
            "seconds": 1.0,
            "batch_size": 32,
        }
        posted = http.post(
            f"/v1/jobs/{job.json()['id']}/events", json=event, headers=bearer(job_token)
        )
        assert posted.status_code == 201, posted.text
        statuses = {
            http.get("/v1/jobs", headers=bearer(fake)).status_code,
            http.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=bearer(job_token)).status_code,
            http.get("/v1/jobs/no-such-job", headers=bearer(user)).status_code,
            http.post("/v1/jobs", content=b"x" * 6000, headers=bearer(user)).status_code,
            http.post("/v1/jobs", json={"gpus": 3}, headers=bearer(user)).status_code,
            http.get("/v1/nodes", headers=bearer(admin)).status_code,
        }
        assert statuses == {401, 403, 404, 413, 422, 200}, statuses
        spam = [http.get("/v1/cluster", headers=bearer(user)).status_code for _ in range(30)]
        assert 429 in spam, spam
    return {
        "admin token": admin,
        "user token": user,
        "agent token": agent,
        "job token": job_token,
        "unknown token": fake,
    }


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://shockwave:{pw}@127.0.0.1:1/db",
        "postgresql+psycopg://shockwave:{pw}@127.0.0.1:port/db",
        "shockwave:{pw}@127.0.0.1/db",
    ],
    ids=["unreachable", "bad-port", "unparseable"],
)
def test_a_failed_start_does_not_print_the_database_password(url: str) -> None:
    password = "pw-" + secrets.token_hex(12)
    env = {**os.environ, "SHOCKWAVE_DATABASE_URL": url.format(pw=password)}
    result = subprocess.run(
        [sys.executable, "-c", BOOT, "api", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode != 0
    assert "SHOCKWAVE_DATABASE_URL" in result.stderr or "database" in result.stderr
    assert password not in result.stdout + result.stderr
