"""Scale: the service schedules thousands of active jobs on simulated nodes, round by round.

Usage::

    python -m bench.scale [--rounds 10] [--round-seconds 30 | --stress] [--jobs 900]
        [--nodes 64] [--gpus-per-node 4] [--apis N] [--user-apis 1] [--wait-seconds S]
        [--report-seconds S] [--replan reactive|lazy] [--event-posts] [--port-base P]
        [--agent-p99-ms 1000] [--user-p99-ms 100] [--json OUT] [--log-dir DIR]

What runs, all real: a throwaway Postgres database (migrated), ``--apis`` ``shockwave api``
processes (each node, and each job's attempt, talks to one of them, chosen by its token) and
``--user-apis`` more that only the user talks to (a deployment routes ``/v1/agent/`` to the
agents' processes and the rest to the users': a fleet's bursts then never queue in front of a
person, in the process or for its CPU),
one ``shockwave worker`` (Celery, concurrency 1) on a queue of this run's own on the shared
Redis (nobody else's worker takes its requests, and it takes nobody's), one ``shockwave driver``
with ``--round-seconds``, and ``--nodes`` simulated agents (``shockwave_fleet/fleet.py``: one
asyncio loop in this process multiplexes them all, the agent protocol at the real agent's default
poll and heartbeat intervals, training at each job's true pace from the reference trajectory).
From 256 nodes the agents long-poll (``--wait-seconds``, 10 s: an idle node costs a request
per 10 s, and a new round reaches every node as soon as the driver commits it); each job's
progress and scaling events ride in its node's polls (``--event-posts``: one request each, with
the attempt's job token, as the SDK posts them), and each job reports its progress at most once
a round (``--report-seconds``: its latest epoch; the planner reads a job's progress once a round
and credits the training since its last report), not every epoch: with the reference trace's
epochs of seconds, a thousand nodes' jobs would otherwise send several hundred events a second.
From 256 nodes the cluster re-plans lazily (``--replan``): a change (a scaling event, a node
joining) only bumps its state version, and the round driver's request half-way through each
round is the round's one plan request (in reactive mode each of the tens of changes a round
asks for a plan, and the one worker solves without pause, its plans older than that request).

Order: the API and the worker start; ``--jobs`` jobs are submitted: the 900-job reference trace,
repeated from its start past 900 (``--submit db``, the default: through the API's own
``create_job``, 500 a transaction on 4 connections; ``--submit http``: ``POST /v1/jobs``, minutes
on a loaded 2-core machine, while no node is registered yet so the worker skips those requests);
the database's statistics are gathered (``ANALYZE``, as autovacuum would after the bulk insert:
a deployed Postgres runs autovacuum, and without statistics the query planner may read a whole
table where an index reads a row); the nodes register (spread over a second, or 10 ms apart from
100 nodes on); the driver starts and the agents run until round ``--rounds`` has been issued,
while a user lists the jobs (``GET /v1/jobs``) every ``--user-every`` seconds. Every job is
active (PENDING, RUNNING or SUSPENDED) from submission on: at the trace's own pace no job can
finish within a short run (the shortest needs 0.2 GPU-hours), and the table shows the count.

Round length: 30 s by default, a quarter of the service's default 120 s (the paper's), so every
per-round cost (snapshot, solve, materialization, agent reports) weighs four times as much as in
production while 10 rounds still take five minutes. ``--stress`` uses 8 s: the plan is asked
for 4 s before the boundary. The solver's time limit is a quarter of the round (at most the
default 15 s), so a solve that hits it still leaves time to store the plan.

Per round it prints and writes (``--json``): lateness (due time to leases visible, and to the
last agent seeing the round), the driver's own start delay and materialization time, the plan's
source, solve and snapshot-load times, the plan's age, the leases issued/extended/revoked, jobs
and GPUs in the round and jobs active. Over the run: request latency and rate per endpoint, the
long polls by why each was answered (``long_polls``), the user's list latency, nodes declared
LOST, the API's CPU per node-minute and per job-minute, and
the database's rows read and written and commits per round (``pg_stat_database``), and each
table's scans and the rows they read per round (``pg_stat_user_tables``). It exits 2
when a bound is missed (:func:`missed_bounds`): a late round (defined in
``bench/scale_report.py``: visible more than ``--late-after``, 1 s, after due, or not made from a
fresh plan), a live node declared LOST, an agent request kind with p99 over ``--agent-p99-ms``
(the long polls, held on purpose, aside), or a user's list with p99 over ``--user-p99-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import psycopg
import redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine
from sqlmodel import Session, col, select

from api.schemas import JobCreate
from bench.api import postgres_database, quantile
from bench.deployment import HARNESS_GPUS
from bench.scale_report import (
    RoundFigures,
    parse_asked,
    parse_driver_log,
    parse_lost,
    parse_plan_log,
    read_log,
    round_figures,
)
from shockwave.workloads.workload import SimJob
from shockwave_cli.commands.inputs import load_throughputs, load_workload
from shockwave_cli.runtime.supervision import Supervisor, free_port, shockwave_argv, wait_http
from shockwave_fleet.fleet import Fleet, TrainingJob, job_body, training_job
from store import migrate
from store.cluster import approve_node
from store.cluster_version import bump_state_version
from store.jobs import create_job
from store.principals import Principal, Role
from store.tables import PlanRow, RoundRow
from store.tokens import add_token

HOST = "127.0.0.1"
TENANT = "default"
"""The tenant of the submitted jobs (an admin's submissions without one)."""
TRACE = "900_0.2_5_100_5_15_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic"
DEFAULT_ROUND_S = 30.0
STRESS_ROUND_S = 8.0
MAX_SOLVER_LIMIT_S = 15.0
WATCH_EVERY_S = 0.02
WATCH_AHEAD_S = 11.0
"""The watcher polls every ``WATCH_EVERY_S`` from this long before the current round ends:
more than the driver's longest boundary lead (10 s), so the next round, out at most that
early, is seen within ``WATCH_EVERY_S``."""
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
REGISTER_TIMEOUT_S = 180.0
"""How long the nodes may take to register (plus 10 ms a node: they start that far apart): on
a loaded 2-core machine the API sheds a thousand nodes' registrations (503) and the agents
retry them for over a minute."""
AGENTS_NICE = 5
"""The agents' API processes' default niceness beside users' processes of their own: on cores
the two share, the kernel then runs a user's request as soon as it arrives, ahead of the
agents' burst (the admission's order, users before agents, carried to the CPU); on cores of
their own it changes nothing."""
NODES_PER_API = 512
"""The nodes one agents' API process serves by default (the cost model's recommendation: a
1,024-node round's boundary burst is about 6 CPU-seconds of polls, which two processes serve
within the driver's boundary lead)."""
LONG_POLL_S = 10.0
LONG_POLL_FROM_NODES = 256
"""From this many nodes the agents long-poll by default: an idle node then costs a request
per ``LONG_POLL_S`` instead of one a second."""
LEAD_S = 5.0
LEAD_FROM_JOBS = 2000
"""From this many jobs the driver begins each round ``LEAD_S`` early (its boundary lead, by
design: the round keeps its cadence and its leases their end): gathering thousands of active
jobs and live leases takes seconds, and the round is then out at its due time, not that long
after it."""
HELD_KINDS = ("poll",)
"""Request kinds that a long poll holds on purpose: not counted against the agent bound."""
DB_STATS_SQL = (
    "SELECT tup_returned, tup_fetched, tup_inserted, tup_updated, tup_deleted, xact_commit "
    "FROM pg_stat_database WHERE datname = current_database()"
)
DB_STATS = ("returned", "fetched", "inserted", "updated", "deleted", "commits")


def db_stats(dsn: str) -> dict[str, int]:
    """The run database's row and transaction counters (``pg_stat_database``; Postgres sends
    them to the statistics collector within about a second)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(DB_STATS_SQL).fetchone()
    return dict(zip(DB_STATS, (int(v) for v in row or (0,) * len(DB_STATS)), strict=True))


TABLE_STATS_SQL = (
    "SELECT relname, seq_scan, seq_tup_read, coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0) "
    "FROM pg_stat_user_tables"
)
TABLE_STATS = ("seq_scans", "seq_rows", "index_scans", "index_rows")


def table_stats(dsn: str) -> dict[str, dict[str, int]]:
    """Each table's scans and the rows they read (``pg_stat_user_tables``): which reads the
    database's rows returned come from."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        rows = connection.execute(TABLE_STATS_SQL).fetchall()
    return {
        str(row[0]): dict(zip(TABLE_STATS, (int(v) for v in row[1:]), strict=True)) for row in rows
    }


def per_round(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], rounds: float
) -> dict[str, dict[str, int]]:
    """The tables' figures that moved, per round of the run."""
    moved = {}
    for table, figures in after.items():
        was = before.get(table, {})
        delta = {k: round((v - was.get(k, 0)) / rounds) for k, v in figures.items()}
        if any(delta.values()):
            moved[table] = delta
    return moved


