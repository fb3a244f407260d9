"""Load test of the REST API: simulated node agents polling, job submissions and event
posts against several API processes on one Postgres database.

Usage (from the project root)::

    .venv/bin/python -m bench.load [--duration 300] [--agents 256] [--interval 2]
        [--submit-rate 5] [--event-rate 5] [--apis 2] [--round-seconds 60]
        [--solver none|inline] [--no-driver] [--procs 2] [--json OUT]

What runs (see docs/reliability.md, "Load"):

- a throwaway Postgres database (``shockwave_load_<pid>``, made through ``--postgres``, migrated
  here, dropped at the end) holding one admin token, one user token (tenant ``load``) and one
  agent token per simulated node;
- ``--apis`` processes of ``shockwave api`` (one uvicorn worker each) on free loopback ports;
  their plan requests go to a Redis database of the test's own (``--broker``), emptied after;
- unless ``--no-driver``, one ``shockwave driver`` (rounds of ``--round-seconds``), started once
  the agents have registered, so leases really exist, are extended and revoked. With ``--solver
  none`` no solver consumes the plan requests and every round comes from the driver's greedy
  fallback; ``--solver inline`` plans inside the driver process;
- ``--procs`` load-generator processes (uvloop + shockwave_fleet/wire.py's lean keep-alive client:
  httpx cost the generator more CPU than the servers spent) sharing the work:
  ``--agents`` agents, each doing what agent/loop.py does per contact, one ``--interval``
  (+-10 % jitter) after its previous contact began: one ``POST /v1/agent/poll`` (the reports
  owed, a heartbeat, the attempts it runs, job tokens for new leases), then start what is new,
  note extensions, report ``checkpointed`` when a lease goes, and, when that started something
  or owes reports, a second poll at once (no heartbeat; it acknowledges the new attempts); a
  simulated job exits 0 after 60-180 s of running. Plus
  open-loop job submissions (user token, ``Idempotency-Key``) and progress events (the job's own
  token, on jobs this process's agents run) at fixed rates.

Figures count only requests started in the measured window (after ``--warmup``): per endpoint,
successful requests per second, p50/p95/p99/max latency of the successful ones, errors (any
non-2xx answer or transport failure). The generator shares the machine with the servers, so it
also reports its own lag: how late each scheduled action started (an overloaded generator
would flatter the server by sending less), and the CPU of every process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import redis
import uvloop
from rich.console import Console
from rich.table import Table

from bench.api import SHOCKWAVE, postgres_database, quantile
from shockwave_cli.runtime.supervision import Supervised, free_port, group_cpu_seconds, wait_http
from shockwave_fleet import wire

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 120.0
"""Two API processes importing at once on a busy 2-core machine take a while."""
JITTER = 0.1
"""Each agent contact starts within +-10 % of its interval of the due time."""
JOB_RUN_S = (60.0, 180.0)
NODE_GPUS = 8
NODE_TTL_S = 30.0
LOOP_TICK_S = 0.05

console = Console()
if not console.is_terminal:
    console.width = max(console.width, 120)


# --- what a generator process is given and gives back ---------------------------------------


@dataclass(frozen=True, slots=True)
class Shard:
    """One generator process's share: ``agents`` as (node, token) pairs, the rates (per
    second) of its submissions and events, and the wall-clock times (``time.time()``) it
    starts, starts measuring and stops."""

    index: int
    apis: tuple[str, ...]
    agents: tuple[tuple[str, str], ...]
    user_token: str
    submit_rate: float
    event_rate: float
    interval_s: float
    start_at: float
    measure_at: float
    end_at: float
    seed: int


@dataclass(slots=True)
class ShardLog:
    """What one generator process saw. ``samples[endpoint]``: (start, seconds, error or "")
    per request, start relative to ``measure_at``; ``lag``: seconds each scheduled action
    started late (measured window only); ``cpu_s``: the process's CPU seconds in the window."""

    samples: dict[str, list[tuple[float, float, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    lag: list[float] = field(default_factory=list)
    loop_lag: list[float] = field(default_factory=list)
    skipped_events: int = 0
    cpu_s: float = 0.0
    leases_started: int = 0
    jobs_finished: int = 0


# --- one simulated agent ---------------------------------------------------------------------


@dataclass(slots=True)
class Attempt:
    """A lease the simulated agent runs: its job, lease end, job token, and when the simulated
    process exits 0. ``seq``: the job's last progress event; ``exiting``: no more events."""

    job_id: str
    ends_at: str
    token: str
    exits_at: float
    epochs: int
    seq: int = 0
    exiting: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sends a request, and to which API: one keep-alive client per API process is shared
    by every caller of a generator process (creating a client per caller would cost the
    generator more CPU than its requests); each caller sends its own token."""

    http: wire.Client
    headers: dict[str, str]


class Generator:
    """The requests of one shard: agents, submissions and events, on one asyncio loop."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.log = ShardLog()
        self.rng = random.Random(shard.seed)
        self.attempts: dict[str, Attempt] = {}
        """Every attempt any of this shard's agents runs, by attempt id (for the events)."""
        self.epochs: dict[str, int] = {}
        self.clients = [wire.Client(api, REQUEST_TIMEOUT_S) for api in shard.apis]

    def caller(self, index: int, token: str) -> Caller:
        """The ``index``-th caller's connection (callers are spread over the APIs)."""
        http = self.clients[index % len(self.clients)]
        return Caller(http, {"Authorization": f"Bearer {token}"})

    async def call(
        self, caller: Caller, endpoint: str, method: str, path: str, **kwargs: Any
    ) -> wire.Response | None:
        """One request, timed and recorded; the response if it was a 2xx, else None. None,
        unsent and unrecorded, once the run is over (a stalled server would otherwise keep a
        contact's chain of requests going for minutes)."""
        started = time.time()
        if started >= self.shard.end_at:
            return None
        clock = time.perf_counter()
        error = ""
        response = None
        headers = {**caller.headers, **kwargs.pop("headers", {})}
        try:
            response = await caller.http.request(method, path, headers=headers, **kwargs)
            if not response.is_success:
                error = f"HTTP {response.status_code}"
        except wire.TransportError as failure:
            error = type(failure).__name__
        elapsed = time.perf_counter() - clock
        self.log.samples[endpoint].append((started - self.shard.measure_at, elapsed, error))
        return response if not error else None

    def late(self, due: float) -> None:
        now = time.time()
        if now >= self.shard.measure_at:
            self.log.lag.append(max(0.0, now - due))

    async def sleep_until(self, due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.time()))

    async def run(self) -> ShardLog:
        shard = self.shard
        tasks = [
            asyncio.create_task(self.agent(i, node, token))
            for i, (node, token) in enumerate(shard.agents)
        ]
        tasks.append(asyncio.create_task(self.submitter()))
        tasks.append(asyncio.create_task(self.event_poster()))
        tasks.append(asyncio.create_task(self.loop_monitor()))
        await self.sleep_until(shard.measure_at)
        cpu_before = time.process_time()
        await asyncio.gather(*tasks)
        self.log.cpu_s = time.process_time() - cpu_before
        for http in self.clients:
            await http.aclose()
        return self.log

    async def loop_monitor(self) -> None:
        """How late a 50 ms sleep wakes up: the event loop's own lag (the generator's CPU)."""
        while time.time() < self.shard.end_at:
            due = time.time() + LOOP_TICK_S
            await asyncio.sleep(LOOP_TICK_S)
            if due >= self.shard.measure_at:
                self.log.loop_lag.append(max(0.0, time.time() - due))

    # - agents -

    async def agent(self, index: int, node: str, token: str) -> None:
        """Register at a random moment of the first interval, then contact every interval."""
        shard = self.shard
        http = self.caller(index + shard.index, token)
        outbox: list[tuple[str, dict[str, Any]]] = []
        mine: dict[str, Attempt] = {}
        finished: set[str] = set()
        due = shard.start_at + self.rng.uniform(0, shard.interval_s)
        await self.sleep_until(due)
        body = {"gpus": NODE_GPUS, "gpu_type": "sim", "hostname": node}
        while await self.call(http, "register", "POST", "/v1/agent/register", json=body) is None:
            due += shard.interval_s
            if due >= shard.end_at:
                return
            await self.sleep_until(due)
        began = time.time()
        while True:
            # As agent/loop.py: the next contact is one interval after this one began (at
            # once if this one took longer); a late agent does not send the contacts it missed.
            spread = JITTER * shard.interval_s
            due = began + shard.interval_s + self.rng.uniform(-spread, spread)
            if due >= shard.end_at:
                return
            await self.sleep_until(due)
            self.late(due)
            began = time.time()
            await self.contact(http, mine, outbox, finished)

    async def contact(
        self,
        http: Caller,
        mine: dict[str, Attempt],
        outbox: list[tuple[str, dict[str, Any]]],
        finished: set[str],
    ) -> None:
        """agent/loop.py's exchange: one poll (reports owed, heartbeat, leases, what runs),
        reconcile, and a second poll without heartbeat when that started something or owes
        reports (it acknowledges the new attempts: they are RUNNING once it answers)."""
        await self.exits(mine, outbox, finished)
        poll = await self.poll(http, mine, outbox, heartbeat=True, tokens=True)
        if poll is None:
            return
        leases = {lease["attempt_id"]: lease for lease in poll["leases"]}
        stop = set(poll["stop"])
        for attempt_id, attempt in list(mine.items()):
            lease = leases.get(attempt_id)
            if attempt_id in stop or lease is None:
                await self.forget(attempt_id, mine, finished)
                outbox.append((attempt_id, {"state": "checkpointed"}))
            elif lease["ends_at"] != attempt.ends_at:
                attempt.ends_at = lease["ends_at"]
        started = 0
        tokens: dict[str, str] = poll["tokens"]
        for attempt_id, lease in leases.items():
            if attempt_id in mine or attempt_id in stop or attempt_id in finished:
                continue
            started += await self.start(http, lease, tokens.get(attempt_id), mine, finished)
        if started or outbox:
            await self.poll(http, mine, outbox, heartbeat=False, tokens=False)

    async def poll(
        self,
        http: Caller,
        mine: dict[str, Attempt],
        outbox: list[tuple[str, dict[str, Any]]],
        heartbeat: bool,
        tokens: bool,
    ) -> dict[str, Any] | None:
        """``POST /v1/agent/poll`` with the reports owed (delivered once it answers) and the
        attempts this agent runs; the answer, None if it failed (the reports wait)."""
        reports = [{"attempt_id": attempt_id, **body} for attempt_id, body in outbox]
        running = sorted(mine)
        body = {"heartbeat": heartbeat, "tokens": tokens, "reports": reports, "running": running}
        name = "poll" if heartbeat else "poll ack"
        answer = await self.call(http, name, "POST", "/v1/agent/poll", json=body)
        if answer is None:
            return None
        outbox.clear()
        poll: dict[str, Any] = answer.json()
        return poll

    async def start(
        self,
        http: Caller,
        lease: dict[str, Any],
        token: str | None,
        mine: dict[str, Attempt],
        finished: set[str],
    ) -> int:
        """Start a new lease's simulated process with its job token (the poll's, else one
        asked for): 1 if it started."""
        attempt_id = str(lease["attempt_id"])
        if token is None:
            path = f"/v1/agent/leases/{attempt_id}/token"
            answer = await self.call(http, "token", "POST", path)
            if answer is None:
                finished.add(attempt_id)
                return 0
            token = str(answer.json()["token"])
        job_id = str(lease["job_id"])
        attempt = Attempt(
            job_id=job_id,
            ends_at=str(lease["ends_at"]),
            token=token,
            exits_at=time.time() + self.rng.uniform(*JOB_RUN_S),
            epochs=self.epochs.get(job_id, 0),
        )
        mine[attempt_id] = attempt
        self.attempts[attempt_id] = attempt
        self.log.leases_started += 1
        return 1

    async def exits(
        self,
        mine: dict[str, Attempt],
        outbox: list[tuple[str, dict[str, Any]]],
        finished: set[str],
    ) -> None:
        """The simulated processes whose time is up exit 0 (their jobs succeed)."""
        now = time.time()
        for attempt_id, attempt in list(mine.items()):
            if attempt.exits_at <= now:
                await self.forget(attempt_id, mine, finished)
                outbox.append((attempt_id, {"state": "exited", "exit_code": 0}))
                self.log.jobs_finished += 1

    async def forget(self, attempt_id: str, mine: dict[str, Attempt], finished: set[str]) -> None:
        """Stop posting the attempt's events (after any in flight: an event after the job
        finished would be a 409 the test made itself)."""
        attempt = mine.pop(attempt_id)
        async with attempt.lock:
            attempt.exiting = True
        self.attempts.pop(attempt_id, None)
        finished.add(attempt_id)

    # - submissions and events -

    async def submitter(self) -> None:
        """Open loop: one submission every 1/rate seconds, each in a task of its own."""
        shard = self.shard
        if shard.submit_rate <= 0:
            return
        clients = [self.caller(i, shard.user_token) for i in range(len(shard.apis))]
        tasks: set[asyncio.Task[None]] = set()
        count = 0
        due = shard.start_at + self.rng.uniform(0, 1 / shard.submit_rate)
        while due < shard.end_at:
            await self.sleep_until(due)
            self.late(due)
            task = asyncio.create_task(self.submit(clients[count % len(clients)], count))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            count += 1
            due += 1 / shard.submit_rate
        await asyncio.gather(*tasks)

    async def submit(self, http: Caller, count: int) -> None:
        epochs = self.rng.randint(50, 200)
        body = {
            "name": f"load-{self.shard.index}-{count}",
            "gpus": self.rng.choice((1, 1, 2, 4)),
            "epochs": epochs,
            "samples_per_epoch": 50_000,
            "initial_batch_size": 64,
            "mode": "static",
            "command": ["python", "train.py"],
        }
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        answer = await self.call(http, "submit", "POST", "/v1/jobs", json=body, headers=headers)
        if answer is not None:
            self.epochs[str(answer.json()["id"])] = epochs

    async def event_poster(self) -> None:
        """Open loop: one progress event every 1/rate seconds, from a random job that this
        shard's agents run, with that job's token (as the training SDK posts them)."""
        shard = self.shard
        if shard.event_rate <= 0:
            return
        clients: dict[str, Caller] = {}
        tasks: set[asyncio.Task[None]] = set()
        due = shard.start_at + self.rng.uniform(0, 1 / shard.event_rate)
        while due < shard.end_at:
            await self.sleep_until(due)
            self.late(due)
            ready = [a for a in self.attempts.values() if not a.exiting and a.seq < a.epochs]
            if ready:
                attempt = self.rng.choice(ready)
                if attempt.token not in clients:
                    clients[attempt.token] = self.caller(len(clients), attempt.token)
                task = asyncio.create_task(self.post_event(clients[attempt.token], attempt))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            elif time.time() >= shard.measure_at:
                self.log.skipped_events += 1
            due += 1 / shard.event_rate
        await asyncio.gather(*tasks)

    async def post_event(self, http: Caller, attempt: Attempt) -> None:
        async with attempt.lock:
            if attempt.exiting or attempt.seq >= attempt.epochs:
                return
            attempt.seq += 1
            body = {
                "seq": attempt.seq,
                "kind": "progress",
                "epoch": attempt.seq,
                "samples": 50_000,
                "seconds": 10.0,
                "batch_size": 64,
            }
            path = f"/v1/jobs/{attempt.job_id}/events"
            await self.call(http, "event", "POST", path, json=body)


def booted(_: int) -> int:
    """A no-op that holds its worker briefly, so that every worker has started (imported this
    module) before the clock of the run starts."""
    time.sleep(0.5)
    return os.getpid()


def run_shard(shard: Shard) -> ShardLog:
    """A generator process's entry point (picklable results only)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = uvloop.run(Generator(shard).run())
    log.samples = dict(log.samples)
    return log


# --- the system under test -------------------------------------------------------------------


def service_env(
    database_url: str, broker_url: str, tree: Path | None, **extra: str
) -> dict[str, str]:
    """The services' environment: ``tree``, when given, is a copy of the project whose code
    the services run instead of this one (before/after comparisons in one session)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env.update(SHOCKWAVE_DATABASE_URL=database_url, SHOCKWAVE_BROKER_URL=broker_url, **extra)
    if tree is not None:
        env["PYTHONPATH"] = str(tree.resolve())
    return env


@dataclass(frozen=True, slots=True)
class Tokens:
    user: str
    agents: tuple[tuple[str, str], ...]


def prepare(database_url: str, agents: int) -> Tokens:
    """Migrate the database and store the tokens (straight in the database, as ``shockwave
    admin create-token`` does)."""
    from sqlmodel import Session

    from bench.deployment import HARNESS_GPUS
    from store.cluster import approve_node
    from store.db import make_engine
    from store.migrate import upgrade
    from store.principals import Role
    from store.tokens import create_token

    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            user = create_token(session, Role.USER, tenant="load", name="load")
            nodes = tuple(
                (f"node-{i:03d}", create_token(session, Role.AGENT, node=f"node-{i:03d}"))
                for i in range(agents)
            )
            for name, _ in nodes:
                approve_node(session, name, HARNESS_GPUS)
            session.commit()
    finally:
        engine.dispose()
    return Tokens(user=user, agents=nodes)


@contextmanager
def started(
    name: str, argv: Sequence[str], env: dict[str, str], logs: Path, cwd: Path | None
) -> Iterator[Supervised]:
    """``argv`` running (in ``cwd``) until the block ends (SIGTERM, then SIGKILL)."""
    service = Supervised(name, argv, env, logs / f"{name}.log", cwd, STOP_TIMEOUT_S).start()
    try:
        yield service
    finally:
        service.stop()


def wait_ready(base_url: str, service: Supervised) -> None:
    wait_http(f"{base_url}/readyz", service, START_TIMEOUT_S)


def api_argv(port: int, extra: Sequence[str]) -> list[str]:
    return [
        *SHOCKWAVE,
        "api",
        "--host",
        HOST,
        "--port",
        str(port),
        "--no-migrate",
        "--log-level",
        "warning",
        *extra,
    ]


# --- figures ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EndpointFigures:
    """One endpoint's figures over the measured window (latencies of 2xx answers, in ms)."""

    endpoint: str
    requests: int
    ok: int
    errors: dict[str, int]
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


def figures(
    name: str, samples: Sequence[tuple[float, float, str]], window_s: float
) -> EndpointFigures:
    inside = [s for s in samples if 0.0 <= s[0] < window_s]
    latencies = sorted(seconds for _, seconds, error in inside if not error)
    errors = Counter(error for _, _, error in inside if error)
    return EndpointFigures(
        endpoint=name,
        requests=len(inside),
        ok=len(latencies),
        errors=dict(errors),
        requests_per_s=len(latencies) / window_s,
        p50_ms=1000 * quantile(latencies, 0.50),
        p95_ms=1000 * quantile(latencies, 0.95),
        p99_ms=1000 * quantile(latencies, 0.99),
        max_ms=1000 * (latencies[-1] if latencies else float("nan")),
    )


ENDPOINTS = ("register", "poll", "poll ack", "token", "submit", "event")
"""``poll ack``: the second poll of a contact that started something or owes reports."""


def summarize(logs: Sequence[ShardLog], window_s: float) -> list[EndpointFigures]:
    merged: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for log in logs:
        for name, samples in log.samples.items():
            merged[name].extend(samples)
    rows = [figures(name, merged[name], window_s) for name in ENDPOINTS]
    everything = [s for name in ENDPOINTS for s in merged[name]]
    rows.append(figures("all", everything, window_s))
    return rows


def timeline(logs: Sequence[ShardLog], window_s: float) -> list[dict[str, float]]:
    """Per second of the window (by start time), every endpoint together: requests, errors,
    p99 and max latency of the successful ones: when the slow requests happened (a round
    boundary, a checkpoint of the database), which the whole-window figures hide."""
    seconds: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for log in logs:
        for samples in log.samples.values():
            for start, elapsed, error in samples:
                if 0.0 <= start < window_s:
                    seconds[int(start)].append((elapsed, error))
    rows = []
    for second in sorted(seconds):
        latencies = sorted(elapsed for elapsed, error in seconds[second] if not error)
        rows.append(
            {
                "second": float(second),
                "requests": float(len(seconds[second])),
                "errors": float(sum(1 for _, error in seconds[second] if error)),
                "p99_ms": 1000 * quantile(latencies, 0.99),
                "max_ms": 1000 * (latencies[-1] if latencies else float("nan")),
            }
        )
    return rows


def figures_table(rows: Sequence[EndpointFigures]) -> Table:
    table = Table()
    columns = ("endpoint", "requests", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms", "max ms")
    for column in columns:
        table.add_column(column, justify="left" if column == "endpoint" else "right")
    for r in rows:
        table.add_row(
            r.endpoint,
            f"{r.requests:,}",
            f"{sum(r.errors.values()):,}" + (f" {r.errors}" if r.errors else ""),
            f"{r.requests_per_s:,.1f}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.max_ms:.1f}",
        )
    return table


def machine_busy() -> tuple[float, float]:
    """(busy jiffies, total jiffies) of the whole machine so far (Linux /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


# --- the run ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=300.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring")
    parser.add_argument("--agents", type=int, default=256, help="simulated node agents")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between contacts")
    parser.add_argument("--submit-rate", type=float, default=5.0, help="job submissions per s")
    parser.add_argument("--event-rate", type=float, default=5.0, help="progress events per s")
    parser.add_argument("--apis", type=int, default=2, help="API processes to start")
    parser.add_argument("--round-seconds", type=float, default=60.0, help="round length")
    parser.add_argument("--no-driver", action="store_true", help="no round driver (no leases)")
    parser.add_argument("--solver", choices=("none", "inline"), default="none")
    parser.add_argument("--procs", type=int, default=2, help="load-generator processes")
    parser.add_argument(
        "--api-arg",
        action="append",
        default=[],
        help="an extra argument for every `shockwave api` (repeatable)",
    )
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="an existing database to connect to while creating and dropping the load database",
    )
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/14")
    parser.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run the API and driver from this copy of the project (a before/after baseline)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy service logs here")
    args = parser.parse_args(argv)
    if not 1 <= args.agents <= 4096 or not 1 <= args.procs <= 16 or not 1 <= args.apis <= 8:
        parser.error("--agents 1-4096, --procs 1-16, --apis 1-8")
    if args.duration < 1 or args.interval <= 0.05:
        parser.error("--duration must be >= 1 s and --interval > 0.05 s")
    return args


def _terminate(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so the services are stopped and the database dropped."""
    raise KeyboardInterrupt


def shards(args: argparse.Namespace, apis: Sequence[str], tokens: Tokens, t0: float) -> list[Shard]:
    measure_at = t0 + args.warmup
    return [
        Shard(
            index=i,
            apis=tuple(apis),
            agents=tokens.agents[i :: args.procs],
            user_token=tokens.user,
            submit_rate=args.submit_rate / args.procs,
            event_rate=args.event_rate / args.procs,
            interval_s=args.interval,
            start_at=t0,
            measure_at=measure_at,
            end_at=measure_at + args.duration,
            seed=i,
        )
        for i in range(args.procs)
    ]


def run(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Bring the system up, run the load, bring it down; the figures as a JSON-able dict."""
    with ExitStack() as stack:
        database_url = stack.enter_context(postgres_database(args.postgres, "shockwave_load"))
        stack.callback(lambda: redis.Redis.from_url(args.broker).flushdb())
        tokens = prepare(database_url, args.agents)
        env = service_env(database_url, args.broker, args.tree)
        apis: list[str] = []
        servers: list[Supervised] = []
        for i in range(args.apis):
            port = free_port()
            argv = api_argv(port, args.api_arg)
            servers.append(stack.enter_context(started(f"api-{i}", argv, env, logs, args.tree)))
            apis.append(f"http://{HOST}:{port}")
        for base, server in zip(apis, servers, strict=True):
            wait_ready(base, server)
        context = multiprocessing.get_context("spawn")
        pool = stack.enter_context(context.Pool(args.procs))
        pool.map(booted, range(args.procs), chunksize=1)
        t0 = time.time() + 1.0
        plan = shards(args, apis, tokens, t0)
        pending = pool.map_async(run_shard, plan)
        driver: Supervised | None = None
        if not args.no_driver:
            time.sleep(max(0.0, t0 + args.interval + 1.0 - time.time()))
            mode = "inline" if args.solver == "inline" else "celery"
            driver_env = service_env(
                database_url, args.broker, args.tree, SHOCKWAVE_SOLVER_MODE=mode
            )
            argv = [
                *SHOCKWAVE,
                "driver",
                "--round-seconds",
                str(args.round_seconds),
                "--node-ttl",
                str(NODE_TTL_S),
                "--log-level",
                "info",
            ]
            driver = stack.enter_context(started("driver", argv, driver_env, logs, args.tree))
        measure_at = plan[0].measure_at
        time.sleep(max(0.0, measure_at - time.time()))
        watched = {s.name: s.pid for s in [*servers, *([driver] if driver else [])]}
        cpu_before = group_cpu_seconds(watched.values())
        busy_before = machine_busy()
        load_before = os.getloadavg()
        time.sleep(max(0.0, plan[0].end_at - time.time()))
        cpu_after = group_cpu_seconds(watched.values())
        busy_after = machine_busy()
        shard_logs: list[ShardLog] = pending.get(timeout=args.duration + REQUEST_TIMEOUT_S + 120)
        rounds = count_rounds(database_url)
        window = args.duration
        cpu = {
            name: 100.0 * (cpu_after[pid] - cpu_before[pid]) / window
            for name, pid in watched.items()
        }
        cpu["generator"] = 100.0 * sum(log.cpu_s for log in shard_logs) / window
        lag = sorted(x for log in shard_logs for x in log.lag)
        loop_lag = sorted(x for log in shard_logs for x in log.loop_lag)
        busy = (busy_after[0] - busy_before[0]) / max(1.0, busy_after[1] - busy_before[1])
        return {
            "endpoints": [asdict(r) for r in summarize(shard_logs, window)],
            "timeline": timeline(shard_logs, window),
            "generator_lag_ms": {
                "p50": 1000 * quantile(lag, 0.5),
                "p99": 1000 * quantile(lag, 0.99),
                "max": 1000 * (lag[-1] if lag else float("nan")),
                "over_100ms": sum(1 for x in lag if x > 0.1),
                "actions": len(lag),
            },
            "generator_loop_lag_ms": {
                "p50": 1000 * quantile(loop_lag, 0.5),
                "p99": 1000 * quantile(loop_lag, 0.99),
                "max": 1000 * (loop_lag[-1] if loop_lag else float("nan")),
            },
            "cpu_percent": cpu,
            "machine_busy_percent": 100.0 * busy,
            "loadavg_1m_before": load_before[0],
            "loadavg_1m_after": os.getloadavg()[0],
            "leases_started": sum(log.leases_started for log in shard_logs),
            "jobs_finished": sum(log.jobs_finished for log in shard_logs),
            "skipped_events": sum(log.skipped_events for log in shard_logs),
            "rounds": rounds,
        }
    raise AssertionError("unreachable")


def count_rounds(database_url: str) -> dict[str, int]:
    """Rounds by source and jobs by state at the end (is the load realistic?)."""
    from sqlalchemy import text

    from store.db import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            rounds = connection.execute(text("SELECT source, count(*) FROM rounds GROUP BY 1"))
            out = {f"rounds_{source}": int(n) for source, n in rounds}
            jobs = connection.execute(text("SELECT state, count(*) FROM jobs GROUP BY 1"))
            out.update({f"jobs_{state.lower()}": int(n) for state, n in jobs})
            return out
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        with tempfile.TemporaryDirectory(prefix="shockwave-load-") as logs:
            try:
                record = run(args, Path(logs))
            finally:
                if args.keep_logs is not None:
                    args.keep_logs.mkdir(parents=True, exist_ok=True)
                    for log in Path(logs).iterdir():
                        (args.keep_logs / log.name).write_bytes(log.read_bytes())
    except KeyboardInterrupt:
        console.print("[red]interrupted: the services were stopped and the database dropped")
        return 130
    record.update(
        agents=args.agents,
        interval_s=args.interval,
        submit_rate=args.submit_rate,
        event_rate=args.event_rate,
        apis=args.apis,
        api_args=args.api_arg,
        tree=str(args.tree) if args.tree else None,
        driver=not args.no_driver,
        solver=args.solver,
        round_seconds=args.round_seconds,
        procs=args.procs,
        duration_s=args.duration,
        warmup_s=args.warmup,
        cpus=os.cpu_count(),
        python=platform.python_version(),
    )
    report(record)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        console.print(f"Figures written to {args.json}")
    return 0


def report(record: dict[str, Any]) -> None:
    console.print(
        f"{record['agents']} agents every {record['interval_s']:g} s, "
        f"{record['submit_rate']:g} submits/s, {record['event_rate']:g} events/s, "
        f"{record['apis']} API processes, driver "
        f"{'on (solver ' + record['solver'] + ')' if record['driver'] else 'off'}, "
        f"{record['duration_s']:g} s measured ({record['cpus']} CPUs)",
        soft_wrap=True,
        highlight=False,
    )
    console.print(figures_table([EndpointFigures(**r) for r in record["endpoints"]]))
    lag = record["generator_lag_ms"]
    loop = record["generator_loop_lag_ms"]
    cpu = ", ".join(f"{k} {v:.0f}%" for k, v in record["cpu_percent"].items())
    console.print(
        f"generator lag: p50 {lag['p50']:.1f} ms, p99 {lag['p99']:.1f} ms, max {lag['max']:.0f} "
        f"ms, {lag['over_100ms']} of {lag['actions']} actions > 100 ms late; event loop lag "
        f"p50 {loop['p50']:.1f} ms, p99 {loop['p99']:.1f} ms, max {loop['max']:.0f} ms\n"
        f"CPU (of one core): {cpu}; machine busy {record['machine_busy_percent']:.0f}%, "
        f"load avg {record['loadavg_1m_before']:.1f} -> {record['loadavg_1m_after']:.1f}\n"
        f"leases started {record['leases_started']}, jobs finished {record['jobs_finished']}, "
        f"events skipped (no running job) {record['skipped_events']}, {record['rounds']}",
        highlight=False,
    )
    worst = sorted(record["timeline"], key=lambda row: -row["p99_ms"])[:5]
    slow = ", ".join(f"{row['second']:.0f} s: {row['p99_ms']:.0f} ms" for row in worst)
    console.print(f"slowest seconds of the window (p99): {slow}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())
