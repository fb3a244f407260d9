"""Server CPU per request, by endpoint, for one API process and one client at a time.

Usage::

    python -m bench.request_cost [--requests 200] [--postgres postgresql://...] [--json OUT]
        [--tree DIR]

Why: the load test (bench/load.py) asks whether 2 API processes on a 2-core machine can serve
256 agents contacting every 2 s (a heartbeat and a lease poll each: about 256 requests/s). That
is a question of CPU per request, which a loaded machine hides behind queueing. Here one client
sends one request at a time to one ``shockwave api`` on a throwaway, migrated Postgres
database, and the server process's own CPU time (user + system, from /proc) is divided by the
number of requests. Reported per endpoint: server CPU ms per request and client-side wall ms.
The capacity the figures imply (requests/s one core can serve) is printed beside them.

The agent's node has 8 GPUs and, after the first rows, 8 running one-GPU leases (a round
started in this process with the round driver's own code): what an idle node of a busy cluster
sends most (a poll that says nothing new; a held long poll's re-read, without a heartbeat) and
what a node whose jobs report their progress sends (8 progress events in one poll, each new).
``--tree DIR`` runs the API from another copy of the project (before/after comparisons).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

from bench.api import postgres_database
from bench.load import (
    HOST,
    api_argv,
    prepare,
    service_env,
    started,
    wait_ready,
)
from shockwave_cli.runtime.supervision import free_port, group_cpu_seconds

WARMUP = 10
GPUS = 8
"""The agent's node's GPUs, and the one-GPU jobs leased on it."""


def run_a_round(database_url: str) -> list[str]:
    """Start a round with the round driver's code (no plan: first in, first out) and return
    the attempts it leased."""
    from sqlmodel import Session

    from solver_service.leases import start_round
    from store.cluster_version import ensure_cluster
    from store.db import make_engine

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            ensure_cluster(session)
            session.commit()
            start_round(session, "default", time.time())
        with engine.connect() as connection:
            rows = connection.exec_driver_sql("SELECT id FROM leases ORDER BY id").all()
        return [str(row[0]) for row in rows]
    finally:
        engine.dispose()


def progress_events(attempts: Sequence[str], step: int) -> list[dict[str, object]]:
    """One progress event per attempt, each the ``step``-th of its attempt (a new ``seq``):
    what a node whose jobs each finished an epoch sends in its poll."""
    return [
        {
            "attempt_id": attempt,
            "seq": step,
            "kind": "progress",
            "epoch": 1 + step % 1000,
            "samples": 1000,
            "seconds": 1.0,
            "batch_size": 32,
        }
        for attempt in attempts
    ]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process ``pid`` and its group (Linux /proc)."""
    return group_cpu_seconds([pid])[pid]


def measure(
    pid: int,
    send: Callable[[], httpx.Response],
    requests: int,
    before: Callable[[], None] | None = None,
) -> tuple[float, float, int]:
    """(server CPU ms per request, client wall ms per request, last status) of ``send``.
    ``before``: run ahead of each request, outside the server (its CPU is not counted; its
    wall time is)."""
    for _ in range(WARMUP):
        if before is not None:
            before()
        send()
    cpu, wall = process_cpu_s(pid), time.perf_counter()
    status = 0
    for _ in range(requests):
        if before is not None:
            before()
        status = send().status_code
    per = 1000.0 / requests
    return (process_cpu_s(pid) - cpu) * per, (time.perf_counter() - wall) * per, status


def revoke(connection: psycopg.Connection[Any], attempts: Sequence[str]) -> Callable[[], None]:
    """Put ``attempts`` back to REVOKED and their jobs to RUNNING (straight in the database):
    the next poll reporting them ``checkpointed`` stops them and suspends their jobs, as a
    node's report poll after a round boundary that took its attempts back does."""
    ids = list(attempts)

    def run() -> None:
        connection.execute(
            "UPDATE leases SET state = 'REVOKED', exit_code = NULL WHERE id = ANY(%s)", (ids,)
        )
        connection.execute(
            "UPDATE jobs SET state = 'RUNNING' WHERE id IN "
            "(SELECT job_id FROM leases WHERE id = ANY(%s))",
            (ids,),
        )

    return run


