"""``shockwave replay``: a trace through the real service, on a compressed clock.

What runs: the service (``--mode embedded``: ``shockwave up`` on a SQLite file;
``--mode distributed``: ``shockwave api``, a Celery ``shockwave worker`` and ``shockwave driver``
on a throwaway Postgres database and a queue of the run's own on Redis; or the one at
``--api URL``), one simulated agent per node (:mod:`shockwave_fleet.fleet`: the agent's poll
protocol, a job token per attempt, progress and scaling events as the SDK posts them), and a
submitter that posts each trace job (``POST /v1/jobs``) at its arrival time.

The clock: ``time_scale`` simulated seconds pass per wall second. The service runs unchanged in
wall time on a workload ``time_scale`` times faster: rounds of ``round_seconds / time_scale``,
arrivals at ``arrival_s / time_scale``, declared throughputs ``time_scale`` times higher, epochs
``time_scale`` times shorter, a restart that costs the agent ``restart_overhead_s /
time_scale`` of its lease, and the policy's duration knobs divided by ``time_scale``
(``SHOCKWAVE_TIME_SCALE``: the restart overhead it plans with, Gavel's 1000 s between
allocations...). Wall
times are mapped back to simulated seconds for the report: ``sim = (wall - t0) * time_scale``.
What does not scale is the service's own work (a solve, a boundary's writes, a request): at
120x, a 100 ms solve is 12 simulated seconds, which is what the plan-source counts and the
late boundaries measure.

What it reports (:class:`ReplayReport`): the simulator's figures
(:func:`shockwave.simulation.metrics.summarize` of a
:class:`~shockwave.simulation.simulator.SimResult` built from what the agents trained: one record
per ``round_seconds`` window), the rounds by plan source and the mid-round fills (from the service's
``rounds`` and ``leases`` tables), the boundaries that began late, and the events: posted, accepted,
and those the service lost or holds twice (from ``GET /v1/jobs/{id}/events``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import itertools
import json
import math
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from sqlalchemy import create_engine, text
from sqlmodel import Session

from agent.config import AgentConfig
from api.settings import Settings
from shockwave.domain.model import DEFAULT_TENANT, Cluster
from shockwave.domain.tenancy import market
from shockwave.rounds.engine import SOURCES
from shockwave.simulation.metrics import RunMetrics, summarize
from shockwave.simulation.simulator import JobOutcome, RoundRecord, SimResult, SimSettings
from shockwave.simulation.tenant_ledger import TenantLedger
from shockwave.workloads.workload import SimJob, Workload
from shockwave_cli.runtime.databases import POSTGRES_URL, REDIS_URL, throwaway_database
from shockwave_cli.runtime.supervision import (
    LOOPBACK,
    NotReady,
    Supervised,
    Supervisor,
    free_port,
    wait_http,
    wait_until,
)
from shockwave_fleet import wire
from shockwave_fleet.fleet import Fleet, FleetLog, TrainingJob, job_body, training_job
from store import migrate
from store.cluster import approve_node
from store.principals import Role
from store.tokens import create_token

Mode = Literal["embedded", "distributed"]

DEFAULT_BUDGET = 1.0
"""A job's budget when it names none (:class:`shockwave.domain.model.JobSpec`): the only one a
user's token may submit (it sets none)."""

START_TIMEOUT_S = 60.0
HEARTBEAT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
DRAIN_S = 3.0
"""Wall seconds the agents keep polling after the last job finished (its ``exited`` report)."""
REPORTS_PER_ROUND = 4
"""A job's program posts its latest finished epoch at most this often a round (and always when
it stops or finishes): at 120x the reference trace's 124,938 epochs would be about 680 progress
events a wall second, more than the service on two cores takes, while the planner reads
progress once a round. Batch-size changes are all posted."""
TICKS_PER_ROUND = 40
BOUNDARY_LEAD_S = 0.075
"""Wall seconds before each round's end the replay's driver begins the next round
(``SHOCKWAVE_BOUNDARY_LEAD_S``, :class:`solver_service.driver.DriverSettings`): about what
materializing a round and the polls that fetch its leases take on a small machine (a round's
begin to its leases' start: 56 ms mean on 2 cores at 120x, 72 ms with the lead), so the new
leases start about at the boundary, as the simulator's do, instead of 7 simulated seconds
after it at 120x (the leases a round revokes stop about then too). At most a tenth of a
round."""

APPROVED_GPUS = 1024
"""What the replay approves per node: its agents are its own and report what they run."""


def _agent_default(name: str) -> float:
    """The real agent's default for one of its durations (:class:`agent.config.AgentConfig`)."""
    default = next(f.default for f in dataclasses.fields(AgentConfig) if f.name == name)
    assert isinstance(default, float), name
    return default


