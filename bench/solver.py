"""How fast the Shockwave planner reaches a 0.1% gap on snapshots of N active jobs on G GPUs.

Usage::

    python bench/solver.py [--preset paper | --jobs N --gpus G] [--rounds 30] [--seeds 3]
        [--source random|trace|both] [--time-limit 15] [--scip-check] [--json OUT]
        [--elastic MAX]

An instance is a snapshot of N active jobs in the middle of their lives. Jobs come from a seeded
synthetic workload (``random``, WISR throughputs) or are drawn from the 900-job reference trace
(``trace``; with replacement and fresh ids when N > 900). Each job gets a random point along its
true trajectory (epochs done, the regimes finished so far, epoch times measured at the batch
sizes it has run), an age, and is either running (holding GPUs, as many jobs as fit the cluster
and at most half of them) or waiting (a fifth of those never started). So Accordion and GNS jobs
sit partway through with several predicted regimes ahead.

Timed steps, all through the policy's own code: ``build_seconds`` is the outlooks (prediction and
FTF), the jobs turned into PlanJobs and ``build_problem``; ``seconds_to_gap`` is ``solve_counts``
plus, when the greedy cannot certify the target, ``solve_with_scip``, as ``planner.plan`` does it
(null when the target is not reached within ``--time-limit``). ``gain_gap`` is certified on the
achievable gain: (bound - objective) / (bound - empty plan's objective); ``gap_at_limit`` is that
same gap as it stands when the solve stops (at the target or at the time limit, whichever comes
first); ``plain_gap`` is (bound - objective) / |objective|. ``policy_seconds`` times the whole
``Shockwave.solve`` (PlanJobs, build, solve, packing) as a cross-check. With ``--scip-check``,
``scip_seconds``/``scip_gain_gap`` are SCIP certifying from the greedy start (use_scip="always";
seconds null when SCIP hits the limit). The table shows the median over seeds of each size.

``--elastic MAX`` makes every job elastic from 1 GPU to MAX (speed-ups from the WISR table, as
``shockwave simulate --elastic`` does) and times the elastic planner
(:mod:`shockwave.market.elastic`) as ``Shockwave.solve_widths`` runs it: ``build_seconds`` the
outlooks and every width's PlanJobs, ``solve_seconds`` the rows, the envelopes, the greedy and the
packing; ``gain_gap`` its certified gap (docs/elastic.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from shockwave.domain.model import Cluster
from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.market.elastic import make_elastic
from shockwave.market.estimators import contention_factor
from shockwave.market.planner import (
    PlannerParams,
    Problem,
    build_problem,
    is_concave_job,
    solve_counts,
)
from shockwave.market.planner_scip import solve_with_scip
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams, _plan_job
from shockwave.prediction.throughput_model import ThroughputModel
from shockwave.workloads.generator import generate_workload
from shockwave.workloads.traces import ThroughputTable
from shockwave.workloads.workload import SimJob, Workload
from shockwave_cli.commands.inputs import InputError, load_throughputs, load_workload

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "reference"
TRACE_NAME = "900_0.2_5_100_5_15_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic"
PAPER_SIZES: tuple[tuple[int, int], ...] = ((100, 32), (500, 128), (900, 256), (2000, 512))
"""(active jobs, GPUs) of the paper's solver-scaling figure."""
ROUND_SECONDS = 120.0
GPUS_PER_NODE = 8
TARGET_GAP = 1e-3
RUNNING_SHARE = 0.5
FRESH_SHARE = 0.2
"""Share of waiting jobs that have never run."""
PROGRESS_RANGE = (0.02, 0.95)
"""Range of the share of its epochs a started job has done."""
MEAN_QUEUE_WAIT_S = 1800.0


@dataclass(frozen=True, slots=True)
class Instance:
    """A snapshot and the contention history the policy would have accumulated for it."""

    source: str
    seed: int
    snapshot: Snapshot
    contention_sum: Mapping[str, float]
    contention_rounds: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Measurement:
    """One solve of one instance (see the module docstring for the meaning of each figure)."""

    source: str
    jobs: int
    gpus: int
    rounds: int
    seed: int
    running: int
    multi_regime: int
    non_concave: int
    build_seconds: float
    seconds_to_gap: float | None
    solve_seconds: float
    gap_at_limit: float
    gain_gap: float
    plain_gap: float
    greedy_gain_gap: float
    status: str
    solver: str
    policy_seconds: float
    policy_status: str
    policy_gain_gap: float
    scip_seconds: float | None = None
    scip_gain_gap: float | None = None
    scip_status: str | None = None