def unstarted(connection: psycopg.Connection[Any], attempts: Sequence[str]) -> Callable[[], None]:
    """Put ``attempts`` back to ISSUED with no job token (straight in the database): the next
    poll that asks for tokens and does not list them as running mints one for each, as a
    held poll's re-read that brings a round's new leases does."""
    ids = list(attempts)

    def run() -> None:
        connection.execute("UPDATE leases SET state = 'ISSUED' WHERE id = ANY(%s)", (ids,))
        connection.execute("DELETE FROM tokens WHERE attempt_id = ANY(%s)", (ids,))

    return run


def reissue(
    connection: psycopg.Connection[Any], attempts: Sequence[str], job_state: str
) -> Callable[[], None]:
    """Put ``attempts`` back to ISSUED and their jobs to ``job_state`` (straight in the
    database, not through the server): the next poll listing them as running acknowledges
    them again, as a node's first poll after a round boundary does. ``PENDING``: their jobs
    start (each one's state changes, with a state event); ``RUNNING``: they ran elsewhere
    (a moved job: only the leases change)."""
    ids = list(attempts)

    def run() -> None:
        connection.execute("UPDATE leases SET state = 'ISSUED' WHERE id = ANY(%s)", (ids,))
        connection.execute(
            "UPDATE jobs SET state = %s WHERE id IN (SELECT job_id FROM leases WHERE id = ANY(%s))",
            (job_state, ids),
        )

    return run


