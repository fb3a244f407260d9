"""Throughput and latency of the REST API: submit, list and get jobs under concurrent clients.

Usage::

    python bench/api.py [--duration 10] [--concurrency 16] [--backend postgres|sqlite]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--json OUT]

It creates a throwaway database (Postgres: a new database ``shockwave_bench_<pid>`` made through
``--postgres``; SQLite: a file in a temporary directory), starts one ``shockwave api`` worker on
a free loopback port (which migrates it), creates an admin token with ``shockwave admin
create-token``, then runs three phases of ``--duration`` seconds each with ``--concurrency``
client threads, each with its own keep-alive connection:

- submit: ``POST /v1/jobs`` (a distinct small job per request);
- list: ``GET /v1/jobs?page_size=50`` (the first page, of every job the submit phase made);
- get: ``GET /v1/jobs/{id}`` of random jobs the submit phase made.

For each phase it prints successful requests per second, p50/p99/max latency of the successful
requests, errors (non-2xx answers and transport failures) and the server process's CPU use. The
clients run on the same machine as the server and compete with it for CPU. The server is always
stopped and the throwaway database dropped, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from shockwave_cli.runtime.supervision import (
    Supervised,
    free_port,
    group_cpu_seconds,
    shockwave_argv,
    wait_http,
)

SHOCKWAVE = shockwave_argv(from_cwd=True)
HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 10.0
MAX_CONCURRENCY = 256
MAX_DURATION_S = 300.0
LIST_PAGE_SIZE = 50

console = Console()
if not console.is_terminal:
    console.width = max(console.width, 120)

Call = Callable[[httpx.Client, random.Random, int], httpx.Response]
"""One request of a phase: (client, the worker's rng, request index) -> response."""


@dataclass(slots=True)
class WorkerLog:
    """What one client thread saw: latencies (s) of 2xx answers, errors by kind, job ids."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    job_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PhaseResult:
    """One phase's figures. Rates count successful requests over the phase's wall time."""

    phase: str
    requests: int
    ok: int
    errors: dict[str, int]
    wall_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu_percent: float | None


@contextmanager
def postgres_database(admin_dsn: str, prefix: str = "shockwave_bench") -> Iterator[str]:
    """A new, empty Postgres database for the run (``<prefix>_<pid>``); yields its SQLAlchemy
    URL, drops it after."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        params = conninfo_to_dict(admin_dsn)
        user = params.get("user", "postgres")
        host = params.get("host", HOST)
        port = params.get("port", 5432)
        password = f":{params['password']}" if params.get("password") else ""
        yield f"postgresql+psycopg://{user}{password}@{host}:{port}/{name}"
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="shockwave-bench-") as directory:
        yield f"sqlite:///{Path(directory) / 'shockwave.db'}"


BENCH_BROKER_URL = "redis://127.0.0.1:6379/15"
"""Each submit asks for a plan, as in the service (one Redis send per job); a Redis database of
the benchmark's own takes those messages, and it is emptied afterwards so no worker sees them."""


@contextmanager
def api_server(database_url: str, port: int, log: Path) -> Iterator[Supervised]:
    """``shockwave api`` (one uvicorn worker, migrating first) until the block ends; always
    stopped: SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env["SHOCKWAVE_DATABASE_URL"] = database_url
    env["SHOCKWAVE_BROKER_URL"] = BENCH_BROKER_URL
    argv = [*SHOCKWAVE, "api", "--host", HOST, "--port", str(port), "--log-level", "warning"]
    server = Supervised("the API", argv, env, log, grace_s=STOP_TIMEOUT_S).start()
    try:
        yield server
    finally:
        server.stop()
        redis.Redis.from_url(BENCH_BROKER_URL).flushdb()


def wait_ready(base_url: str, process: Supervised, timeout_s: float = START_TIMEOUT_S) -> None:
    """Return once ``base_url``/readyz answers 200; :class:`NotReady`, with the end of the
    process's log, if it exits first or ``timeout_s`` passes."""
    wait_http(f"{base_url}/readyz", process, timeout_s)


