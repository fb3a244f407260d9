"""The deployment under test, every part of it a real process the chaos run can kill.

A private Postgres (:class:`bench.servers.PostgresServer`) and a private Redis on free
ports (the shared servers are never touched), a migrated database on it, ``apis`` API
processes on fixed ports (so a restarted one is found where the clients expect it), one solver
worker, two round drivers (one active, one standby on the advisory lock) and ``nodes``
simulated agents (:mod:`bench.chaos.agent`), each a process with its own state file and
journal. :meth:`Cluster.restart` starts a killed component again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.deployment import Deployment, deployment, driver_metrics
from bench.servers import PostgresServer, RedisServer, private_postgres, private_redis
from shockwave_cli.runtime.supervision import LOOPBACK, Supervised, free_port, wait_http, wait_until

AGENT_MODULE = "bench.chaos.agent"
GPUS_PER_NODE = 2
NODE_TTL_S = 10.0
"""Seconds without a heartbeat before the driver marks a node LOST (agents heartbeat every
second; an agent's downtime in the run stays below this, a Postgres outage too)."""
API_START_TIMEOUT_S = 120.0
"""A process's start, under load from everything else on a 2-core machine, can take long."""


@dataclass
class Cluster:
    """The running deployment: ``stack`` (database, env, services), the private servers, the
    API base URLs, and the names of the worker, driver and agent services."""

    stack: Deployment
    postgres: PostgresServer
    redis: RedisServer
    api_urls: dict[str, str]
    drivers: dict[str, int]
    """Driver service name -> its metrics port."""
    agents: dict[str, Path]
    """Agent service name -> its journal."""
    round_seconds: float
    unexpected_exits: list[str] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return list(self.api_urls.values())

    def service(self, name: str) -> Supervised:
        return self.stack.services.named(name)

    def leader(self) -> str | None:
        """The driver whose metrics say it leads (None when no one answers as leader)."""
        for name, port in self.drivers.items():
            if driver_metrics(port).get("shockwave_driver_leader") == 1.0:
                return name
        return None

    def restart(self, name: str) -> None:
        """Start the service ``name`` again (same command, same port) and wait until it is up:
        an API answers /healthz, a driver serves its metrics, the worker's log says it is ready,
        an agent's journal says it registered. One fault at a time means just that: a driver
        still importing when the other is killed would leave no driver at all."""
        service = self.service(name)
        mark = service.log_path.stat().st_size if service.log_path.exists() else 0
        journal = self.agents.get(name)
        seen = journal.stat().st_size if journal is not None and journal.exists() else 0
        service.start()
        if name in self.api_urls:
            wait_http(f"{self.api_urls[name]}/healthz", service, API_START_TIMEOUT_S)
        elif name in self.drivers:
            port = self.drivers[name]
            _wait_up(service, lambda: bool(driver_metrics(port)), "its metrics")
        elif journal is not None:
            _wait_up(service, lambda: _grew_with(journal, seen, '"registered"'), "registering")
        else:
            _wait_up(service, lambda: _grew_with(service.log_path, mark, " ready."), "ready")

    def check_alive(self, down: set[str]) -> list[str]:
        """Services that died without being killed (not in ``down``): each is recorded as an
        unexpected exit and started again. Their names."""
        died = [s.name for s in self.stack.services.started if not s.alive and s.name not in down]
        for name in died:
            self.unexpected_exits.append(f"{name}: {self.service(name).log_tail(1500)}")
            self.restart(name)
        return died


@contextmanager
def cluster(log_dir: Path, *, apis: int, nodes: int, round_seconds: float) -> Iterator[Cluster]:
    """Start the whole deployment (module docstring); everything is stopped on exit."""
    with ExitStack() as stack:
        redis = stack.enter_context(private_redis())
        postgres = stack.enter_context(private_postgres())
        deployed = stack.enter_context(
            deployment(log_dir, broker_url=redis.url, postgres_url=postgres.url)
        )
        deployed.env["SHOCKWAVE_SOLVER_TIME_LIMIT_S"] = str(max(1.0, round_seconds / 2))
        deployed.services.env.update(deployed.env)
        api_urls = {f"api-{i}": _api(deployed, f"api-{i}") for i in range(1, apis + 1)}
        deployed.worker("worker")
        drivers = {
            name: _driver(deployed, name, round_seconds) for name in ("driver-a", "driver-b")
        }
        names = [f"n{i}" for i in range(1, nodes + 1)]
        tokens = deployed.agent_tokens(names)
        agents: dict[str, Path] = {}
        for node, token in zip(names, tokens, strict=True):
            name = f"agent-{node}"
            journal = log_dir / f"{name}.jsonl"
            deployed.services.module(
                name,
                AGENT_MODULE,
                "--node",
                node,
                "--gpus",
                str(GPUS_PER_NODE),
                "--api",
                ",".join(api_urls.values()),
                "--state",
                str(log_dir / f"{name}.state.json"),
                "--journal",
                str(journal),
                env={"SHOCKWAVE_CHAOS_TOKEN": token},
            )
            agents[name] = journal
        running = Cluster(
            stack=deployed,
            postgres=postgres,
            redis=redis,
            api_urls=api_urls,
            drivers=drivers,
            agents=agents,
            round_seconds=round_seconds,
        )
        for name, url in api_urls.items():  # started together: a slow machine starts slowly
            wait_http(f"{url}/healthz", deployed.services.named(name), API_START_TIMEOUT_S)
        wait_until(lambda: running.leader() is not None, API_START_TIMEOUT_S, "an active driver")
        yield running


def _wait_up(service: Supervised, condition: Callable[[], bool], what: str) -> None:
    def up() -> bool:
        if not service.alive:
            raise AssertionError(f"{service.name} exited on start:\n{service.log_tail()}")
        return condition()

    wait_until(up, API_START_TIMEOUT_S, f"{service.name} to be up ({what})", poll_s=0.2)


def _grew_with(path: Path, offset: int, text: str) -> bool:
    """Whether ``path`` has ``text`` past byte ``offset``."""
    if not path.exists():
        return False
    with path.open("rb") as source:
        source.seek(offset)
        return text.encode() in source.read()


def _api(deployed: Deployment, name: str) -> str:
    """Start an API process on a port of its own (kept across restarts); its base URL."""
    port = free_port()
    deployed.services.shockwave(
        name, "api", "--host", LOOPBACK, "--port", str(port), "--log-level", "warning"
    )
    return f"http://{LOOPBACK}:{port}"


def _driver(deployed: Deployment, name: str, round_seconds: float) -> int:
    port = free_port()
    deployed.services.shockwave(
        name,
        "driver",
        "--round-seconds",
        str(round_seconds),
        "--node-ttl",
        str(NODE_TTL_S),
        "--metrics-port",
        str(port),
        "--log-level",
        "warning",
    )
    return port
