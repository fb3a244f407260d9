"""One chaos run: start the deployment, run the workload, inject the faults, drain, check.

Timeline: the deployment starts (:mod:`bench.chaos.cluster`) and issues its first round; the
workload (:mod:`bench.chaos.workload`) submits a backlog of jobs, then the rest in step with
the faults (:mod:`bench.chaos.faults`), which are injected one at a time, evenly spread over
``duration_s`` (seeded jitter; a fault waits for the previous one's restart, so a slow
machine stretches the run); then the run drains, faults over, until every acknowledged job
has finished (at most ``drain_s``), and the invariants (:mod:`bench.chaos.invariants`) are
checked from the database while it still runs. Everything it started is stopped at the end.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from bench.chaos.client import RoundRobin
from bench.chaos.cluster import Cluster, cluster
from bench.chaos.faults import Fault, Injector, schedule
from bench.chaos.invariants import Findings, check
from bench.chaos.workload import Workload, plan_jobs
from store.tables import JobRow, PlanRow, RoundRow

RECOVERY_S = 5.0
"""The round-gap bound is a round, plus the longest Postgres outage (downtime and restart, as
measured), plus this. Only Postgres stops rounds for longer than a tick: a killed active driver
is replaced by the standby within a tick (0.5 s), the other faults do not touch the driver.
After an outage a driver needs a tick to retry, a fresh connection and perhaps the advisory
lock; 5 s covers that on the shared 2-core machine with room to spare."""
POLL_S = 0.2
PLANNING_KINDS = ("worker", "redis")
"""Faults after which planning must resume (the worker, or the broker it takes work from)."""
PLAN_WAIT_S = 60.0
"""After the drain, how long to wait for a plan newer than the last such fault (the driver
asks for one every round; a worker starts and reconnects slowly on a loaded machine)."""


@dataclass
class Config:
    seed: int = 1
    faults: int = 24
    duration_s: float = 180.0
    jobs: int = 40
    max_epochs: int = 6
    apis: int = 3
    nodes: int = 4
    round_seconds: float = 2.0
    max_down_s: float = 3.0
    drain_s: float = 240.0
    scale_every_s: float = 3.0
    log_dir: Path | None = None


@dataclass
class Result:
    config: dict[str, Any]
    faults: list[Fault]
    findings: Findings
    run_s: float
    log_dir: str
    drained: bool
    client_retries: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.findings.total == 0

    def faults_by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.faults).items()))

    def faults_by_target(self) -> dict[str, int]:
        return dict(sorted(Counter(f.target for f in self.faults).items()))

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "config": self.config,
            "run_s": round(self.run_s, 1),
            "drained": self.drained,
            "faults_by_kind": self.faults_by_kind(),
            "faults_by_target": self.faults_by_target(),
            "faults": [asdict(f) for f in self.faults],
            "counts": self.findings.counts,
            "max_round_gap_s": round(self.findings.max_round_gap_s, 2),
            "violations": {k: len(v) for k, v in self.findings.violations.items()},
            "violation_examples": {k: v[:5] for k, v in self.findings.violations.items()},
            "client_retries": self.client_retries,
            "log_dir": self.log_dir,
        }


def run(config: Config, say: Callable[[str], None] = print) -> Result:
    """Run the chaos experiment of ``config``; ``say`` prints its progress lines."""
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="shockwave-chaos-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    kinds = schedule(rng, config.faults)
    plans = plan_jobs(rng, config.jobs, f"chaos-{config.seed}", config.max_epochs)
    began = time.monotonic()
    say(
        f"chaos: seed {config.seed}, {config.faults} faults over {config.duration_s:.0f}s, "
        f"{config.jobs} jobs; logs in {log_dir}"
    )
    with cluster(
        log_dir, apis=config.apis, nodes=config.nodes, round_seconds=config.round_seconds
    ) as running:
        say(
            f"[{_t(began)}] up: {config.apis} APIs, worker, 2 drivers (leader "
            f"{running.leader()}), {config.nodes} agents, private Postgres :"
            f"{running.postgres.port} and Redis :{running.redis.port}"
        )
        client = RoundRobin(running.urls, running.stack.admin_token)
        injector = Injector(running, rng, config.max_down_s)
        workload = Workload(
            client,
            plans,
            progress=lambda: injector.injected / max(1, config.faults),
            scale_every_s=config.scale_every_s,
            rng=random.Random(config.seed + 1),
        )
        started = time.monotonic()
        workload.start()
        faults = _inject(config, running, injector, kinds, started, began, say, workload)
        _wait(running, injector, lambda: not workload.submitting, 120.0)
        workload.finish()
        say(
            f"[{_t(began)}] faults done; {len(workload.acked.jobs)}/{len(plans)} jobs "
            "acknowledged; draining"
        )
        drained = _drain(running, injector, workload, config.drain_s, began, say)
        planning = [
            (f"fault {f.index} ({f.kind})", f.recovered) for f in faults if f.kind in PLANNING_KINDS
        ]
        last = max((back for _, back in planning), default=0.0)
        _wait(running, injector, lambda: _last_plan(running) > last, PLAN_WAIT_S)
        ended_at = time.time()
        worst = max((f.down_s + f.restart_s for f in faults if f.kind == "postgres"), default=0)
        bound = config.round_seconds + worst + RECOVERY_S
        findings = check(
            running.stack.engine,
            workload.acked,
            running.agents.values(),
            gap_bound_s=bound,
            ended_at=ended_at,
            planning_faults=planning,
        )
        findings.counts["round_gap_bound_s"] = round(bound)
        for exit_ in running.unexpected_exits:
            findings.add("unexpected_exit", exit_)
        for error in workload.errors:
            findings.add("unexpected_answer", error)
        retries = client.retried
        client.close()
    return Result(
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        faults=faults,
        findings=findings,
        run_s=time.monotonic() - began,
        log_dir=str(log_dir),
        drained=drained,
        client_retries=retries,
    )


def _inject(
    config: Config,
    running: Cluster,
    injector: Injector,
    kinds: list[str],
    started: float,
    began: float,
    say: Callable[[str], None],
    workload: Workload,
) -> list[Fault]:
    interval = config.duration_s / max(1, len(kinds))
    faults = []
    for i, kind in enumerate(kinds):
        due = started + (i + 0.5 + injector.rng.uniform(-0.3, 0.3)) * interval
        _wait(running, injector, lambda due=due: time.monotonic() >= due, interval * 2)  # type: ignore[misc]
        fault = injector.inject(i + 1, kind, time.monotonic() - started)
        faults.append(fault)
        say(
            f"[{_t(began)}] fault {i + 1:2d}/{len(kinds)} {kind:8s} {fault.target:10s} "
            f"down {fault.down_s:4.1f}s, back in {fault.restart_s:4.1f}s ({fault.detail}); "
            f"{_progress(running, workload)}"
        )
    return faults


def _drain(
    running: Cluster,
    injector: Injector,
    workload: Workload,
    drain_s: float,
    began: float,
    say: Callable[[str], None],
) -> bool:
    ids = set(workload.acked.jobs.values())
    deadline = time.monotonic() + drain_s
    last_said = time.monotonic()
    while time.monotonic() < deadline:
        running.check_alive(injector.down)
        if _succeeded(running, ids) == len(ids):
            say(
                f"[{_t(began)}] drained, all {len(ids)} jobs succeeded: "
                f"{_progress(running, workload)}"
            )
            return True
        if time.monotonic() - last_said > 15:
            say(f"[{_t(began)}] draining: {_progress(running, workload)}")
            last_said = time.monotonic()
        time.sleep(1.0)
    say(f"[{_t(began)}] drain timed out after {drain_s:.0f}s: {_progress(running, workload)}")
    return False


def _wait(
    running: Cluster, injector: Injector, condition: Callable[[], bool], timeout_s: float
) -> None:
    """Wait for ``condition`` (bounded), restarting (and recording) any process that died."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        died = running.check_alive(injector.down)
        if died:
            print(f"unexpected exit: {died}")
        time.sleep(POLL_S)


