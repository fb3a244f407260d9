"""The distributed deployment, assembled from real processes for one test.

:func:`deployment` gives a migrated throwaway Postgres database, the environment every process
shares (database, broker, ``celery`` solver mode), an admin token, and a :class:`Services`
registry that stops every process it started. Tests then start the API, solver workers and round
drivers they need, register :class:`~tests.e2e.agents.SimulatedAgent` nodes, and read the
outcome from the database with the helpers below.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from store import migrate
from store.tables import JobRow, LeaseRow, PlanRow, RoundRow
from tests.e2e.agents import Fleet, Job, SimulatedAgent
from tests.e2e.processes import (
    REDIS_URL,
    Services,
    database_engine,
    free_port,
    require_shared_redis,
    shockwave_command,
    throwaway_database,
)

ROUND_SECONDS = 2.0
SOLVER_TIME_LIMIT_S = 5.0
RECORDING_WORKER = "tests.e2e.recording_worker"


@dataclass
class Deployment:
    database_url: str
    engine: Engine
    env: dict[str, str]
    services: Services
    admin_token: str
    log_dir: Path

    def api(self, name: str = "api", *, port: int | None = None) -> str:
        """Start an API process (on ``port``, default a free one); its base URL."""
        return self.services.api(name, port=port)

    def worker(
        self, name: str = "worker", *, record_dir: Path | None = None, decide_delay_s: float = 0.0
    ) -> None:
        """A solver worker: ``shockwave worker`` itself, or (``record_dir`` set) the same
        command run by :mod:`tests.e2e.recording_worker`, which records every decision and
        may slow each one down by ``decide_delay_s``."""
        if record_dir is None and not decide_delay_s:
            self.services.shockwave(name, "worker", "--concurrency", "1")
            return
        record_dir = record_dir or self.log_dir / f"{name}-decisions"
        self.services.module(
            name,
            RECORDING_WORKER,
            "--concurrency",
            "1",
            env={
                "SHOCKWAVE_E2E_RECORD_DIR": str(record_dir),
                "SHOCKWAVE_E2E_DECIDE_DELAY_S": str(decide_delay_s),
            },
        )

    def driver(self, name: str = "driver", *, metrics_port: int | None = None) -> int:
        """A round driver with short rounds; the port its metrics are served on."""
        port = metrics_port or free_port()
        self.services.shockwave(
            name,
            "driver",
            "--round-seconds",
            str(ROUND_SECONDS),
            "--node-ttl",
            "15",
            "--metrics-port",
            str(port),
        )
        return port

    def agent_token(self, node: str) -> str:
        return admin_command(self.env, "--role", "agent", "--node", node)

    def fleet(self, api_url: str, nodes: Mapping[str, int]) -> Fleet:
        """Registered agents: node id -> GPUs."""
        tokens = parallel_tokens(self.env, [["--role", "agent", "--node", n] for n in nodes])
        agents = [
            SimulatedAgent(node, token, api_url, gpus)
            for (node, gpus), token in zip(nodes.items(), tokens, strict=True)
        ]
        for agent in agents:
            agent.register()
        return Fleet(agents)

    def submit(self, api_url: str, fleet: Fleet, **body: Any) -> Job:
        spec = {"samples_per_epoch": 1000, "initial_batch_size": 32, **body}
        response = httpx.post(
            f"{api_url}/v1/jobs",
            json=spec,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=10.0,
        )
        assert response.status_code == 201, response.text
        created = response.json()
        job = Job(
            id=created["id"],
            gpus=spec["gpus"],
            epochs=spec["epochs"],
            samples_per_epoch=spec["samples_per_epoch"],
            batch_size=spec["initial_batch_size"],
        )
        fleet.jobs[job.id] = job
        return job


def base_env(database_url: str, broker_url: str) -> dict[str, str]:
    """The environment of every process: this one's without SHOCKWAVE_* settings, plus the
    database, the broker and the solver mode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env.update(
        SHOCKWAVE_DATABASE_URL=database_url,
        SHOCKWAVE_BROKER_URL=broker_url,
        SHOCKWAVE_SOLVER_MODE="celery",
        SHOCKWAVE_SOLVER_TIME_LIMIT_S=str(SOLVER_TIME_LIMIT_S),
        PYTHONUNBUFFERED="1",
    )
    return env


def shared_redis_url() -> str:
    """The shared test Redis, on a database number of this run's own (1-15), so that another
    run's workers never take this run's plan requests."""
    return f"{REDIS_URL}/{random.randint(1, 15)}"


@contextmanager
def deployment(
    log_dir: Path, broker_url: str | None = None, postgres_url: str | None = None
) -> Iterator[Deployment]:
    """The deployment on the shared Redis (or ``broker_url``) and a throwaway database on the
    shared Postgres (or on the server at ``postgres_url``, e.g. a private one to restart)."""
    if broker_url is None:
        require_shared_redis()
    with throwaway_database(server_url=postgres_url) as url:
        migrate.upgrade(url)
        engine = database_engine(url)
        env = base_env(url, broker_url or shared_redis_url())
        try:
            with Services(log_dir, env) as services:
                admin = admin_command(env, "--role", "admin")
                yield Deployment(url, engine, env, services, admin, log_dir)
        finally:
            engine.dispose()


def admin_command(env: Mapping[str, str], *args: str) -> str:
    """``shockwave admin create-token <args>``: the token it prints."""
    return parallel_tokens(env, [list(args)])[0]


def parallel_tokens(env: Mapping[str, str], requests: list[list[str]]) -> list[str]:
    """Create several tokens with ``shockwave admin create-token``, concurrently."""
    processes = [
        subprocess.Popen(
            [shockwave_command(), "admin", "create-token", *args],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for args in requests
    ]
    tokens = []
    for process, args in zip(processes, requests, strict=True):
        out, err = process.communicate(timeout=180)  # a loaded machine starts slowly
        assert process.returncode == 0, f"create-token {args}: {err}"
        tokens.append(out.strip())
    return tokens


def rounds(engine: Engine) -> list[RoundRow]:
    with Session(engine) as session:
        return list(session.exec(select(RoundRow).order_by(col(RoundRow.index))).all())


def plans(engine: Engine) -> dict[int, PlanRow]:
    with Session(engine) as session:
        return {p.id: p for p in session.exec(select(PlanRow)).all() if p.id is not None}


def job_states(engine: Engine) -> dict[str, str]:
    with Session(engine) as session:
        return {j.id: j.state for j in session.exec(select(JobRow)).all()}


def leases(engine: Engine) -> list[LeaseRow]:
    with Session(engine) as session:
        return list(session.exec(select(LeaseRow)).all())


def driver_metrics(port: int) -> dict[str, float]:
    """The driver's metrics as ``name{label=value,...}`` -> value (empty if it does not
    answer)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1.0).text
    except httpx.HTTPError:
        return {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