def postgres_cpu_seconds(database: str) -> float:
    """CPU seconds (user + system) used so far by the Postgres backends serving ``database``
    (Linux /proc; a backend's process title names its database). The pools keep their
    connections for the run, so the difference over the run is the database's work for it
    (less what backends that closed meanwhile used)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not title.startswith("postgres: ") or f" {database} " not in title:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


ACTIVE_SQL = "SELECT count(*) FROM jobs WHERE state IN ('PENDING', 'RUNNING', 'SUSPENDED')"

console = Console()
if not console.is_terminal:
    console.width = max(console.width, 160)


@dataclass
class Watcher:
    """Polls the cluster row every ``WATCH_EVERY_S`` from ``WATCH_AHEAD_S`` before the
    current round ends until the next one is visible (and once a second before that: no
    round can be out earlier than the driver's longest boundary lead before its due time):
    when each round became visible (wall time) and how many jobs were active then."""

    dsn: str
    visible_at: dict[int, float] = field(default_factory=dict)
    version_at: dict[int, int] = field(default_factory=dict)
    active_at: dict[int, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            while not self.stop.is_set():
                row = connection.execute(
                    "SELECT current_round, state_version, round_ends_at FROM clusters "
                    "WHERE id = 'default'"
                ).fetchone()
                if row is not None and row[0] not in self.visible_at:
                    self.visible_at[row[0]] = time.time()
                    self.version_at[row[0]] = row[1]
                    count = connection.execute(ACTIVE_SQL).fetchone()
                    self.active_at[row[0]] = int(count[0]) if count else 0
                pause = WATCH_EVERY_S
                if row is not None and row[2] is not None:
                    quiet = row[2].timestamp() - WATCH_AHEAD_S - time.time()
                    pause = max(pause, min(1.0, quiet))
                self.stop.wait(pause)

    @property
    def current(self) -> int:
        return max(self.visible_at, default=-1)


@dataclass
class UserProbe:
    """A user listing the jobs (``GET /v1/jobs``, the first page) every ``every_s`` while the
    fleet runs: what a person sees of the service under the agents' load."""

    base_url: str
    token: str
    every_s: float
    latency: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=10.0) as http:
            while not self.stop.is_set():
                began = time.perf_counter()
                try:
                    answer = http.get("/v1/jobs")
                except httpx.HTTPError as error:
                    self.errors[type(error).__name__] += 1
                else:
                    if answer.status_code == 200:
                        self.latency.append(time.perf_counter() - began)
                    else:
                        self.errors[str(answer.status_code)] += 1
                self.stop.wait(max(0.0, self.every_s - (time.perf_counter() - began)))