# ------------------------------------------------------------------------------------ instances


def trace_jobs(pool: Sequence[SimJob], count: int, rng: np.random.Generator) -> list[SimJob]:
    """``count`` jobs drawn from ``pool`` (with replacement only when it is too small), ids 0..."""
    picks = rng.choice(len(pool), size=count, replace=count > len(pool))
    return [
        dataclasses.replace(
            pool[int(p)], spec=dataclasses.replace(pool[int(p)].spec, job_id=str(i))
        )
        for i, p in enumerate(picks)
    ]


def progress_at(job: SimJob, epochs_done: float, running: tuple[int, ...]) -> JobProgress:
    """What a scheduler has observed of ``job`` once it has done ``epochs_done`` epochs."""
    index, start = 0, 0.0
    trajectory = job.trajectory
    while index < len(trajectory) - 1 and start + trajectory[index].epochs <= epochs_done:
        start += trajectory[index].epochs
        index += 1
    ran = trajectory[: index + 1] if epochs_done > start else trajectory[:index]
    attained = sum(r.epochs * job.epoch_seconds[r.batch_size] for r in trajectory[:index])
    attained += (epochs_done - start) * job.epoch_seconds[trajectory[index].batch_size]
    return JobProgress(
        batch_size=trajectory[index].batch_size,
        epochs_done=epochs_done,
        observed_regimes=trajectory[:index],
        measured_epoch_seconds={r.batch_size: job.epoch_seconds[r.batch_size] for r in ran},
        attained_s=attained,
        executed_last_round_s=ROUND_SECONDS if running else 0.0,
        gpus=running,
    )


def running_gangs(
    jobs: Sequence[SimJob], gpus: int, rng: np.random.Generator
) -> dict[int, tuple[int, ...]]:
    """GPUs held by the running jobs: a random half of the jobs, as many as fit the cluster."""
    held: dict[int, tuple[int, ...]] = {}
    free = 0
    for index in rng.permutation(len(jobs))[: int(len(jobs) * RUNNING_SHARE)]:
        width = jobs[int(index)].spec.gpus
        if free + width <= gpus:
            held[int(index)] = tuple(range(free, free + width))
            free += width
    return held


def snapshot_of(
    jobs: Sequence[SimJob], gpus: int, source: str, seed: int, rng: np.random.Generator
) -> Instance:
    """The jobs at random points of their lives, in arrival order, on a ``gpus``-GPU cluster."""
    held = running_gangs(jobs, gpus, rng)
    states: list[tuple[SimJob, JobProgress, float]] = []
    for index, job in enumerate(jobs):
        gang = held.get(index, ())
        fresh = not gang and rng.random() < FRESH_SHARE
        done = 0.0 if fresh else float(rng.uniform(*PROGRESS_RANGE)) * job.spec.epochs
        progress = progress_at(job, done, gang)
        wait = progress.attained_s * float(rng.uniform(0.0, 2.0))
        age = progress.attained_s + wait + float(rng.exponential(MEAN_QUEUE_WAIT_S))
        states.append((job, progress, age))
    now = math.ceil(max(age for _, _, age in states)) + ROUND_SECONDS
    active: list[ActiveJob] = []
    for job, progress, age in states:
        spec = dataclasses.replace(job.spec, arrival_s=float(math.floor(now - age)))
        active.append(ActiveJob(spec=spec, progress=progress))
    active.sort(key=lambda a: (a.spec.arrival_s, int(a.job_id)))
    factor = contention_factor(len(active), gpus)
    rounds = {a.job_id: max(1, math.ceil((now - a.spec.arrival_s) / ROUND_SECONDS)) for a in active}
    snapshot = Snapshot(
        now=float(now),
        round_index=max(rounds.values()),
        round_seconds=ROUND_SECONDS,
        cluster=Cluster.of_gpus(gpus, math.gcd(gpus, GPUS_PER_NODE)),
        jobs=tuple(active),
    )
    return Instance(
        source=source,
        seed=seed,
        snapshot=snapshot,
        contention_sum={j: factor * n for j, n in rounds.items()},
        contention_rounds=rounds,
    )