AGENT_POLL_S = _agent_default("poll_interval_s")
"""The real agent's poll interval (``agent.config.AgentConfig.poll_interval_s``): around a
boundary, the simulated agents poll this often in simulated time (scaled to wall time) until
the new round is out."""
LEASE_SLACK_S = _agent_default("lease_slack_s")
"""The real agent's lease slack (``AgentConfig.lease_slack_s``): a simulated attempt trains
this long in simulated time (scaled to wall time) past its lease's end while no word of an
extension has come, as a real program does."""
MIN_RETRY_S = 0.005
BOUNDARY_AFTER_S = 0.01
"""Wall seconds after a round boundary the first job is submitted (:func:`first_arrival_at`):
after the boundary's leases, not racing them."""
LATE_SHARE = 0.05
"""A boundary is late when it began more than this share of a round after it was due."""


class ReplayError(RuntimeError):
    """The replay could not run to the end; the message says what happened."""


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """``round_seconds`` and ``restart_overhead_s`` are simulated seconds; ``poll_s`` is wall
    seconds (default: a tenth of a round in wall time); ``timeout_s``: wall seconds the jobs
    have to finish once the last one was submitted (default: the workload's makespan lower
    bound three times over, in wall time, plus a minute)."""

    cluster: Cluster
    policy: str
    out: Path
    round_seconds: float = 120.0
    time_scale: float = 120.0
    restart_overhead_s: float = 20.0
    mode: Mode = "embedded"
    api: str | None = None
    token: str | None = None
    database_url: str | None = None
    postgres_url: str = POSTGRES_URL
    redis_url: str = REDIS_URL
    poll_s: float | None = None
    timeout_s: float | None = None
    long_poll: bool | None = None
    """The agents hold each poll open (``wait_s``: up to a poll interval) until the service has
    something new for them, and report at once in polls of their own; False: plain polls every
    poll interval, and quick re-polls at the round's end (the fleet before long polls). None:
    on in the embedded mode (its driver wakes the held polls in-process) and the distributed
    one (over Postgres NOTIFY: store.lease_signal): a lease starts a request's time after its
    commit rather than up to a poll interval later; off with ``api`` (a service of unknown make)."""
    restore_rule: Literal["simulator", "always"] = "simulator"
    """What a lease gives the agents: ``simulator``, the simulator's workload model (a restore
    of ``restart_overhead_s`` on every start but a short final stretch: one whose job needs at
    most its lease less the simulator's 5 s guard; docs/simulator.md, step 6; and no training
    past the lease's end), so that a replay and ``shockwave simulate`` charge the same workload
    model and differ only in the scheduling; ``always``: every start restores, and a revoked
    program trains on until the revoke reaches its node (up to the real agent's lease slack),
    as a real job does."""
    solver: Literal["inline", "process"] = "process"
    """The embedded service's solver (``shockwave up --solver``): at 120x a 0.2 s solve in a
    thread of the service's process stalls its API and round driver by 24 simulated seconds."""

    @property
    def round_wall_s(self) -> float:
        return self.round_seconds / self.time_scale

    @property
    def agent_poll_s(self) -> float:
        return self.poll_s if self.poll_s is not None else max(0.02, self.round_wall_s / 10)

    @property
    def lease_slack_wall_s(self) -> float:
        """Wall seconds an attempt trains past its lease's end with no word: the real agent's
        slack, scaled; none under the simulator's rule, whose rounds end at their boundary
        (a revoked job trained about 4 simulated seconds more per stint than there)."""
        return 0.0 if self.restore_rule == "simulator" else LEASE_SLACK_S / self.time_scale

    @property
    def restore_guard_wall_s(self) -> float | None:
        """The simulator's guard against charging a short final stretch (wall seconds) under
        its rule; None (every start restores) otherwise."""
        if self.restore_rule != "simulator":
            return None
        return SimSettings().overhead_guard_s / self.time_scale

    @property
    def long_polls(self) -> bool:
        """Whether the agents long-poll (``long_poll``, or its default for the mode)."""
        if self.long_poll is not None:
            return self.long_poll
        return self.api is None


@dataclass(frozen=True, slots=True)
class EventCounts:
    """``posted``: events the training programs made; ``accepted``: answered 2xx; ``lost``:
    accepted but not in the job's event list, or never delivered (after the retries);
    ``duplicated``: a (job, seq) listed more than once. ``posted - accepted - lost`` were
    refused with a 409 (the attempt was fenced: the service rightly dropped them)."""

    posted: int
    accepted: int
    lost: int
    duplicated: int