def niced(niceness: int) -> list[str]:
    """The argv prefix that runs a command at ``niceness`` (none for 0)."""
    return ["nice", "-n", str(niceness)] if niceness else []


def agents_apis(nodes: int, cores: int) -> int:
    """The default number of agents' API processes: one per :data:`NODES_PER_API` nodes, no
    more than ``cores`` (more processes than cores add only switching), at least one."""
    return max(1, min(cores, math.ceil(nodes / NODES_PER_API)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds measured after round 0")
    parser.add_argument("--round-seconds", type=float, default=None, help="default 30")
    parser.add_argument("--stress", action="store_true", help=f"{STRESS_ROUND_S:g} s rounds")
    parser.add_argument("--jobs", type=int, default=900, help="the trace's jobs, repeated past 900")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="agent lease polls")
    parser.add_argument(
        "--apis",
        type=int,
        default=None,
        help=f"the agents' API processes (default: one per {NODES_PER_API} nodes, at most the "
        "cores, at least one)",
    )
    parser.add_argument(
        "--user-apis",
        type=int,
        default=1,
        help="API processes of the users' own, no agent sent there (0: the user's requests "
        "go to the agents' first process)",
    )
    parser.add_argument(
        "--agents-nice",
        type=int,
        default=None,
        help="the agents' API processes' niceness (default 5 with --user-apis, else 0): where "
        "they share cores with the users' processes, the kernel runs a user's request first",
    )
    parser.add_argument("--heartbeat-seconds", type=float, default=3.0)
    parser.add_argument(
        "--wait-seconds",
        type=float,
        default=None,
        help="long polls held up to this long (0: plain polls every --poll-seconds); "
        f"default {LONG_POLL_S:g} from {LONG_POLL_FROM_NODES} nodes, else 0",
    )
    parser.add_argument(
        "--report-seconds",
        type=float,
        default=None,
        help="each job posts its latest epoch at most this often (0: every epoch, each its "
        f"own event); default a round from {LONG_POLL_FROM_NODES} nodes, else 0",
    )
    parser.add_argument(
        "--replan",
        choices=("reactive", "lazy"),
        default=None,
        help="the cluster's re-plan mode; default lazy from "
        f"{LONG_POLL_FROM_NODES} nodes, else reactive",
    )
    parser.add_argument(
        "--event-posts",
        action="store_true",
        help="each job posts its events with its token (default: in its node's polls)",
    )
    parser.add_argument(
        "--boundary-lead",
        type=float,
        default=None,
        help="seconds before a round's end the driver begins the next "
        f"(SHOCKWAVE_BOUNDARY_LEAD_S); default {LEAD_S:g} from {LEAD_FROM_JOBS} jobs, else 0",
    )
    parser.add_argument("--agent-p99-ms", type=float, default=1000.0, help="bound")
    parser.add_argument("--user-p99-ms", type=float, default=100.0, help="bound")
    parser.add_argument(
        "--user-every", type=float, default=0.5, help="seconds between a user's GET /v1/jobs"
    )
    parser.add_argument(
        "--submit", choices=("db", "http"), default="db", help="how the jobs are submitted"
    )
    parser.add_argument("--late-after", type=float, default=1.0, help="seconds after due")
    parser.add_argument("--reference", type=Path, default=Path("../shared/data/reference"))
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="the API processes and the driver's metrics listen on ports from this one up "
        "(default: ports the OS picks)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--log-dir", type=Path, default=Path("out/scale-logs"))
    args = parser.parse_args(argv)
    if args.round_seconds is None:
        args.round_seconds = STRESS_ROUND_S if args.stress else DEFAULT_ROUND_S
    if args.apis is None:
        args.apis = agents_apis(args.nodes, os.cpu_count() or 1)
    if args.apis < 1 or args.user_apis < 0:
        parser.error("--apis must be at least 1, --user-apis at least 0")
    if args.agents_nice is None:
        args.agents_nice = AGENTS_NICE if args.user_apis else 0
    if not 0 <= args.agents_nice <= 19:
        parser.error(f"--agents-nice must be 0 to 19, got {args.agents_nice}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.wait_seconds is None:
        args.wait_seconds = LONG_POLL_S if args.nodes >= LONG_POLL_FROM_NODES else 0.0
    if args.replan is None:
        args.replan = "lazy" if args.nodes >= LONG_POLL_FROM_NODES else "reactive"
    if args.report_seconds is None:
        args.report_seconds = args.round_seconds if args.nodes >= LONG_POLL_FROM_NODES else 0.0
    if args.report_seconds < 0:
        parser.error("--report-seconds must be at least 0")
    if args.boundary_lead is None:
        args.boundary_lead = LEAD_S if args.jobs >= LEAD_FROM_JOBS else 0.0
    if not 0 <= args.boundary_lead <= 10:
        parser.error("--boundary-lead must be between 0 and 10")
    if not 0 <= args.wait_seconds <= 30:
        parser.error("--wait-seconds must be between 0 and 30")
    if args.rounds < 1 or args.nodes < 1 or args.round_seconds < 1:
        parser.error("--rounds, --nodes and --round-seconds must be at least 1")
    return args


def trace_jobs(reference: Path, count: int) -> list[SimJob]:
    """The first ``count`` jobs of the reference trace; past its 900, the trace again from
    its start (each a job of its own: same model, size and trajectory)."""
    throughputs = load_throughputs(reference / "throughputs" / "wisr_throughputs.json")
    workload = load_workload(
        reference / "traces" / f"{TRACE}.trace",
        reference / "trajectories" / f"{TRACE}.wisr.trajectories.json",
        throughputs,
    )
    base = list(workload.jobs)
    return [base[i % len(base)] for i in range(count)]


def submit_http(base_url: str, token: str, jobs: Sequence[SimJob]) -> dict[str, TrainingJob]:
    """Submit every job with ``POST /v1/jobs`` (4 clients, one connection each)."""
    headers = {"Authorization": f"Bearer {token}"}
    local = threading.local()

    def submit(job: SimJob) -> TrainingJob:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=base_url, headers=headers, timeout=30.0)
        answer = local.http.post("/v1/jobs", json=job_body(job))
        if answer.status_code != 201:
            raise RuntimeError(f"submit failed: {answer.status_code} {answer.text}")
        return training_job(answer.json()["id"], job)

    pool = ThreadPoolExecutor(max_workers=4)
    try:
        made = list(pool.map(submit, jobs))
    finally:
        pool.shutdown(cancel_futures=True)
    return {job.id: job for job in made}