def build_instance(
    source: str,
    jobs: int,
    gpus: int,
    seed: int,
    throughputs: ThroughputTable,
    trace_pool: Sequence[SimJob],
    elastic: int | None = None,
) -> Instance:
    """A seeded instance of ``source`` ("random" or "trace"); every job elastic from 1 to
    ``elastic`` GPUs when given."""
    rng = np.random.default_rng([seed, jobs, gpus, 0 if source == "random" else 1])
    if source == "random":
        sim_jobs = list(generate_workload(jobs, seed=rng, throughputs=throughputs).jobs)
    else:
        sim_jobs = trace_jobs(trace_pool, jobs, rng)
    if elastic is not None:
        sim_jobs = list(make_elastic(Workload(tuple(sim_jobs)), throughputs, elastic).jobs)
    return snapshot_of(sim_jobs, gpus, source, seed, rng)


# ------------------------------------------------------------------------------------- measure


def certified(value: float, bound: float, empty: float, target: float) -> bool:
    gain = bound - empty
    return gain <= 1e-15 or bound - value <= target * gain


def gain_gap_of(value: float, bound: float, empty: float) -> float:
    gain = bound - empty
    return max(0.0, bound - value) / gain if gain > 1e-15 else 0.0


def _outlooks(policy: Shockwave, instance: Instance, params: ShockwaveParams) -> dict[str, Any]:
    """Every job's outlook, as ``Shockwave.decide`` computes them before a solve."""
    snapshot = instance.snapshot
    rates = ThroughputModel.build(snapshot.population, snapshot.jobs, params.throughput)
    return {
        job.job_id: policy.outlook(
            snapshot, job, params, instance.contention_sum, instance.contention_rounds, rates
        )
        for job in snapshot.jobs
    }


def build(
    instance: Instance, params: ShockwaveParams, clock: Callable[[], float]
) -> tuple[Problem, dict[str, Any], float]:
    """Outlooks, PlanJobs and the count problem, as ``Shockwave.solve`` makes them; and seconds."""
    policy = Shockwave()
    snapshot = instance.snapshot
    started = clock()
    outlooks = _outlooks(policy, instance, params)
    window, length = params.planner.rounds, snapshot.round_seconds
    plan_jobs = [
        _plan_job(job, outlooks[job.job_id], params, window, length) for job in snapshot.jobs
    ]
    problem = build_problem(plan_jobs, snapshot.cluster.total_gpus, params.planner, length)
    return problem, outlooks, clock() - started


def solve_to_gap(
    problem: Problem, planner: PlannerParams, clock: Callable[[], float]
) -> tuple[float, float, float, float, str, str, float]:
    """The planner's solve path: (objective, bound, empty objective, greedy gain gap, status,
    solver, seconds)."""
    started = clock()
    counts, value, bound = solve_counts(problem)
    empty = problem.objective(np.zeros(len(problem.jobs), dtype=np.int64))
    greedy_gap = gain_gap_of(value, bound, empty)
    status, solver = "optimal", "greedy"
    if not certified(value, bound, empty, planner.relative_gap):
        status = "greedy"
        result = solve_with_scip(problem, planner, counts)
        if result is not None:
            if result.value >= value - 1e-12:
                value, solver = result.value, "scip"
            bound = min(bound, max(result.bound, value))
            status = result.status.value
        if certified(value, bound, empty, planner.relative_gap):
            status = "optimal"
    return value, bound, empty, greedy_gap, status, solver, clock() - started


def scip_check(
    problem: Problem, planner: PlannerParams, empty: float, clock: Callable[[], float]
) -> tuple[float | None, float | None, str]:
    """SCIP from the greedy start, on its own bound: (seconds if it finished, gain gap, status)."""
    started = clock()
    counts, _, _ = solve_counts(problem)
    result = solve_with_scip(problem, dataclasses.replace(planner, use_scip="always"), counts)
    seconds = clock() - started
    if result is None:
        return None, None, "no_solution"
    gap = gain_gap_of(result.value, result.bound, empty)
    finished = result.status.value in ("optimal", "gap_limit")
    return (seconds if finished else None), gap, result.status.value