@dataclass(frozen=True, slots=True)
class ReplayReport:
    result: SimResult
    run: RunMetrics
    plan_sources: Mapping[str, int] | None
    fills: int | None
    late_boundaries: int | None
    max_lateness_s: float | None
    events: EventCounts
    states: Mapping[str, int]
    wall_s: float
    notes: Mapping[str, Any] = field(default_factory=dict)
    lags: Mapping[str, Any] | None = None
    """Leased time left untrained, by cause (:func:`_lags`); None without the database."""

    def record(self) -> dict[str, Any]:
        """The extra keys of ``metrics.json`` (beside the simulator's)."""
        return {
            "replay": {
                "plan_sources": None if self.plan_sources is None else dict(self.plan_sources),
                "fills": self.fills,
                "late_boundaries": self.late_boundaries,
                "max_boundary_lateness_s": self.max_lateness_s,
                "lease_lags_s": None if self.lags is None else dict(self.lags),
                "events": {
                    "posted": self.events.posted,
                    "accepted": self.events.accepted,
                    "lost": self.events.lost,
                    "duplicated": self.events.duplicated,
                },
                "job_states": dict(self.states),
                "wall_s": round(self.wall_s, 1),
                **self.notes,
            }
        }


@dataclass
class Service:
    """Where the service answers, the tokens to use (None: open mode, no token), and its
    database when this run owns it (for the round and lease tables)."""

    base_url: str
    admin_token: str | None
    agent_tokens: dict[str, str | None]
    database_url: str | None
    logs: Callable[[], str] = lambda: ""
    tenant_tokens: dict[str, str] = field(default_factory=dict)
    """Tenant path -> a user token of that tenant (empty at ``--api``: jobs are then
    submitted by the admin token, naming their tenant)."""


def node_names(cluster: Cluster) -> list[str]:
    return [f"node-{i:02d}" for i in range(cluster.nodes)]


@contextmanager
def start_service(
    config: ReplayConfig, work: Path, tenants: Sequence[str] = ()
) -> Iterator[Service]:
    """The service of ``config.mode`` (or the one at ``config.api``), stopped at the end;
    with a user token for each of ``tenants`` (paths) where the run owns the database."""
    nodes = node_names(config.cluster)
    if config.api is not None:
        token = config.token
        yield Service(
            config.api.rstrip("/"), token, dict.fromkeys(nodes, token), config.database_url
        )
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env.update(
        PYTHONUNBUFFERED="1",
        SHOCKWAVE_TIME_SCALE=f"{config.time_scale:.6g}",
        # a job's program posts time_scale times more events a wall second than it would
        SHOCKWAVE_RATE_LIMIT_PER_S=f"{Settings().rate_limit_per_s * config.time_scale:.6g}",
        SHOCKWAVE_RATE_LIMIT_BURST=str(int(Settings().rate_limit_burst * config.time_scale)),
        # the driver wakes this often to fill GPUs freed mid-round (default 0.5 s: a minute
        # of simulated time at 120x)
        SHOCKWAVE_TICK_S=f"{min(0.5, config.round_wall_s / TICKS_PER_ROUND):.6g}",
        # the next round's leases out by the boundary, not the service's latency after it
        SHOCKWAVE_BOUNDARY_LEAD_S=f"{min(BOUNDARY_LEAD_S, config.round_wall_s / 10):.6g}",
        # a long poll re-reads its leases this often while nothing wakes it (the distributed
        # mode's notification channel down); the drivers wake it at each commit otherwise
        SHOCKWAVE_POLL_RECHECK_S=f"{min(1.0, config.round_wall_s / TICKS_PER_ROUND):.6g}",
    )
    round_wall = f"{config.round_wall_s:.6g}"
    with ExitStack() as stack:
        if config.mode == "embedded":
            database = work / "replay.db"
            url = f"sqlite:///{database.resolve()}"
            migrate.upgrade(url)
            admin, agents, users = _tokens(url, nodes, tenants)
            processes = stack.enter_context(Supervisor(work, env))
            port = free_port()
            service = processes.shockwave(
                "service",
                "up",
                "--port",
                str(port),
                "--db",
                str(database),
                "--round-seconds",
                round_wall,
                "--policy",
                config.policy,
                "--log-level",
                "info",
                "--solver",
                config.solver,
            )
        else:
            url = stack.enter_context(throwaway_database("replay", config.postgres_url))
            migrate.upgrade(url)
            admin, agents, users = _tokens(url, nodes, tenants)
            _set_policy(url, config.policy)
            queue = f"replay-{os.getpid()}-{secrets.token_hex(3)}"
            stack.callback(_drop_queue, config.redis_url, queue)
            env.update(
                SHOCKWAVE_DATABASE_URL=url,
                SHOCKWAVE_BROKER_URL=config.redis_url,
                SHOCKWAVE_SOLVER_QUEUE=queue,
                SHOCKWAVE_SOLVER_MODE="celery",
            )
            processes = stack.enter_context(Supervisor(work, env))
            port = free_port()
            service = processes.shockwave(
                "api", "api", "--host", LOOPBACK, "--port", str(port), "--log-level", "warning"
            )
            worker = processes.shockwave(
                "worker", "worker", "--concurrency", "1", "--log-level", "info"
            )
            # the first jobs are submitted once the worker can plan: until then every round
            # goes first in, first out, and at 120x a second of its start is a round
            wait_until(
                lambda: _worker_ready(worker),
                START_TIMEOUT_S,
                lambda: f"the Celery worker\n{processes.logs()}",
            )
            processes.shockwave("driver", "driver", "--round-seconds", round_wall)
        base = f"http://{LOOPBACK}:{port}"
        wait_http(f"{base}/readyz", service, START_TIMEOUT_S, processes.logs)
        yield Service(base, admin, dict(agents), url, processes.logs, users)