SUBMIT_CHUNK = 500
SUBMIT_THREADS = 4


def submit_direct(database_url: str, jobs: Sequence[SimJob]) -> dict[str, TrainingJob]:
    """Insert every job with the API's own :func:`store.jobs.create_job`, ``SUBMIT_CHUNK`` a
    transaction on ``SUBMIT_THREADS`` connections, then bump the cluster's version once: the
    setup takes seconds instead of minutes on a loaded machine (``bench/api.py`` measures the
    submit route itself). The jobs keep their order (arrival times follow the chunks)."""
    engine = create_engine(database_url, pool_size=SUBMIT_THREADS)
    admin = Principal(role=Role.ADMIN, key="scale-bench")

    def insert(chunk: Sequence[SimJob]) -> list[tuple[str, SimJob]]:
        with Session(engine) as session:
            rows = [(create_job(session, admin, JobCreate(**job_body(j))).id, j) for j in chunk]
            session.commit()
            return rows

    chunks = [jobs[i : i + SUBMIT_CHUNK] for i in range(0, len(jobs), SUBMIT_CHUNK)]
    try:
        with ThreadPoolExecutor(max_workers=SUBMIT_THREADS) as pool:
            made = [row for rows in pool.map(insert, chunks) for row in rows]
        with Session(engine) as session:
            bump_state_version(session)
            session.commit()
        return {job_id: training_job(job_id, job) for job_id, job in made}
    finally:
        engine.dispose()