def more_agent_tokens(database_url: str, node: str, count: int) -> list[str]:
    """``count`` more agent tokens of ``node`` (straight in the database): a sender that uses
    each once finds none in the API's token cache, as an agent's long poll does (its hold
    outlasts the cache's lifetime: each poll's lookup reaches the database)."""
    from sqlmodel import Session

    from store.db import make_engine
    from store.principals import Role
    from store.tokens import create_token

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            made = [create_token(session, Role.AGENT, node=node) for _ in range(count)]
            session.commit()
        return made
    finally:
        engine.dispose()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="an existing database to connect to while creating and dropping the bench's own",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--tree", type=Path, default=None, help="run the API from this copy of the project"
    )
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    rows: list[dict[str, object]] = []
    with ExitStack() as stack:
        database_url = stack.enter_context(postgres_database(args.postgres))
        tokens = prepare(database_url, agents=1)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shockwave-cost-")))
        # One client sends hundreds of requests a second on one token: no rate limit here.
        env = service_env(
            database_url, "redis://127.0.0.1:6379/15", args.tree, SHOCKWAVE_RATE_LIMIT_PER_S="0"
        )
        port = free_port()
        server = stack.enter_context(started("api", api_argv(port, []), env, logs, args.tree))
        base = f"http://{HOST}:{port}"
        wait_ready(base, server)
        client = stack.enter_context(httpx.Client(base_url=base, timeout=10.0))
        agent = {"Authorization": f"Bearer {tokens.agents[0][1]}"}
        user = {"Authorization": f"Bearer {tokens.user}"}
        client.post("/v1/agent/register", json={"gpus": GPUS, "hostname": "h"}, headers=agent)
        job = {
            "name": "cost",
            "gpus": 1,
            "epochs": 3,
            "samples_per_epoch": 1000,
            "initial_batch_size": 32,
        }
        long_job = {**job, "epochs": 100_000}
        for _ in range(GPUS):
            client.post("/v1/jobs", json=long_job, headers=user).raise_for_status()
        attempts = run_a_round(database_url)
        acknowledged = client.post("/v1/agent/poll", json={"running": attempts}, headers=agent)
        acknowledged.raise_for_status()
        seq = itertools.count(1)

        def progress() -> list[dict[str, object]]:
            return progress_events(attempts, next(seq))

        ghosts = [
            {"attempt_id": f"0b5c3a4e-0000-4000-8000-{i:012d}", "state": "checkpointed"}
            for i in range(8)
        ]
        endpoints: list[tuple[str, Callable[[], httpx.Response]]] = [
            ("GET /healthz (no database)", lambda: client.get("/healthz")),
            ("GET unknown path (404)", lambda: client.get("/no-such-path")),
            (
                "POST /v1/agent/heartbeat",
                lambda: client.post("/v1/agent/heartbeat", json={}, headers=agent),
            ),
            ("GET /v1/agent/leases", lambda: client.get("/v1/agent/leases", headers=agent)),
            (
                "POST /v1/agent/poll (a heartbeat and the leases)",
                lambda: client.post("/v1/agent/poll", json={}, headers=agent),
            ),
            (
                "POST /v1/agent/poll (8 reports on unknown attempts)",
                lambda: client.post("/v1/agent/poll", json={"reports": ghosts}, headers=agent),
            ),
            (
                f"POST /v1/agent/poll ({GPUS} running leases, nothing new)",
                lambda: client.post("/v1/agent/poll", json={"running": attempts}, headers=agent),
            ),
            (
                f"POST /v1/agent/poll ({GPUS} running leases, a held poll's re-read)",
                lambda: client.post(
                    "/v1/agent/poll",
                    json={"running": attempts, "heartbeat": False},
                    headers=agent,
                ),
            ),
            (
                f"POST /v1/agent/poll ({GPUS} running leases, {GPUS} progress events)",
                lambda: client.post(
                    "/v1/agent/poll",
                    json={"running": attempts, "events": progress()},
                    headers=agent,
                ),
            ),
            ("GET /v1/jobs", lambda: client.get("/v1/jobs?page_size=10", headers=user)),
            ("POST /v1/jobs", lambda: client.post("/v1/jobs", json=job, headers=user)),
            (
                "GET /v1/jobs (the default page: 50 of the jobs posted)",
                lambda: client.get("/v1/jobs", headers=user),
            ),
        ]

        def agent_poll(body: dict[str, Any]) -> Callable[[], httpx.Response]:
            """A sender of one agent poll with ``body`` (the lambda binds this ``body``)."""
            return lambda: client.post("/v1/agent/poll", json=body, headers=agent)

        acknowledge = agent_poll({"running": attempts, "defer_busy": True})
        measured: list[tuple[str, Callable[[], httpx.Response], Callable[[], None] | None]] = [
            (name, send, None) for name, send in endpoints
        ]
        fresh_tokens = iter(
            more_agent_tokens(database_url, tokens.agents[0][0], args.requests + WARMUP)
        )

        def uncached() -> httpx.Response:
            """An idle node's poll on a token the API has not looked up in its cache's lifetime."""
            headers = {"Authorization": f"Bearer {next(fresh_tokens)}"}
            return client.post("/v1/agent/poll", json={"running": attempts}, headers=headers)

        measured.append(
            (
                f"POST /v1/agent/poll ({GPUS} running leases, nothing new, its token not cached: "
                "a long poll's)",
                uncached,
                None,
            )
        )

        database = stack.enter_context(
            psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True)
        )
        for job_state, what in (("PENDING", "their jobs start"), ("RUNNING", "jobs moved")):
            measured.append(
                (
                    f"POST /v1/agent/poll ({GPUS} new attempts acknowledged: {what})",
                    acknowledge,
                    reissue(database, attempts, job_state),
                )
            )
        checkpointed = [{"attempt_id": a, "state": "checkpointed"} for a in attempts]
        for what, body, reset in (
            (
                f"a held poll's re-read bringing {GPUS} new leases: tokens",
                {"heartbeat": False, "tokens": True, "defer_busy": True},
                unstarted(database, attempts),
            ),
            (
                f"{GPUS} revoked attempts report checkpointed",
                {"reports": checkpointed, "heartbeat": False, "defer_busy": True},
                revoke(database, attempts),
            ),
        ):
            measured.append((f"POST /v1/agent/poll ({what})", agent_poll(body), reset))
        pid = server.pid
        for name, send, before in measured:
            cpu_ms, wall_ms, status = measure(pid, send, args.requests, before)
            rows.append({"endpoint": name, "status": status, "cpu_ms": cpu_ms, "wall_ms": wall_ms})
    table = Table(title=f"one API process, one client, {args.requests} requests each")
    for column in ("endpoint", "status", "server CPU ms/request", "wall ms", "req/s per core"):
        table.add_column(column, justify="left" if column == "endpoint" else "right")
    for row in rows:
        cpu_ms = float(str(row["cpu_ms"]))
        table.add_row(
            str(row["endpoint"]),
            str(row["status"]),
            f"{cpu_ms:.1f}",
            f"{float(str(row['wall_ms'])):.1f}",
            f"{1000.0 / cpu_ms:.0f}" if cpu_ms > 0 else "-",
        )
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"requests": args.requests, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
