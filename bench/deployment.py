"""The distributed deployment, assembled from real processes for one run (the chaos run, the
end-to-end tests).

:func:`deployment` gives a migrated throwaway Postgres database, the environment every process
shares (database, broker, ``celery`` solver mode), an admin token, and a
:class:`~shockwave_cli.runtime.supervision.Supervisor` that stops every process it started. Runs
then start the API, solver workers and round drivers they need, their agents, and read the outcome
from the database with the helpers below.
"""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from bench.servers import REDIS_URL, database_engine, require_shared_redis, throwaway_database
from shockwave_cli.runtime.supervision import (
    LOOPBACK,
    Supervisor,
    free_port,
    stop_together,
    wait_http,
)
from store import migrate
from store.cluster import approve_node
from store.principals import Role
from store.tables import JobRow, LeaseRow, PlanRow, RoundRow
from store.tokens import Scope, create_token

ROOT = Path(__file__).resolve().parents[1]
ROUND_SECONDS = 2.0
SOLVER_TIME_LIMIT_S = 5.0
API_START_TIMEOUT_S = 90.0
"""An API process imports a lot; on a loaded 2-core machine its start can take a minute."""


@dataclass
class Deployment:
    database_url: str
    engine: Engine
    env: dict[str, str]
    services: Supervisor
    admin_token: str
    log_dir: Path

    def api(self, name: str = "api", *, port: int | None = None) -> str:
        """Start ``shockwave api`` on ``port`` (default a free loopback port); its base URL once
        it answers. A fixed port lets a run restart a killed API where its clients expect it
        (``services.named(name).start()``, then
        :func:`~shockwave_cli.runtime.supervision.wait_http`)."""
        port = port or free_port()
        process = self.services.shockwave(
            name, "api", "--host", LOOPBACK, "--port", str(port), "--log-level", "warning"
        )
        base = f"http://{LOOPBACK}:{port}"
        wait_http(f"{base}/healthz", process, API_START_TIMEOUT_S, self.services.logs)
        return base

    def worker(self, name: str = "worker") -> None:
        """A solver worker (``shockwave worker``), one plan at a time."""
        self.services.shockwave(name, "worker", "--concurrency", "1")

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
        return self.agent_tokens([node])[0]

    def agent_tokens(self, nodes: Sequence[str]) -> list[str]:
        """An agent token per node, stored directly (see :func:`store_token`), each node
        approved for up to :data:`HARNESS_GPUS` GPUs (the harness is the operator: its agents
        report what they run)."""
        tokens = [store_token(self.engine, Role.AGENT, node=node, name=node) for node in nodes]
        with Session(self.engine) as session:
            for node in nodes:
                approve_node(session, node, HARNESS_GPUS)
            session.commit()
        return tokens


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
        # A queue of its own too: deployments run side by side (pytest-xdist workers, other
        # checkouts) and a database number of 15 is no guarantee against another run's worker.
        env["SHOCKWAVE_SOLVER_QUEUE"] = f"solver-{secrets.token_hex(4)}"
        try:
            with Supervisor(log_dir, env, cwd=ROOT) as services:
                try:
                    admin = store_token(engine, Role.ADMIN, name="admin")
                    yield Deployment(url, engine, env, services, admin, log_dir)
                finally:
                    # All at once (SIGTERM, one grace period, SIGKILL): none of these needs
                    # another to stop (they share only Postgres and Redis), and one after
                    # another took 4 s a deployment (the worker's shutdown alone 1.5 s).
                    stop_together(services.started)
        finally:
            engine.dispose()


HARNESS_GPUS = 64
"""The GPUs a harness approves per node (a node's leases never exceed what its agent reports)."""


def store_token(engine: Engine, role: Role, **scope: Unpack[Scope]) -> str:
    """A token stored directly, as ``shockwave admin create-token`` stores it, without a process
    per token: each such process took 2-5 s to start on the loaded 2-core machine, twice per
    deployment (the admin, then the agents). The command itself is tested in
    ``tests/unit/test_cli_api.py`` and ``tests/e2e/test_operator_views.py``."""
    with Session(engine) as session:
        return create_token(session, role, **scope)


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