def set_replan(database_url: str, mode: str) -> None:
    """The cluster's re-plan mode (``clusters.replan``): in lazy mode a change only bumps the
    state version and the round driver's half-round request is the round's one plan request;
    in reactive mode every change asks for a plan too."""
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as db:
        if db.execute("UPDATE clusters SET replan = %s", (mode,)).rowcount != 1:
            raise RuntimeError("no cluster row to set the re-plan mode on")


def analyze(database_url: str) -> None:
    """Gather every table's statistics (``ANALYZE``), as Postgres's autovacuum does after a bulk
    insert: without them the query planner guesses at the freshly filled tables and may read
    every row where an index reads one."""
    with psycopg.connect(
        database_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as db:
        db.execute("ANALYZE")


def make_tokens(database_url: str, nodes: Sequence[str]) -> tuple[str, str, dict[str, str]]:
    """An admin token, a user token of the jobs' tenant and one agent token per node, written
    straight to the database in one transaction."""
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            admin = add_token(session, Role.ADMIN, name="scale bench")
            user = add_token(session, Role.USER, tenant=TENANT, name="scale user")
            agents = {n: add_token(session, Role.AGENT, node=n, name=n) for n in nodes}
            for n in nodes:
                approve_node(session, n, HARNESS_GPUS)
            session.commit()
    finally:
        engine.dispose()
    return admin, user, agents


async def drive(
    fleet: Fleet,
    watcher: Watcher,
    rounds: int,
    timeout_s: float,
    start_driver: Callable[[], None],
) -> None:
    """Run the fleet (heartbeating before the driver starts, so no node is lost meanwhile)
    until round ``rounds`` is visible and every agent has seen it."""
    stop = asyncio.Event()
    agents = asyncio.create_task(fleet.run(stop))
    registering = time.monotonic() + REGISTER_TIMEOUT_S + 0.01 * len(fleet.nodes)
    while len(fleet.registered) < len(fleet.nodes) and not agents.done():
        if time.monotonic() > registering:
            stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(agents, STOP_TIMEOUT_S)
            raise RuntimeError(
                f"only {len(fleet.registered)} of {len(fleet.nodes)} nodes registered; "
                f"agent errors {dict(fleet.log.errors)}"
            )
        await asyncio.sleep(0.2)
    start_driver()
    deadline = time.monotonic() + timeout_s
    try:
        while len(fleet.log.nodes_at(rounds)) < len(fleet.nodes):
            if agents.done() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):  # nodes in a burst of slow reports: cancelled
            await asyncio.wait_for(agents, STOP_TIMEOUT_S)
    if watcher.current < rounds:
        raise RuntimeError(f"only round {watcher.current} was issued in {timeout_s:.0f} s")