def _worker_ready(worker: Supervised) -> bool:
    """Whether the Celery worker has said it is ready (it imports the planner first); raises
    :class:`NotReady` if it exited."""
    if not worker.alive:
        raise NotReady(f"the Celery worker exited\n{worker.log_tail()}")
    return " ready." in worker.log_tail()


def _tokens(
    url: str, nodes: Sequence[str], tenants: Sequence[str] = ()
) -> tuple[str, dict[str, str], dict[str, str]]:
    """An admin token, one agent token per node and one user token per tenant path, written
    straight to the database."""
    engine = create_engine(url)
    try:
        with Session(engine) as session:
            admin = create_token(session, Role.ADMIN, name="replay")
            agents = {n: create_token(session, Role.AGENT, node=n, name=n) for n in nodes}
            users = {
                t: create_token(session, Role.USER, tenant=t, name=f"replay {t}") for t in tenants
            }
            for n in nodes:  # the replay is the operator: its agents report what they run
                approve_node(session, n, APPROVED_GPUS)
            session.commit()
    finally:
        engine.dispose()
    return admin, agents, users


def _set_policy(url: str, policy: str) -> None:
    """Give the (new) cluster ``policy`` before the driver and the solver start."""
    from shockwave_cli.runtime.embedded import configure_cluster
    from store.cluster_version import DEFAULT_CLUSTER, ensure_cluster
    from store.tables import ClusterRow

    engine = create_engine(url)
    try:
        with Session(engine) as session:
            ensure_cluster(session, DEFAULT_CLUSTER)
            session.commit()
            cluster = session.get(ClusterRow, DEFAULT_CLUSTER)
            assert cluster is not None
            seconds = cluster.round_seconds
        configure_cluster(engine, policy, seconds)
    finally:
        engine.dispose()