def measure(
    instance: Instance, params: ShockwaveParams, scip: bool, clock: Callable[[], float]
) -> Measurement:
    snapshot = instance.snapshot
    problem, outlooks, build_seconds = build(instance, params, clock)
    value, bound, empty, greedy_gap, status, solver, seconds = solve_to_gap(
        problem, params.planner, clock
    )
    started = clock()
    policy_plan = Shockwave().solve(snapshot, params, outlooks)
    policy_seconds = clock() - started
    gain_gap = gain_gap_of(value, bound, empty)
    scip_seconds, scip_gap, scip_status = (
        scip_check(problem, params.planner, empty, clock) if scip else (None, None, None)
    )
    return Measurement(
        source=instance.source,
        jobs=len(snapshot.jobs),
        gpus=snapshot.cluster.total_gpus,
        rounds=params.planner.rounds,
        seed=instance.seed,
        running=sum(j.running for j in snapshot.jobs),
        multi_regime=sum(len(o.prediction.remaining_regimes()) >= 2 for o in outlooks.values()),
        non_concave=sum(not is_concave_job(problem, i) for i in range(len(problem.jobs))),
        build_seconds=build_seconds,
        seconds_to_gap=seconds if status == "optimal" else None,
        solve_seconds=seconds,
        gap_at_limit=gain_gap,
        gain_gap=gain_gap,
        plain_gap=max(0.0, bound - value) / max(abs(value), 1e-12),
        greedy_gain_gap=greedy_gap,
        status=status,
        solver=solver,
        policy_seconds=policy_seconds,
        policy_status=policy_plan.status.value,
        policy_gain_gap=policy_plan.gain_gap,
        scip_seconds=scip_seconds,
        scip_gain_gap=scip_gap,
        scip_status=scip_status,
    )


def measure_elastic(
    instance: Instance, params: ShockwaveParams, clock: Callable[[], float]
) -> Measurement:
    """The elastic planner on ``instance`` (module docstring, ``--elastic``)."""
    snapshot = instance.snapshot
    policy = Shockwave()
    started = clock()
    outlooks = _outlooks(policy, instance, params)
    jobs, priority = policy.elastic_jobs(snapshot, params, outlooks)
    build_seconds = clock() - started
    started = clock()
    solved = policy.plan_elastic_jobs(snapshot, params, jobs, priority).plan
    seconds = clock() - started
    status = solved.status.value
    return Measurement(
        source=f"{instance.source}/elastic",
        jobs=len(snapshot.jobs),
        gpus=snapshot.cluster.total_gpus,
        rounds=params.planner.rounds,
        seed=instance.seed,
        running=sum(j.running for j in snapshot.jobs),
        multi_regime=sum(len(o.prediction.remaining_regimes()) >= 2 for o in outlooks.values()),
        non_concave=0,
        build_seconds=build_seconds,
        seconds_to_gap=seconds if status == "optimal" else None,
        solve_seconds=seconds,
        gap_at_limit=solved.gain_gap,
        gain_gap=solved.gain_gap,
        plain_gap=solved.gap,
        greedy_gain_gap=solved.gain_gap,
        status=status,
        solver=solved.solver,
        policy_seconds=seconds,
        policy_status=status,
        policy_gain_gap=solved.gain_gap,
    )


# -------------------------------------------------------------------------------------- report


def median(values: Sequence[float | None]) -> float:
    """Median with a missing figure (target not reached) counted as infinitely slow."""
    return statistics.median(math.inf if v is None else v for v in values)


def seconds_cell(value: float, limit: float) -> str:
    return f"> {limit:g}" if math.isinf(value) else f"{value:.3f}"


def tally(values: Sequence[str | None]) -> str:
    counts = Counter(v or "-" for v in values)
    return " ".join(f"{name} {n}/{len(values)}" for name, n in counts.most_common())