@contextmanager
def broker_queue(redis_url: str) -> Iterator[str]:
    """A queue name of this run's own; its leftover messages are deleted at the end."""
    queue = f"scale-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        yield queue
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(queue)
        client.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    jobs = trace_jobs(args.reference, args.jobs)
    nodes = [f"node-{i:04d}" for i in range(args.nodes)]
    solver_limit = min(MAX_SOLVER_LIMIT_S, args.round_seconds / 4)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        database_url = stack.enter_context(postgres_database(args.postgres))
        queue = stack.enter_context(broker_queue(args.redis))
        migrate.upgrade(database_url)
        admin, user, agent_tokens = make_tokens(database_url, nodes)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
        env.update(
            SHOCKWAVE_DATABASE_URL=database_url,
            SHOCKWAVE_BROKER_URL=args.redis,
            SHOCKWAVE_SOLVER_QUEUE=queue,
            SHOCKWAVE_SOLVER_MODE="celery",
            SHOCKWAVE_SOLVER_TIME_LIMIT_S=f"{solver_limit:g}",
            SHOCKWAVE_BOUNDARY_LEAD_S=f"{args.boundary_lead:g}",
            PYTHONUNBUFFERED="1",
        )
        processes = Supervisor(args.log_dir, env)
        stack.callback(processes.stop_all)
        base = args.port_base
        ports = iter(range(base, base + args.apis + args.user_apis + 1)) if base else None

        def next_port() -> int:
            return next(ports) if ports is not None else free_port()

        base_urls = []
        for index in range(args.apis):
            port = next_port()
            name = "api" if args.apis == 1 else f"api-{index}"
            api = processes.start(
                name,
                [
                    *niced(args.agents_nice),
                    *shockwave_argv(),
                    *("api", "--host", HOST, "--port", str(port), "--log-level", "warning"),
                ],
            )
            base_urls.append(f"http://{HOST}:{port}")
            wait_http(f"{base_urls[-1]}/readyz", api, START_TIMEOUT_S)
        user_urls = []
        for index in range(args.user_apis):
            port = next_port()
            api = processes.shockwave(
                f"user-api-{index}", "api", "--host", HOST, "--port", str(port),
                "--log-level", "warning", "--no-migrate",
            )  # fmt: skip
            user_urls.append(f"http://{HOST}:{port}")
            wait_http(f"{user_urls[-1]}/readyz", api, START_TIMEOUT_S)
        base_url = base_urls[0]
        processes.shockwave("worker", "worker", "--concurrency", "1", "--log-level", "info")

        began = time.perf_counter()
        if args.submit == "http":
            training = submit_http(base_url, admin, jobs)
        else:
            training = submit_direct(database_url, jobs)
        submit_s = time.perf_counter() - began
        set_replan(database_url, args.replan)
        analyze(database_url)
        console.print(f"submitted {len(training)} jobs in {submit_s:.1f} s")

        fleet = Fleet(
            base_urls,
            {n: (agent_tokens[n], args.gpus_per_node) for n in nodes},
            training,
            poll_s=args.poll_seconds,
            heartbeat_s=args.heartbeat_seconds,
            wait_s=args.wait_seconds or None,
            boundary_retry_s=0.05 if args.wait_seconds else None,
            batch_events=not args.event_posts,
            report_s=args.report_seconds,
        )
        watcher = Watcher(database_url.replace("postgresql+psycopg://", "postgresql://"))
        watching = threading.Thread(target=watcher.run, name="watcher", daemon=True)
        watching.start()
        stack.callback(watcher.stop.set)
        metrics_port = next_port()

        def start_driver() -> None:
            processes.shockwave(
                "driver",
                "driver",
                "--round-seconds",
                f"{args.round_seconds:g}",
                "--metrics-port",
                str(metrics_port),
                "--log-level",
                "info",
            )

        probe = UserProbe(user_urls[0] if user_urls else base_url, user, args.user_every)
        probing = threading.Thread(target=probe.run, name="user", daemon=True)
        stack.callback(probe.stop.set)

        def start_all() -> None:
            start_driver()
            probing.start()

        dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
        db_before = db_stats(dsn)
        tables_before = table_stats(dsn)
        database = dsn.rsplit("/", 1)[1]
        cpu_before = processes.cpu_seconds()
        cpu_before["postgres"] = postgres_cpu_seconds(database)
        cpu_before["bench"] = time.process_time()
        wall_began = time.perf_counter()
        timeout = (args.rounds + 3) * args.round_seconds + 120
        asyncio.run(drive(fleet, watcher, args.rounds, timeout, start_all))
        wall = time.perf_counter() - wall_began
        cpu_after = processes.cpu_seconds()
        cpu_after["postgres"] = postgres_cpu_seconds(database)
        cpu_after["bench"] = time.process_time()
        probe.stop.set()
        time.sleep(1.0)  # the statistics collector's delay
        db_after = db_stats(dsn)
        tables_after = table_stats(dsn)
        processes.stop_all()
        watcher.stop.set()

        engine = create_engine(database_url)
        try:
            with Session(engine) as session:
                rows = list(session.exec(select(RoundRow).order_by(col(RoundRow.index))).all())
                plans = {p.id: p for p in session.exec(select(PlanRow)).all() if p.id is not None}
        finally:
            engine.dispose()
        plan_log_text = read_log(processes.named("worker").log_path)
        driver_log = read_log(processes.named("driver").log_path)
        figures = round_figures(
            [r for r in rows if r.index <= args.rounds],
            plans,
            parse_plan_log(plan_log_text),
            parse_driver_log(driver_log),
            parse_asked(driver_log),
            watcher.visible_at,
            watcher.version_at,
            {r: fleet.log.nodes_at(r) for r in watcher.visible_at},
            watcher.active_at,
            {j.id: s.spec.gpus for j, s in zip(training.values(), jobs, strict=True)},
            args.late_after,
        )
        cpu = {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1) for k in cpu_after}
        api_cpu = sum(v for k, v in cpu.items() if k.startswith("api"))  # the agents' ones
        lost = parse_lost(driver_log)
        return {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "jobs": len(training),
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus_per_node,
            "round_seconds": args.round_seconds,
            "solver_time_limit_s": solver_limit,
            "late_after_s": args.late_after,
            "poll_seconds": args.poll_seconds,
            "heartbeat_seconds": args.heartbeat_seconds,
            "submit_s": round(submit_s, 2),
            "wall_s": round(wall, 1),
            "cpu_s": cpu,
            "plans_stored": len(plans),
            "plan_lines": len(parse_plan_log(plan_log_text)),
            "agent_requests": {
                kind: {
                    "count": len(xs),
                    "p50_ms": round(1000 * quantile(sorted(xs), 0.5), 1),
                    "p99_ms": round(1000 * quantile(sorted(xs), 0.99), 1),
                    "max_ms": round(1000 * max(xs), 1),
                }
                for kind, xs in sorted(fleet.log.latency.items())
            },
            "agent_errors": {f"{k}:{e}": n for (k, e), n in fleet.log.errors.items()},
            "wait_seconds": args.wait_seconds,
            "report_seconds": args.report_seconds,
            "replan": args.replan,
            "boundary_lead_s": args.boundary_lead,
            "held_kinds": list(HELD_KINDS) if args.wait_seconds else [],
            "user_jobs_list": {
                "count": len(probe.latency),
                "p50_ms": round(1000 * quantile(sorted(probe.latency), 0.5), 1),
                "p99_ms": round(1000 * quantile(sorted(probe.latency), 0.99), 1),
                "max_ms": round(1000 * max(probe.latency, default=0.0), 1),
                "errors": dict(probe.errors),
            },
            "nodes_lost": lost,
            "tables_per_round": per_round(tables_before, tables_after, wall / args.round_seconds),
            "db_per_round": {
                k: round((db_after[k] - db_before[k]) / (wall / args.round_seconds))
                for k in DB_STATS
            },
            "requests_per_s": {
                kind: round(len(xs) / wall, 1) for kind, xs in sorted(fleet.log.latency.items())
            },
            "api_cpu_ms_per_node_minute": round(1000 * api_cpu / args.nodes / (wall / 60), 2),
            "api_cpu_ms_per_job_minute": round(1000 * api_cpu / len(training) / (wall / 60), 3),
            "events": dict(fleet.log.events),
            "long_polls": dict(fleet.log.long_polls),
            "rounds": [asdict(f) for f in figures],
        }