def _drop_queue(redis_url: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(queue)
    finally:
        client.close()


def replay(
    workload: Workload,
    config: ReplayConfig,
    progress: Callable[[float, int, int], None] | None = None,
) -> ReplayReport:
    """Run ``workload`` through the service; ``progress(sim_seconds, finished, submitted)`` is
    called about once a wall second. Raises :class:`ReplayError` when the service does not
    come up or the jobs do not finish within the timeout."""
    work = config.out / "logs"
    work.mkdir(parents=True, exist_ok=True)
    began = time.time()
    tenants = sorted({job.spec.tenant for job in workload.jobs} - {DEFAULT_TENANT})
    with start_service(config, work, tenants) as service:
        try:
            run = asyncio.run(_drive(workload, config, service, progress))
        except ReplayError as error:
            raise ReplayError(f"{error}\n{service.logs()}") from None
        events = asyncio.run(_check_events(service, run.jobs))
        states = asyncio.run(_job_states(service, run.jobs))
        tables = _tables(service.database_url, config, run)
    wall = time.time() - began
    result = _result(workload, config, run)
    return ReplayReport(
        result=result,
        run=summarize(result),
        plan_sources=tables.sources,
        fills=tables.fills,
        late_boundaries=tables.late,
        lags=tables.lags,
        max_lateness_s=tables.max_lateness_s,
        events=events,
        states=states,
        wall_s=wall,
        notes={
            "mode": "api" if config.api else config.mode,
            "time_scale": config.time_scale,
            "agent_poll_s": config.agent_poll_s,
            "long_poll": config.long_polls,
            "restart_overhead_s": config.restart_overhead_s,
            "restore_rule": config.restore_rule,
            "request_errors": {f"{k} {v}": n for (k, v), n in run.errors.items()},
            "request_ms": _latencies(run.latency),
        },
    )


@dataclass
class DriveOutcome:
    """What the run produced: the wall time of simulated time 0 and each job's program
    (by service job id) with its workload job."""

    t0: float
    jobs: dict[str, tuple[SimJob, TrainingJob]]
    errors: Counter[tuple[str, str]]
    latency: Mapping[str, list[float]] = field(default_factory=dict)
    """Request kind -> wall seconds of each answered request of the agents and programs."""
    started: Mapping[str, float] = field(default_factory=dict)
    """Attempt id -> wall time its node started it."""
    round_seen: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    """Round index -> node -> wall time of the first poll answer naming it as current."""


async def _drive(
    workload: Workload,
    config: ReplayConfig,
    service: Service,
    progress: Callable[[float, int, int], None] | None,
) -> DriveOutcome:
    scale = config.time_scale
    names = node_names(config.cluster)
    nodes = {
        name: (service.agent_tokens[name] or "", gpus)
        for name, gpus in zip(names, config.cluster.node_gpus, strict=True)
    }
    programs: dict[str, TrainingJob] = {}
    fleet = Fleet(
        [service.base_url],
        nodes,
        programs,
        poll_s=config.agent_poll_s,
        heartbeat_s=HEARTBEAT_S,
        restart_s=config.restart_overhead_s / scale,
        boundary_lag_s=min(0.02, config.round_wall_s / 20),
        boundary_retry_s=max(MIN_RETRY_S, AGENT_POLL_S / scale),
        admin_token=service.admin_token or "",
        report_s=config.round_wall_s / REPORTS_PER_ROUND,
        wait_s=config.agent_poll_s if config.long_polls else None,
        lease_slack_s=config.lease_slack_wall_s,
        restore_guard_s=config.restore_guard_wall_s,
    )
    stop = asyncio.Event()
    agents = asyncio.create_task(fleet.run(stop))
    jobs: dict[str, tuple[SimJob, TrainingJob]] = {}
    client = wire.Client(service.base_url, REQUEST_TIMEOUT_S)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(fleet.registered) < len(nodes):
            if agents.done() or time.monotonic() > deadline:
                raise ReplayError(
                    f"only {len(fleet.registered)} of {len(nodes)} agents registered "
                    f"(errors: {dict(fleet.log.errors)})"
                )
            await asyncio.sleep(0.05)
        headers = {"Authorization": f"Bearer {service.admin_token}"} if service.admin_token else {}
        await _configure_tenants(client, workload, headers)
        order = sorted(workload.jobs, key=lambda j: j.spec.arrival_s)
        first = order[0].spec.arrival_s if order else 0.0
        t0 = await first_arrival_at(fleet.log, config.round_wall_s) - first / scale
        last_report = 0.0
        pending = list(order)
        limit = config.timeout_s
        if limit is None:
            bound = workload.makespan_lower_bound(config.cluster.total_gpus)
            limit = 3 * bound / scale + 60.0
        end_by: float | None = None
        while True:
            now = time.time()
            while pending and t0 + pending[0].spec.arrival_s / scale <= now:
                job = pending.pop(0)
                body, as_who = _submission(job, scale, service, headers)
                answer = await client.request("POST", "/v1/jobs", json=body, headers=as_who)
                if answer.status_code != 201:
                    raise ReplayError(
                        f"submitting job {job.spec.job_id}: {answer.status_code} "
                        f"{answer.content[:500]!r}"
                    )
                job_id = answer.json()["id"]
                program = training_job(job_id, job, scale)
                programs[job_id] = program
                jobs[job_id] = (job, program)
            finished = sum(1 for _, p in jobs.values() if p.finished)
            if progress is not None and now - last_report >= 1.0:
                last_report = now
                progress((now - t0) * scale, finished, len(jobs))
            if not pending:
                end_by = end_by or now + limit
                if finished == len(jobs):
                    break
                if now > end_by:
                    raise ReplayError(
                        f"{len(jobs) - finished} of {len(jobs)} jobs unfinished after "
                        f"{limit:.0f} s of wall time"
                    )
            if agents.done():
                agents.result()
                raise ReplayError("the agents stopped")
            wake = t0 + pending[0].spec.arrival_s / scale if pending else now + 0.1
            await asyncio.sleep(min(0.1, max(0.0, wake - time.time())))
        if progress is not None:
            progress((time.time() - t0) * scale, len(jobs), len(jobs))
        await asyncio.sleep(DRAIN_S)
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agents, 30.0)
        await client.aclose()
    return DriveOutcome(
        t0, jobs, fleet.log.errors, fleet.log.latency, fleet.log.started, fleet.log.round_seen
    )


def _submission(
    job: SimJob, scale: float, service: Service, admin: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``POST /v1/jobs``'s body and headers for ``job``: as a user of its tenant where the run
    has one's token and the job keeps the default budget (a budget is an admin's to set), the
    tenant then being the token's; else as the admin, naming the tenant."""
    body = job_body(job, scale)
    token = service.tenant_tokens.get(job.spec.tenant)
    if token is None or job.spec.budget != DEFAULT_BUDGET:
        return body, dict(admin)
    body.pop("tenant", None)
    body.pop("budget", None)
    return body, {"Authorization": f"Bearer {token}"}


