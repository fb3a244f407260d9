"""Round cost: what the round driver spends materializing a round, at any size.

Usage::

    python -m bench.round_cost [--jobs 10000] [--nodes 1024] [--gpus-per-node 8]
        [--rounds 3] [--shuffle 0.1] [--history N] [--fills N] [--profile N] [--max-cpu-s S]
        [--json OUT]

What runs, all real: a throwaway Postgres database (migrated), ``--nodes`` READY approved nodes
and ``--jobs`` jobs of the reference trace (repeated past 900, as ``bench.scale`` submits them),
then ``--rounds`` boundaries through :func:`solver_service.leases.start_round`, the driver's own
code, in this process, with what the driver keeps from one boundary to the next. Round 1
issues a lease to every job that fits (first in, first out: no plan yet); each later round
follows a stored plan that keeps the jobs of the round before but ``--shuffle`` of them, which
it swaps for waiting ones (so a boundary extends most leases, revokes some and issues as many).
No agent runs: the leases stay ISSUED. ``--history`` stores that many finished attempts first
(a cluster that has run for a while).

Per round it prints the wall seconds of each phase (gather, engine, apply, commit), the
driver's own CPU seconds (``time.process_time``) and the leases issued, extended and revoked.
``--fills N`` then asks for N mid-round fills (:func:`solver_service.leases.fill_round`, as
the driver asks one after each change of the cluster) on the cluster as the last round left it,
and prints the fastest one's CPU and wall seconds: every GPU the rounds could fill is leased,
so a fill starts nothing (at scale, the common case), and what it costs is finding that out.
``--profile N`` prints the N functions with the most cumulative time of the last round
(cProfile). It exits 2 when a round's driver CPU exceeds ``--max-cpu-s``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import create_engine, insert, text
from sqlmodel import Session, col, select

from bench.api import postgres_database
from bench.scale import submit_direct, trace_jobs
from shockwave.domain.lifecycle import LIVE_LEASES
from solver_service.leases import KnownJobs, fill_round, start_round
from store import migrate
from store.cluster import approve_node
from store.cluster_version import bump_state_version, ensure_cluster
from store.tables import ClusterRow, LeaseRow, NodeRow, PlanRow

console = Console()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000, help="active jobs")
    parser.add_argument("--nodes", type=int, default=1024, help="READY nodes")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of each node")
    parser.add_argument("--rounds", type=int, default=3, help="boundaries measured")
    parser.add_argument(
        "--shuffle", type=float, default=0.1, help="share of the jobs each plan swaps out"
    )
    parser.add_argument(
        "--profile", type=int, default=0, help="print this many functions of the last round"
    )
    parser.add_argument(
        "--max-cpu-s", type=float, default=None, help="bound on a round's driver CPU seconds"
    )
    parser.add_argument("--seed", type=int, default=0, help="the plans' random swaps")
    parser.add_argument(
        "--fills", type=int, default=0, help="mid-round fills asked after the last round"
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="finished attempts (EXITED leases) stored before the first round, as a cluster "
        "that has run for a while has",
    )
    parser.add_argument("--reference", type=Path, default=Path("../shared/data/reference"))
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.nodes < 1 or args.rounds < 1 or args.gpus_per_node < 1:
        parser.error("--jobs, --nodes, --rounds and --gpus-per-node must be at least 1")
    if args.history < 0:
        parser.error("--history must be at least 0")
    if not 0 <= args.shuffle <= 1:
        parser.error("--shuffle must be between 0 and 1")
    return args


def add_nodes(database_url: str, count: int, gpus: int) -> None:
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            now = datetime.now(UTC)
            for i in range(count):
                node = f"node-{i:04d}"
                approve_node(session, node, gpus)
                session.add(NodeRow(id=node, hostname=node, gpus=gpus, last_heartbeat_at=now))
            ensure_cluster(session)
            bump_state_version(session)
            session.commit()
    finally:
        engine.dispose()


def add_history(database_url: str, count: int, jobs: Sequence[str], nodes: int) -> None:
    """``count`` finished attempts of ``jobs`` on the nodes, in one bulk insert a chunk."""
    engine = create_engine(database_url)
    stamp = datetime.now(UTC)
    try:
        with Session(engine) as session:
            for start in range(0, count, 5000):
                rows = [
                    {
                        "id": str(uuid.uuid4()),
                        "job_id": jobs[i % len(jobs)],
                        "node_id": f"node-{i % nodes:04d}",
                        "round_index": 0,
                        "gpus": [0],
                        "state": "EXITED",
                        "reason": "",
                        "issued_at": stamp,
                        "ends_at": stamp,
                        "updated_at": stamp,
                    }
                    for i in range(start, min(count, start + 5000))
                ]
                session.execute(insert(LeaseRow), rows)
            session.commit()
            session.execute(text("ANALYZE leases"))
            session.commit()
    finally:
        engine.dispose()


def store_plan(session: Session, r: int, order: Sequence[str], widths: dict[str, int]) -> None:
    """A plan for round ``r`` whose one column is ``order`` (the engine places what fits)."""
    cluster = session.get(ClusterRow, "default")
    assert cluster is not None
    session.add(
        PlanRow(
            cluster_id="default",
            base_round=r,
            state_version=cluster.state_version,
            policy="bench",
            rounds=[list(order)],
            widths={},
            status="optimal",
            solver="bench",
        )
    )
    session.commit()


def next_order(
    session: Session, all_jobs: Sequence[str], share: float, rng: random.Random
) -> list[str]:
    """The jobs leased now, ``share`` of them swapped for waiting jobs."""
    leased = sorted(
        set(session.exec(select(LeaseRow.job_id).where(col(LeaseRow.state).in_(LIVE_LEASES))).all())
    )
    waiting = [j for j in all_jobs if j not in set(leased)]
    out = set(rng.sample(leased, int(len(leased) * share)))
    keep = [j for j in leased if j not in out]
    return keep + rng.sample(waiting, min(len(waiting), len(out)))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    figures: list[dict[str, Any]] = []
    with postgres_database(args.postgres, "shockwave_round_cost") as database_url:
        migrate.upgrade(database_url)
        add_nodes(database_url, args.nodes, args.gpus_per_node)
        made = submit_direct(database_url, trace_jobs(args.reference, args.jobs))
        all_jobs = sorted(made)
        add_history(database_url, args.history, all_jobs, args.nodes)
        engine = create_engine(database_url)
        known = KnownJobs()  # kept from one boundary to the next, as the driver keeps it
        try:
            for index in range(1, args.rounds + 1):
                if index > 1:
                    with Session(engine) as session:
                        order = next_order(session, all_jobs, args.shuffle, rng)
                        store_plan(session, index, order, {})
                profiler = cProfile.Profile() if args.profile and index == args.rounds else None
                cpu, wall = time.process_time(), time.perf_counter()
                with Session(engine) as session:
                    if profiler is not None:
                        profiler.enable()
                    outcome = start_round(session, "default", time.time(), known=known)
                    if profiler is not None:
                        profiler.disable()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                row = {
                    "round": outcome.index,
                    "source": outcome.source,
                    "wall_s": round(wall, 3),
                    "cpu_s": round(cpu, 3),
                    "issued": outcome.issued,
                    "extended": outcome.extended,
                    "revoked": outcome.revoked,
                    "phases": {k: round(v, 3) for k, v in outcome.phases.items()},
                }
                figures.append(row)
                console.print(row)
                if profiler is not None:
                    pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
            if args.fills:
                figures.append(measure_fills(engine, known, args.fills))
                console.print(figures[-1])
        finally:
            engine.dispose()
    return figures


def measure_fills(engine: Any, known: KnownJobs, fills: int) -> dict[str, Any]:
    """The fastest of ``fills`` mid-round fills, in CPU and wall seconds, and what they did."""
    cpus, walls, issued = [], [], 0
    for _ in range(fills):
        cpu, wall = time.process_time(), time.perf_counter()
        with Session(engine) as session:
            issued += fill_round(session, "default", time.time, known).issued
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {
        "fills": fills,
        "issued": issued,
        "cpu_s_min": round(min(cpus), 4),
        "wall_s_min": round(min(walls), 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load = os.getloadavg()
    figures = run(args)
    console.print(f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"reference": str(args.reference), "json": str(args.json)},
                    "rounds": figures,
                },
                indent=2,
            )
        )
    if args.max_cpu_s is not None:
        over = [f for f in figures if f.get("cpu_s", 0.0) > args.max_cpu_s]
        if over:
            console.print(f"[red]rounds over {args.max_cpu_s} CPU-s: {[f['round'] for f in over]}")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