def _s(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rounds_table(figures: Sequence[RoundFigures]) -> Table:
    table = Table()
    columns = (
        "round", "source", "late s", "agents s", "began s", "build s", "solve s",
        "snap s", "store s", "age s", "missed", "issued", "ext", "revoked", "jobs",
        "GPUs", "active", "late",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("source", "late?") else "right")
    for f in figures:
        table.add_row(
            str(f.index),
            f.source,
            _s(f.lateness_s),
            _s(f.agents_saw_s, 2),
            _s(f.began_after_due_s),
            _s(f.materialize_s),
            _s(f.solve_s),
            _s(f.snapshot_s),
            _s(f.store_s),
            _s(f.plan_age_s, 1),
            "-" if f.missed is None else str(f.missed),
            str(f.issued),
            str(f.extended),
            str(f.revoked),
            str(f.jobs),
            str(f.gpus_used),
            "-" if f.active_jobs is None else str(f.active_jobs),
            "LATE" if f.late_reasons else "no",
        )
    return table


def summary(record: dict[str, Any]) -> str:
    measured = [r for r in record["rounds"] if r["index"] >= 1]
    late = [r for r in measured if r["late_reasons"]]
    worst = max((r["lateness_s"] for r in measured if r["lateness_s"] is not None), default=None)
    sources: dict[str, int] = {}
    for r in measured:
        sources[r["source"]] = sources.get(r["source"], 0) + 1
    return (
        f"{len(measured)} rounds measured: {len(late)} late; max lateness {_s(worst)} s; "
        f"sources {sources}; CPU s over the run {record['cpu_s']}, wall {record['wall_s']} s"
    )


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        record = run(args)
    except KeyboardInterrupt:
        console.print("[red]interrupted: processes stopped, database dropped")
        return 130
    except RuntimeError as error:
        console.print(f"[bold red]error:[/] {error} (logs in {args.log_dir})")
        return 1
    console.print(
        f"Scale: {record['jobs']} jobs on {record['gpus']} GPUs ({record['nodes']} nodes), "
        f"{record['round_seconds']:g} s rounds, solver limit {record['solver_time_limit_s']:g} s, "
        f"{record['machine']['cpus']} CPUs, Python {record['machine']['python']}",
        highlight=False,
    )
    figures = [
        RoundFigures(**{**r, "late_reasons": tuple(r["late_reasons"])}) for r in record["rounds"]
    ]
    console.print(rounds_table(figures))
    for f in figures:
        if f.late_reasons:
            console.print(f"round {f.index} late: {'; '.join(f.late_reasons)}", highlight=False)
    console.print(summary(record), highlight=False)
    console.print(f"agent requests: {record['agent_requests']}", highlight=False)
    console.print(f"long polls answered, by why: {record['long_polls']}", highlight=False)
    console.print(f"tables per round: {record.get('tables_per_round', {})}", highlight=False)
    console.print(
        f"user GET /v1/jobs: {record['user_jobs_list']}; nodes lost {record['nodes_lost']}; "
        f"API CPU {record['api_cpu_ms_per_node_minute']} ms per node-minute, "
        f"{record['api_cpu_ms_per_job_minute']} ms per job-minute; requests/s "
        f"{record['requests_per_s']}; database per round {record['db_per_round']}",
        highlight=False,
    )
    if record["agent_errors"]:
        console.print(f"agent errors: {record['agent_errors']}", highlight=False)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        console.print(f"Figures written to {args.json}")
    missed = missed_bounds(record, args)
    for line in missed:
        console.print(f"[bold red]bound missed:[/] {line}", highlight=False)
    return 2 if missed else 0


def missed_bounds(record: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What the run missed: a late round (``bench/scale_report.py``), a node declared LOST
    (every simulated agent lives throughout), an agent request kind whose p99 is over
    ``--agent-p99-ms`` (the long polls held on purpose aside), a user's list over
    ``--user-p99-ms`` or failing."""
    missed = []
    measured = [r for r in record["rounds"] if r["index"] >= 1]
    if not measured:
        missed.append("no round measured")
    late = [r["index"] for r in measured if r["late_reasons"]]
    if late:
        missed.append(f"rounds late: {late}")
    if record["nodes_lost"]:
        missed.append(f"{record['nodes_lost']} live nodes declared LOST")
    for kind, figures in record["agent_requests"].items():
        if kind not in record["held_kinds"] and figures["p99_ms"] > args.agent_p99_ms:
            missed.append(f"agent {kind} p99 {figures['p99_ms']} ms > {args.agent_p99_ms:g} ms")
    user = record["user_jobs_list"]
    if not user["count"] or user["errors"]:
        missed.append(f"user GET /v1/jobs: {user['count']} answered, errors {user['errors']}")
    elif user["p99_ms"] > args.user_p99_ms:
        missed.append(f"user GET /v1/jobs p99 {user['p99_ms']} ms > {args.user_p99_ms:g} ms")
    return missed


if __name__ == "__main__":
    sys.exit(main())