async def _configure_tenants(
    client: wire.Client, workload: Workload, headers: Mapping[str, str]
) -> None:
    """Give the service the workload's tenant settings (``PATCH /v1/tenants/{path}``), as the
    simulator plans with them, before any job arrives."""
    for path, tenant in sorted(workload.tenants.items()):
        body = {
            "weight": tenant.weight,
            "guaranteed_gpus": tenant.guaranteed_gpus,
            "max_gpus": tenant.max_gpus,
            "max_jobs": tenant.max_jobs,
        }
        answer = await client.request(
            "PATCH", f"/v1/tenants/{quote(path, safe='/')}", json=body, headers=dict(headers)
        )
        if answer.status_code != 200:
            raise ReplayError(
                f"configuring tenant {path}: {answer.status_code} {answer.content[:500]!r}"
            )


def _latencies(latency: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per request kind: how many, and the median and 95th percentile in milliseconds (wall
    time: at 120x, 10 ms is 1.2 simulated seconds)."""
    out: dict[str, dict[str, float]] = {}
    for kind, seconds in sorted(latency.items()):
        ordered = sorted(seconds)
        if ordered:
            out[kind] = {
                "n": len(ordered),
                "p50": round(1000 * ordered[len(ordered) // 2], 2),
                "p95": round(1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
            }
    return out


async def _check_events(
    service: Service, jobs: Mapping[str, tuple[SimJob, TrainingJob]]
) -> EventCounts:
    """Compare each job's accepted events with the service's list of them."""
    client = wire.Client(service.base_url, REQUEST_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {service.admin_token}"} if service.admin_token else {}
    posted = accepted = lost = duplicated = 0
    try:
        for job_id, (_, program) in jobs.items():
            seqs: Counter[int] = Counter()
            token: str | None = None
            while True:
                params = {"page_size": "500", **({"page_token": token} if token else {})}
                answer = await client.request(
                    "GET", f"/v1/jobs/{job_id}/events", params=params, headers=headers
                )
                if answer.status_code != 200:
                    raise ReplayError(
                        f"events of {job_id}: {answer.status_code} {answer.content[:500]!r}"
                    )
                page = answer.json()
                seqs.update(e["seq"] for e in page["items"] if e["seq"] is not None)
                token = page.get("next_page_token")
                if not token:
                    break
            posted += program.seq
            accepted += len(program.accepted)
            lost += sum(1 for seq in program.accepted if seq not in seqs) + program.undelivered
            duplicated += sum(n - 1 for n in seqs.values() if n > 1)
    finally:
        await client.aclose()
    return EventCounts(posted, accepted, lost, duplicated)


async def _job_states(
    service: Service, jobs: Mapping[str, tuple[SimJob, TrainingJob]]
) -> dict[str, int]:
    client = wire.Client(service.base_url, REQUEST_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {service.admin_token}"} if service.admin_token else {}
    states: Counter[str] = Counter()
    try:
        for job_id in jobs:
            answer = await client.request("GET", f"/v1/jobs/{job_id}", headers=headers)
            states[answer.json()["state"] if answer.status_code == 200 else "unknown"] += 1
    finally:
        await client.aclose()
    return dict(states)


@dataclass(frozen=True, slots=True)
class Tables:
    sources: dict[str, int] | None = None
    fills: int | None = None
    late: int | None = None
    max_lateness_s: float | None = None
    lags: dict[str, dict[str, float]] | None = None


def _tables(url: str | None, config: ReplayConfig, run: DriveOutcome) -> Tables:
    """Rounds by source, late boundaries (simulated seconds), mid-round fills and the lags
    of the leases (:func:`_lags`), from the service's own tables; nothing when the run does
    not own the database."""
    if url is None:
        return Tables()
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text('SELECT "index", source, started_at, ends_at FROM rounds ORDER BY "index"')
            ).all()
            leases = connection.execute(
                text(
                    "SELECT id, job_id, round_index, gpus, state, issued_at, updated_at FROM leases"
                )
            ).all()
    finally:
        engine.dispose()
    sources = dict.fromkeys(SOURCES, 0)
    sources.update(Counter(row.source for row in rows))
    started = {int(row._mapping["index"]): _stamp(row.started_at) for row in rows}
    # a round's wall start -> the end of the round before (when it was due)
    due = {
        _stamp(row.started_at): _stamp(before.ends_at) for before, row in itertools.pairwise(rows)
    }
    late, worst = 0, 0.0
    for begun, was_due in due.items():
        lateness = (begun - was_due) * config.time_scale
        worst = max(worst, lateness)
        if lateness > LATE_SHARE * config.round_seconds:
            late += 1
    fills = fill_jobs([(lease.job_id, _stamp(lease.issued_at)) for lease in leases], started)
    return Tables(sources, fills, late, round(worst, 3), _lags(leases, started, due, config, run))


async def first_arrival_at(log: FleetLog, round_wall_s: float) -> float:
    """When to submit the trace's first job: just after a round boundary, as the simulator
    starts its first round at the first arrival, so the trace's arrivals fall in the service's
    rounds where they fall in the simulator's (a job that arrives to a full cluster waits for
    the next boundary: up to a round of its JCT, and of a short job's FTF, hung on where the
    service's round clock happened to start). The boundary is the first round end the agents'
    polls name (:attr:`FleetLog.round_ends`) a tenth of a round or more from now, stepped by
    rounds; now, if no poll has named one within two rounds."""
    deadline = time.time() + 2 * round_wall_s
    while log.round_ends is None and time.time() < deadline:
        await asyncio.sleep(round_wall_s / 20)
    now = time.time()
    if log.round_ends is None:
        return now
    start = log.round_ends
    if start < now + round_wall_s / 10:
        start += math.ceil((now + round_wall_s / 10 - start) / round_wall_s) * round_wall_s
    return start + min(BOUNDARY_AFTER_S, round_wall_s / 100)


def fill_jobs(issued: Sequence[tuple[str, float]], rounds: Mapping[int, float]) -> int:
    """Jobs started mid-round: of the leases ``issued`` as (job, wall issue time), those
    issued after the first round began and at no round's start (``rounds``: index -> wall
    start), one per job and issue time (a job spanning nodes has a lease per node). A lease
    keeps its issue time when later rounds extend it, so its round index says nothing. The
    simulator's ``fills`` count the same: jobs, not fill events."""
    starts = sorted(rounds.values())
    if not starts:
        return 0
    return len(
        {(job, at) for job, at in issued if at > starts[0] + 1e-3 and not _at_any(at, starts)}
    )