def admin_token(database_url: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env["SHOCKWAVE_DATABASE_URL"] = database_url
    made = subprocess.run(
        [*SHOCKWAVE, "admin", "create-token", "--role", "admin", "--name", "bench"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if made.returncode != 0:
        raise RuntimeError(f"shockwave admin create-token failed: {made.stderr.strip()}")
    return made.stdout.strip()


def run_phase(
    name: str,
    call: Call,
    *,
    base_url: str,
    token: str,
    concurrency: int,
    duration_s: float,
    server_pid: int,
    stop: threading.Event,
) -> tuple[PhaseResult, list[str]]:
    """``concurrency`` threads call ``call`` back to back for ``duration_s`` seconds."""
    deadline = time.perf_counter() + duration_s

    def worker(index: int) -> WorkerLog:
        log = WorkerLog()
        rng = random.Random(index)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=REQUEST_TIMEOUT_S) as http:
            count = 0
            while not stop.is_set() and time.perf_counter() < deadline:
                count += 1
                started = time.perf_counter()
                try:
                    response = call(http, rng, index * 1_000_000 + count)
                except httpx.TransportError as error:
                    log.errors[type(error).__name__] += 1
                    continue
                elapsed = time.perf_counter() - started
                if response.is_success:
                    log.latencies.append(elapsed)
                    if response.status_code == 201:
                        log.job_ids.append(response.json()["id"])
                else:
                    log.errors[f"HTTP {response.status_code}"] += 1
        return log

    cpu_before = group_cpu_seconds([server_pid])[server_pid]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=name) as pool:
        try:
            logs = list(pool.map(worker, range(concurrency)))
        except BaseException:
            stop.set()
            raise
    wall = time.perf_counter() - started
    cpu_after = group_cpu_seconds([server_pid])[server_pid]
    latencies = sorted(x for log in logs for x in log.latencies)
    errors: Counter[str] = Counter()
    for log in logs:
        errors.update(log.errors)
    cpu = 100.0 * (cpu_after - cpu_before) / wall
    result = PhaseResult(
        phase=name,
        requests=len(latencies) + sum(errors.values()),
        ok=len(latencies),
        errors=dict(errors),
        wall_s=wall,
        requests_per_s=len(latencies) / wall,
        p50_ms=1000 * quantile(latencies, 0.50),
        p99_ms=1000 * quantile(latencies, 0.99),
        max_ms=1000 * (latencies[-1] if latencies else float("nan")),
        server_cpu_percent=cpu,
    )
    return result, [job_id for log in logs for job_id in log.job_ids]


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank), NaN when there are none."""
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def submit(http: httpx.Client, rng: random.Random, index: int) -> httpx.Response:
    body = {
        "name": f"bench-{index}",
        "gpus": rng.choice((1, 2, 4)),
        "epochs": rng.randint(5, 50),
        "samples_per_epoch": 50_000,
        "initial_batch_size": 64,
        "mode": "static",
    }
    return http.post("/v1/jobs", json=body)


def list_first_page(http: httpx.Client, rng: random.Random, index: int) -> httpx.Response:
    return http.get("/v1/jobs", params={"page_size": LIST_PAGE_SIZE})


def getter(job_ids: Sequence[str]) -> Call:
    def get(http: httpx.Client, rng: random.Random, index: int) -> httpx.Response:
        return http.get(f"/v1/jobs/{rng.choice(job_ids)}")

    return get


def results_table(results: Sequence[PhaseResult]) -> Table:
    table = Table()
    for column in ("phase", "requests", "errors", "req/s", "p50 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    table.add_column("server CPU", justify="right")
    for r in results:
        table.add_row(
            r.phase,
            f"{r.requests:,}",
            f"{sum(r.errors.values()):,}",
            f"{r.requests_per_s:,.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.max_ms:.1f}",
            "" if r.server_cpu_percent is None else f"{r.server_cpu_percent:.0f}%",
        )
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="client threads")
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="an existing database to connect to while creating and dropping the bench database",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        parser.error(f"--concurrency must be between 1 and {MAX_CONCURRENCY}")
    if not 0.5 <= args.duration <= MAX_DURATION_S:
        parser.error(f"--duration must be between 0.5 and {MAX_DURATION_S:g} seconds")
    return args


def _terminate(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so the server is stopped and the database dropped."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    database = postgres_database(args.postgres) if args.backend == "postgres" else sqlite_database()
    stop = threading.Event()
    port = free_port()
    base_url = f"http://{HOST}:{port}"
    results: list[PhaseResult] = []
    try:
        with (
            database as database_url,
            tempfile.TemporaryDirectory(prefix="shockwave-bench-log-") as logs,
        ):
            log = Path(logs) / "api.log"
            with api_server(database_url, port, log) as server:
                wait_ready(base_url, server)
                token = admin_token(database_url)
                common: dict[str, Any] = {
                    "base_url": base_url,
                    "token": token,
                    "concurrency": args.concurrency,
                    "duration_s": args.duration,
                    "server_pid": server.pid,
                    "stop": stop,
                }
                submitted, job_ids = run_phase("submit", submit, **common)
                results.append(submitted)
                if not job_ids:
                    raise RuntimeError(f"the submit phase created no job: {submitted.errors}")
                results.append(run_phase("list", list_first_page, **common)[0])
                results.append(run_phase("get", getter(job_ids), **common)[0])
    except KeyboardInterrupt:
        stop.set()
        console.print("[red]interrupted: the API was stopped and the bench database dropped")
        return 130
    except RuntimeError as error:
        console.print(f"[bold red]error:[/] {error}")
        return 1
    finally:
        stop.set()
    title = (
        f"Shockwave API on {args.backend}, 1 uvicorn worker, {args.concurrency} "
        f"client{'s' if args.concurrency != 1 else ''}, "
        f"{args.duration:g} s per phase ({os.cpu_count()} CPUs, Python "
        f"{platform.python_version()})"
    )
    console.print(title, soft_wrap=True, highlight=False)
    console.print(results_table(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "backend": args.backend,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "phases": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        console.print(f"Figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