def _last_plan(running: Cluster) -> float:
    """When the newest plan was stored (seconds since the epoch; 0 if none or no database)."""
    try:
        with Session(running.stack.engine) as session:
            newest = session.exec(select(func.max(PlanRow.created_at))).one()
    except SQLAlchemyError:
        return 0.0
    return newest.timestamp() if newest is not None else 0.0


def _succeeded(running: Cluster, ids: set[str]) -> int:
    try:
        with Session(running.stack.engine) as session:
            return int(
                session.exec(
                    select(func.count())
                    .select_from(JobRow)
                    .where(col(JobRow.id).in_(ids), JobRow.state == "SUCCEEDED")
                ).one()
            )
    except SQLAlchemyError:
        return -1


def _progress(running: Cluster, workload: Workload) -> str:
    """Rounds so far and jobs by state (``?`` while the database does not answer)."""
    try:
        with Session(running.stack.engine) as session:
            last = session.exec(select(func.max(RoundRow.index))).one()
            states = dict(
                session.exec(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
            )
    except SQLAlchemyError:
        return "database not answering"
    summary = ", ".join(f"{k.lower()} {v}" for k, v in sorted(states.items()))
    return f"round {last}, jobs acked {len(workload.acked.jobs)}: {summary or 'none yet'}"


def _t(began: float) -> str:
    return f"{time.monotonic() - began:6.1f}s"