def _at_any(stamp: float, starts: Sequence[float]) -> bool:
    """Whether ``stamp`` is one of the sorted ``starts`` (to the millisecond)."""
    return round_start_at(stamp, starts) is not None


def round_start_at(stamp: float, starts: Sequence[float]) -> float | None:
    """The one of the sorted ``starts`` that ``stamp`` is (to the millisecond), if any."""
    i = bisect.bisect_left(starts, stamp - 1e-3)
    return starts[i] if i < len(starts) and starts[i] <= stamp + 1e-3 else None


def _lags(
    leases: Sequence[Any],
    rounds: Mapping[int, float],
    due: Mapping[float, float],
    config: ReplayConfig,
    run: DriveOutcome,
) -> dict[str, Any]:
    """Where leased GPU time went untrained, in simulated seconds: ``start`` from a lease's
    issue to its node starting the attempt (the boundary's commit, the poll that brings it;
    the restore comes after), split into ``start_boundary`` (leases issued at a round's
    start) and ``start_fill`` (issued mid-round, on GPUs that freed up); ``start_after_due``
    from the boundary a round-start lease is for (``due``: a round's wall start -> the end of
    the round before) to its start, which the driver's boundary lead makes smaller than
    ``start_boundary`` (negative: started before the boundary); ``exit`` from a job's
    last epoch to its lease's ``exited`` report (the program's last event, the agent's
    report); ``round_seen`` from a round's start (``rounds``: index -> wall start) to each
    node's first poll answer naming it (the materialization and the poll that brings it).
    Per lag: count, mean, median, 95th percentile and GPU-seconds in all."""
    finished = {job_id: p.finished_at for job_id, (_, p) in run.jobs.items()}
    scale = config.time_scale
    start: list[tuple[float, int]] = []
    at_boundary: list[tuple[float, int]] = []
    at_fill: list[tuple[float, int]] = []
    after_due: list[tuple[float, int]] = []
    exit_: list[tuple[float, int]] = []
    starts = sorted(rounds.values())  # a lease keeps its issue time when a later round extends it
    for lease in leases:
        width = len(lease.gpus if isinstance(lease.gpus, list) else json.loads(lease.gpus))
        began = run.started.get(lease.id)
        if began is not None:
            issued = _stamp(lease.issued_at)
            lag = ((began - issued) * scale, width)
            start.append(lag)
            begun = round_start_at(issued, starts)
            (at_fill if begun is None else at_boundary).append(lag)
            was_due = None if begun is None else due.get(begun)
            if was_due is not None:
                after_due.append(((began - was_due) * scale, width))
        done = finished.get(lease.job_id)
        if lease.state == "EXITED" and done is not None:
            exit_.append(((_stamp(lease.updated_at) - done) * scale, width))
    seen = [
        ((at - rounds[index]) * scale, 1)
        for index, nodes in run.round_seen.items()
        if index in rounds
        for at in nodes.values()
    ]
    return {
        "start": _lag_stats(start),
        "start_boundary": _lag_stats(at_boundary),
        "start_fill": _lag_stats(at_fill),
        "start_after_due": _lag_stats(after_due),
        "round_seen": _lag_stats(seen),
        "exit": _lag_stats(exit_),
    }