def median_table(rows: Sequence[Measurement], seeds: int, limit: float, scip: bool) -> Table:
    table = Table(
        title=f"Planner to a {TARGET_GAP:.1%} gain gap, median of {seeds} seeds "
        f"(time limit {limit:g} s)",
        title_justify="left",
    )
    headers = ["source", "jobs", "GPUs", "T", "running", "multi-regime", "non-concave"]
    headers += ["build s", "to gap s", "gap at limit", "plain gap", "status", "solver"]
    headers += ["policy s"] + (["scip s", "scip gap"] if scip else [])
    for header in headers:
        table.add_column(header, justify="left" if header in ("source", "status") else "right")
    groups: dict[tuple[str, int, int, int], list[Measurement]] = {}
    for row in rows:
        groups.setdefault((row.source, row.jobs, row.gpus, row.rounds), []).append(row)
    for (source, jobs, gpus, rounds), group in groups.items():
        cells = [source, str(jobs), str(gpus), str(rounds)]
        cells += [
            f"{median([float(getattr(g, k)) for g in group]):.0f}"
            for k in ("running", "multi_regime", "non_concave")
        ]
        cells += [
            f"{median([g.build_seconds for g in group]):.3f}",
            seconds_cell(median([g.seconds_to_gap for g in group]), limit),
            f"{median([g.gap_at_limit for g in group]):.2e}",
            f"{median([g.plain_gap for g in group]):.2e}",
            tally([g.status for g in group]),
            tally([g.solver for g in group]),
            f"{median([g.policy_seconds for g in group]):.3f}",
        ]
        if scip:
            cells.append(seconds_cell(median([g.scip_seconds for g in group]), limit))
            gaps = [g.scip_gain_gap for g in group if g.scip_gain_gap is not None]
            cells.append(f"{median(gaps):.2e}" if gaps else "-")
        table.add_row(*cells)
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--preset",
        choices=["paper"],
        default=None,
        help="the paper's four sizes (the default without --jobs)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="active jobs N")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs G (with --jobs)")
    parser.add_argument("--rounds", type=int, default=30, help="planning window T")
    parser.add_argument("--seeds", type=int, default=3, help="instances per size (median taken)")
    parser.add_argument("--source", choices=["random", "trace", "both"], default="both")
    parser.add_argument("--time-limit", type=float, default=15.0, help="SCIP's limit, seconds")
    parser.add_argument(
        "--scip-check", action="store_true", help="also time SCIP certifying from the greedy start"
    )
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="reference data dir")
    parser.add_argument("--json", type=Path, default=None, help="write every solve here")
    parser.add_argument(
        "--elastic",
        type=int,
        default=None,
        metavar="MAX",
        help="every job elastic from 1 to MAX GPUs; time the elastic planner",
    )
    args = parser.parse_args(argv)
    if args.preset is not None and args.jobs is not None:
        parser.error("--preset and --jobs exclude each other")
    if args.jobs is not None and (args.gpus is None or args.jobs < 1 or args.gpus < 1):
        parser.error("--jobs needs --gpus, both >= 1")
    if args.seeds < 1 or args.rounds < 1 or args.time_limit <= 0:
        parser.error("--seeds and --rounds must be >= 1 and --time-limit > 0")
    return args


def load_sources(
    reference: Path, sources: Sequence[str]
) -> tuple[ThroughputTable, tuple[SimJob, ...]]:
    """The WISR throughput table and, when asked for, the 900-job reference trace's jobs."""
    throughputs = load_throughputs(reference / "throughputs" / "wisr_throughputs.json")
    if "trace" not in sources:
        return throughputs, ()
    workload = load_workload(
        reference / "traces" / f"{TRACE_NAME}.trace",
        reference / "trajectories" / f"{TRACE_NAME}.wisr.trajectories.json",
        throughputs,
    )
    return throughputs, workload.jobs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 180)
    sources = ["random", "trace"] if args.source == "both" else [args.source]
    sizes = PAPER_SIZES if args.jobs is None else ((args.jobs, args.gpus),)
    try:
        throughputs, trace_pool = load_sources(args.reference, sources)
    except InputError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", soft_wrap=True)
        return 2
    planner = PlannerParams(
        rounds=args.rounds, time_limit_s=args.time_limit, relative_gap=TARGET_GAP
    )
    # The paper's predictor: instances keep Accordion and GNS jobs with several regimes ahead
    # (the population predictor, with no finished job, predicts many of them static).
    params = ShockwaveParams(planner=planner, regime_predictor="restatement")
    rows: list[Measurement] = []
    for source in sources:
        for jobs, gpus in sizes:
            for seed in range(args.seeds):
                instance = build_instance(
                    source, jobs, gpus, seed, throughputs, trace_pool, args.elastic
                )
                if args.elastic is not None:
                    rows.append(measure_elastic(instance, params, time.perf_counter))
                else:
                    rows.append(measure(instance, params, args.scip_check, time.perf_counter))
    console.print(median_table(rows, args.seeds, args.time_limit, args.scip_check))
    disagree = [r for r in rows if r.policy_status != r.status]
    if disagree:
        console.print(f"[yellow]{len(disagree)} solves where Shockwave.solve's status differs[/]")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n", "utf-8")
        console.print(f"Wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