def _lag_stats(lags: list[tuple[float, int]]) -> dict[str, float]:
    if not lags:
        return {"n": 0}
    ordered = sorted(lag for lag, _ in lags)
    return {
        "n": len(ordered),
        "mean": round(sum(ordered) / len(ordered), 2),
        "p50": round(ordered[len(ordered) // 2], 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "gpu_s": round(sum(max(0.0, lag) * width for lag, width in lags), 1),
    }


def _stamp(value: Any) -> float:
    """A timestamp column as seconds since the epoch (SQLite hands back ISO text)."""
    from datetime import UTC, datetime

    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


def _result(workload: Workload, config: ReplayConfig, run: DriveOutcome) -> SimResult:
    """The replay as the simulator would have reported it: every time in simulated seconds,
    one round record per ``round_seconds`` window with the GPU-seconds trained in it; each
    tenant's entitled and received GPU-seconds by hour (:class:`TenantLedger`, a window's
    start as the boundary) and each job's contention inside its tenant's share, averaged over
    its windows, as the simulator counts them."""
    scale, t0, length = config.time_scale, run.t0, config.round_seconds
    by_spec = {job.spec.job_id: program for job, program in run.jobs.values()}

    def sim(wall: float) -> float:
        return (wall - t0) * scale

    finish = {
        spec_id: sim(p.finished_at) if p.finished_at is not None else None
        for spec_id, p in by_spec.items()
    }

    def alive(job: SimJob, at: float) -> bool:
        """Whether ``job`` had arrived and had not finished at ``at``."""
        done = finish.get(job.spec.job_id)
        return job.spec.arrival_s <= at and (done is None or done > at)

    ends = [f for f in finish.values() if f is not None]
    makespan = max(ends) if ends else 0.0
    rounds: list[RoundRecord] = []
    windows = max(1, math.ceil(makespan / length))
    busy = [0.0] * windows
    held: list[dict[str, tuple[int, ...]]] = [{} for _ in range(windows)]
    active = [0] * windows
    gpus = {job.spec.job_id: job.spec.gpus for job in workload.jobs}
    for spec_id, program in by_spec.items():
        for start_w, end_w in program.spans:
            start, end = sim(start_w), sim(end_w)
            first, last = int(start // length), min(windows - 1, int(end // length))
            for w in range(max(0, first), last + 1):
                overlap = min(end, (w + 1) * length) - max(start, w * length)
                if overlap > 0:
                    busy[w] += overlap * gpus[spec_id]
                    held[w][spec_id] = ()
    tenant_of = {job.spec.job_id: job.spec.tenant for job in workload.jobs}
    ledger = TenantLedger(workload.tenants, config.cluster.total_gpus)
    contention = dict.fromkeys(tenant_of, 0.0)
    for w in range(windows):
        live = [job.spec for job in workload.jobs if alive(job, w * length)]
        active[w] = len(live)
        ledger.boundary(w * length, {s.job_id: (s.tenant, s.gpus) for s in live})
        shares = market(live, workload.tenants, workload.priority_classes, ledger.capacity)
        for spec in live:
            contention[spec.job_id] += shares.contention[spec.job_id]
            done = finish.get(spec.job_id)
            if done is not None and done <= (w + 1) * length:
                ledger.finish(spec.job_id, done)
    for spec_id, program in by_spec.items():
        for start_w, end_w in program.spans:
            ledger.hold(tenant_of[spec_id], sim(start_w), sim(end_w), gpus[spec_id])
    ledger.advance(makespan)
    for w in range(windows):
        rounds.append(
            RoundRecord(
                index=w,
                start_s=w * length,
                end_s=(w + 1) * length if w < windows - 1 else max(makespan, w * length),
                assignment=held[w],
                busy_gpu_seconds=busy[w],
                active_jobs=active[w],
                decision_seconds=0.0,
            )
        )
    outcomes = []
    for job in workload.jobs:
        done = finish.get(job.spec.job_id)
        life = [active[w] for w in range(windows) if alive(job, w * length)]
        ran = by_spec.get(job.spec.job_id)
        outcomes.append(
            JobOutcome(
                job_id=job.spec.job_id,
                gpus=job.spec.gpus,
                arrival_s=job.spec.arrival_s,
                finish_s=done,
                t_exclusive_s=job.t_exclusive_s,
                attained_s=sum(b - a for a, b in ran.spans) * scale if ran else 0.0,
                restarts=ran.restarts if ran else 0,
                mean_active_jobs=sum(life) / len(life) if life else 0.0,
                tenant=job.spec.tenant,
                mean_tenant_contention=contention[job.spec.job_id] / len(life) if life else 1.0,
            )
        )
    return SimResult(
        policy=config.policy,
        workload=workload.name,
        cluster=config.cluster,
        settings=SimSettings(
            round_seconds=config.round_seconds, restart_overhead_s=config.restart_overhead_s
        ),
        makespan_s=makespan,
        lower_bound_s=workload.makespan_lower_bound(config.cluster.total_gpus),
        jobs=tuple(outcomes),
        rounds=tuple(rounds),
        tenant_hours=ledger.hours(),
    )
