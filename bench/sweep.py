"""Quality across generated workloads: a grid that Shockwave must win in every cell.

Usage::

    python -m bench.sweep [--reference ../shared/data/reference] [--seeds 2] [--workers 2]
        [--grid generated|real|all] [--cells NAME,...] [--out out/sweep] [--json PATH]
        [--traces ../shared/data/public-traces]

Each cell is a generated workload shape (:mod:`shockwave.workloads.generator`): a load (mean seconds
between arrivals), a job-length mix (the generator's default, the reference traces' shorter mix,
a long-tailed mix with a few very long jobs), a cluster size (nodes of 4 GPUs), an adaptation-mode
mix and a number of jobs. For every seed of every cell it runs Shockwave and every baseline
(:data:`shockwave.policies.BASELINES`) in worker processes, and checks Shockwave's run against
the targets Shockwave is held to:

- makespan at most max(1.05 x the workload's lower bound, the best baseline's makespan);
- worst finish-time fairness at most 1.2, at most 5% of jobs above FTF 1;
- average JCT no worse than Gavel's.

Real-trace cells (``--grid real``, :data:`REAL_GRID`): each Microsoft ITP cluster of
``<traces>/itp`` (docs/real-traces.md), its busiest week (the 7 days from a job's arrival whose
jobs ask for the most GPU-seconds) imported by ``shockwave import-trace``'s default rule with the
run's seed, on a cluster in nodes of 8 GPUs sized to 0.8x and to 1.2x the week's mean demand
(its jobs' GPU-seconds over the week, rounded up to whole nodes, and at least the widest job's
GPUs). Their targets are the production-trace ones: makespan as above; average JCT at most the
best fair baseline's (Gavel, Themis, Gandiva-Fair); worst FTF at most the best baseline's worst
FTF.

A cell meets the targets when every seed does. It prints a table per cell (the worst seed's
figures), writes every run's metrics and the verdicts to ``<out>/sweep.json`` and a plot to
``<out>/sweep.png``, and exits 1 when a cell misses; each run is also appended to
``<out>/runs.jsonl`` as it finishes. Per-job FTF lists are left out of the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from shockwave.domain.model import AdaptationMode, Cluster
from shockwave.policies import BASELINES
from shockwave.policies.policy import get_policy, make_params
from shockwave.simulation.metrics import summarize
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.generator import MODE_MIX, SIZE_CLASSES, SizeClass, generate_workload
from shockwave.workloads.trace_import import (
    WEEK_S,
    ImportOptions,
    busiest_window,
    import_job_log,
    mean_demand_gpus,
    parse_job_log,
)
from shockwave.workloads.traces import ThroughputTable
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import load_throughputs

GPUS_PER_NODE = 4
REAL_GPUS_PER_NODE = 8
FAIR_BASELINES = ("gavel", "themis", "gandiva_fair")
MAKESPAN_SLACK = 1.05
WORST_FTF = 1.2
UNFAIR_SHARE = 0.05

LENGTH_MIXES: Mapping[str, tuple[SizeClass, ...]] = {
    "default": SIZE_CLASSES,
    # The reference traces draw run times of 0.2 to 5 hours.
    "short": (SizeClass("Short", 0.2, 5.0, 1.0),),
    # Mostly short jobs and a few very long ones: the critical path is a handful of jobs.
    "longtail": (SizeClass("Short", 0.2, 5.0, 0.95), SizeClass("Very long", 100.0, 150.0, 0.05)),
}

MODE_MIXES: Mapping[str, Mapping[AdaptationMode, float]] = {
    "default": MODE_MIX,
    "static": {AdaptationMode.STATIC: 1.0, AdaptationMode.ACCORDION: 0.0, AdaptationMode.GNS: 0.0},
    "gns": {AdaptationMode.STATIC: 0.0, AdaptationMode.ACCORDION: 0.0, AdaptationMode.GNS: 1.0},
    "mixed": {
        AdaptationMode.STATIC: 1 / 3,
        AdaptationMode.ACCORDION: 1 / 3,
        AdaptationMode.GNS: 1 / 3,
    },
}


@dataclass(frozen=True, slots=True)
class Cell:
    """One workload shape of the grid: ``jobs`` jobs arriving every ``interarrival_s`` on
    average on ``gpus`` GPUs, lengths from ``length_mix`` and modes from ``mode_mix``.

    A real-trace cell names its job log ``trace`` (a CSV path relative to ``--traces``) and the
    cluster's size as a multiple ``load`` of the busiest week's mean demand; its ``jobs`` and
    ``gpus`` are filled in from the log (:func:`resolve`)."""

    name: str
    jobs: int
    gpus: int
    interarrival_s: float
    length_mix: str
    mode_mix: str
    trace: str = ""
    load: float = 0.0


GRID: tuple[Cell, ...] = (
    Cell("heavy-default-48", 200, 48, 60.0, "default", "default"),
    Cell("heavy-default-16", 60, 16, 60.0, "default", "default"),
    Cell("medium-default-48", 100, 48, 600.0, "default", "default"),
    # Light, but more jobs than GPUs: with N_trace / G <= 1 the reference FTF is JCT / t_excl,
    # above 1 for every job under any schedule (restart overhead, whole rounds).
    Cell("light-default-24", 60, 24, 1800.0, "default", "default"),
    Cell("heavy-short-32", 150, 32, 60.0, "short", "default"),
    Cell("medium-short-128", 300, 128, 30.0, "short", "mixed"),
    Cell("heavy-longtail-48", 150, 48, 60.0, "longtail", "default"),
    Cell("heavy-static-32", 100, 32, 120.0, "default", "static"),
    Cell("heavy-gns-32", 100, 32, 120.0, "default", "gns"),
    Cell("light-short-256", 300, 256, 60.0, "short", "mixed"),
)
"""The default grid: every load, length mix, mode mix and cluster size appears, not their
product (that would not fit the 15-minute budget on two cores)."""


ITP_CLUSTERS = ("01", "02", "03", "04", "05", "06", "08", "09", "10")
REAL_LOADS = (0.8, 1.2)
REAL_GRID: tuple[Cell, ...] = tuple(
    Cell(f"itp{c}-week-{load:g}x", 0, 0, 0.0, "real", "default", f"itp/cluster{c}.csv", load)
    for c in ITP_CLUSTERS
    for load in REAL_LOADS
)
"""Each ITP cluster's busiest week on a cluster of 0.8x and 1.2x its mean demand."""


def real_week(cell: Cell, traces: Path, table: ThroughputTable, seed: int) -> tuple[Workload, int]:
    """A real-trace cell's workload for ``seed`` (the busiest week, rebased to 0) and its
    cluster's GPUs."""
    path = traces / cell.trace
    text = path.read_text(encoding="utf-8")
    jobs, _, _ = parse_job_log(text, str(path))
    since, until = busiest_window(jobs, WEEK_S)
    week = [j for j in jobs if since <= j.arrival_s < until]
    options = ImportOptions(seed=seed, since=since, until=until, skip_bad_rows=True)
    workload = import_job_log(text, cell.trace, table, options).workload
    nodes = math.ceil(cell.load * mean_demand_gpus(week, WEEK_S) / REAL_GPUS_PER_NODE)
    widest = math.ceil(max(j.gpus for j in week) / REAL_GPUS_PER_NODE)
    return workload, max(nodes, widest, 1) * REAL_GPUS_PER_NODE


def resolve(cell: Cell, traces: Path, table: ThroughputTable) -> Cell:
    """``cell`` with a real trace's job count and cluster size filled in (seed 0's import:
    the count and size do not depend on the seed)."""
    if not cell.trace:
        return cell
    workload, gpus = real_week(cell, traces, table, 0)
    return replace(cell, jobs=len(workload.jobs), gpus=gpus)


@dataclass(frozen=True, slots=True)
class Run:
    """One policy on one seed of one cell (metrics as :meth:`RunMetrics.as_dict`, no FTF lists);
    ``cpu_s``: the CPU seconds of the simulation, which a shared machine does not inflate."""

    cell: str
    seed: int
    policy: str
    metrics: dict[str, Any]
    wall_s: float
    cpu_s: float = 0.0


def run_one(
    cell: Cell,
    seed: int,
    policy_name: str,
    throughputs_path: str,
    overrides: Mapping[str, Any] | None = None,
    traces: str = "",
) -> Run:
    """Generate the cell's workload for ``seed`` (a real-trace cell: import its busiest week
    from ``traces`` with the seed) and simulate ``policy_name`` on it, with ``overrides`` of
    its params (:func:`shockwave.policies.policy.make_params`)."""
    table = load_throughputs(Path(throughputs_path))
    if cell.trace:
        workload, gpus = real_week(cell, Path(traces), table, seed)
        cluster = Cluster.of_gpus(gpus, REAL_GPUS_PER_NODE)
    else:
        workload = generate_workload(
            cell.jobs,
            seed=seed,
            throughputs=table,
            mean_interarrival_s=cell.interarrival_s,
            mode_mix=MODE_MIXES[cell.mode_mix],
            size_classes=LENGTH_MIXES[cell.length_mix],
        )
        cluster = Cluster.of_gpus(cell.gpus, GPUS_PER_NODE)
    policy = get_policy(policy_name)
    started = time.perf_counter()
    cpu = time.process_time()
    result = simulate(
        workload,
        cluster,
        policy,
        make_params(policy, overrides),
        SimSettings(),
    )
    metrics = summarize(result).as_dict()
    metrics.pop("ftf", None)
    metrics.pop("ftf_contention", None)
    return Run(
        cell.name,
        seed,
        policy_name,
        metrics,
        time.perf_counter() - started,
        time.process_time() - cpu,
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """Shockwave's figures on one seed of one cell against the targets."""

    cell: str
    seed: int
    over_lower_bound: float
    over_best_baseline: float
    best_baseline: str
    worst_ftf: float
    unfair_share: float
    jct_over_gavel: float
    real: bool = False
    jct_over_best_fair: float = 0.0
    ftf_over_best_baseline: float = 0.0

    @property
    def makespan_ok(self) -> bool:
        return self.over_lower_bound <= MAKESPAN_SLACK or self.over_best_baseline <= 1.0

    @property
    def met(self) -> bool:
        if self.real:
            return (
                self.makespan_ok
                and self.jct_over_best_fair <= 1.0
                and self.ftf_over_best_baseline <= 1.0
            )
        return (
            self.makespan_ok
            and self.worst_ftf <= WORST_FTF
            and self.unfair_share <= UNFAIR_SHARE
            and self.jct_over_gavel <= 1.0
        )


def judge(runs: Sequence[Run], real: frozenset[str] = frozenset()) -> list[Verdict]:
    """One verdict per (cell, seed) from Shockwave's run and the baselines' on the same seed;
    cells named in ``real`` are judged by the production-trace targets."""
    by_key: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for run in runs:
        by_key.setdefault((run.cell, run.seed), {})[run.policy] = run.metrics
    verdicts = []
    for (cell, seed), metrics in sorted(by_key.items()):
        ours = metrics["shockwave"]
        baselines = {name: m for name, m in metrics.items() if name != "shockwave"}
        best = min(baselines, key=lambda name: baselines[name]["makespan_s"])
        fair = [m["avg_jct_s"] for name, m in baselines.items() if name in FAIR_BASELINES]
        fairest = min((m["worst_ftf"] for m in baselines.values()), default=math.inf)
        verdicts.append(
            Verdict(
                cell=cell,
                seed=seed,
                over_lower_bound=ours["makespan_s"] / ours["makespan_lower_bound_s"],
                over_best_baseline=ours["makespan_s"] / baselines[best]["makespan_s"],
                best_baseline=best,
                worst_ftf=ours["worst_ftf"],
                unfair_share=ours["unfair_fraction"],
                jct_over_gavel=ours["avg_jct_s"] / metrics["gavel"]["avg_jct_s"],
                real=cell in real,
                jct_over_best_fair=ours["avg_jct_s"] / min(fair) if fair else math.inf,
                ftf_over_best_baseline=ours["worst_ftf"] / fairest,
            )
        )
    return verdicts


def summary_table(cells: Sequence[Cell], verdicts: Sequence[Verdict]) -> Table:
    table = Table(title="Shockwave across generated workloads (worst seed per column)")
    for column in (
        "cell",
        "jobs",
        "GPUs",
        "mean gap s",
        "lengths",
        "modes",
        "seeds",
        "makespan / LB",
        "/ best baseline",
        "worst FTF",
        "FTF > 1",
        "JCT / Gavel",
        "JCT / best fair",
        "FTF / best",
        "met",
    ):
        table.add_column(column, no_wrap=column == "cell")
    for cell in cells:
        mine = [v for v in verdicts if v.cell == cell.name]
        if not mine:
            continue
        table.add_row(
            cell.name,
            str(cell.jobs),
            str(cell.gpus),
            f"{cell.interarrival_s:g}",
            cell.length_mix,
            cell.mode_mix,
            str(len(mine)),
            f"{max(v.over_lower_bound for v in mine):.3f}",
            f"{max(v.over_best_baseline for v in mine):.3f}",
            f"{max(v.worst_ftf for v in mine):.2f}",
            f"{max(v.unfair_share for v in mine):.1%}",
            f"{max(v.jct_over_gavel for v in mine):.2f}",
            f"{max(v.jct_over_best_fair for v in mine):.2f}",
            f"{max(v.ftf_over_best_baseline for v in mine):.2f}",
            "yes" if all(v.met for v in mine) else "NO",
        )
    return table


def plot(verdicts: Sequence[Verdict], cells: Sequence[Cell], path: Path) -> None:
    """Per cell: Shockwave's worst makespan over the lower bound and over the best baseline,
    and its worst FTF, against the target lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c.name for c in cells if any(v.cell == c.name for v in verdicts)]
    worst = {name: [v for v in verdicts if v.cell == name] for name in names}
    xs = range(len(names))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, len(names) * 0.9), 7), sharex=True)
    top.bar(
        [x - 0.2 for x in xs],
        [max(v.over_lower_bound for v in worst[n]) for n in names],
        0.4,
        label="makespan / lower bound",
    )
    top.bar(
        [x + 0.2 for x in xs],
        [max(v.over_best_baseline for v in worst[n]) for n in names],
        0.4,
        label="makespan / best baseline",
    )
    top.axhline(MAKESPAN_SLACK, color="k", linestyle="--", linewidth=0.8)
    top.axhline(1.0, color="grey", linewidth=0.8)
    top.set_ylim(0.8, None)
    top.legend()
    bottom.bar(list(xs), [max(v.worst_ftf for v in worst[n]) for n in names], 0.5)
    bottom.axhline(WORST_FTF, color="k", linestyle="--", linewidth=0.8)
    bottom.set_ylabel("worst FTF")
    bottom.set_xticks(list(xs), names, rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as params: an int or a float where the value reads as one, else
    the string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        value: Any = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=Path("../shared/data/reference"))
    parser.add_argument("--seeds", type=int, default=2, help="seeds per cell (0, 1, ...)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--grid",
        choices=("generated", "real", "all"),
        default="generated",
        help="generated workloads (GRID), real-trace weeks (REAL_GRID) or both",
    )
    parser.add_argument(
        "--cells", default="", help="comma-separated cell names of either grid (default: --grid)"
    )
    parser.add_argument("--traces", type=Path, default=Path("../shared/data/public-traces"))
    parser.add_argument("--out", type=Path, default=Path("out/sweep"))
    parser.add_argument("--json", type=Path, default=None, help="default: <out>/sweep.json")
    parser.add_argument(
        "--shockwave-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Shockwave param for this sweep (str, int, float), e.g. packing_order=deadline",
    )
    args = parser.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=170)  # a log file keeps the whole table
    throughputs = args.reference / "throughputs" / "tacc_throughputs.json"
    if not throughputs.is_file():
        console.print(f"[red]no throughput table at {throughputs} (--reference)[/red]")
        return 2
    grids = {"generated": GRID, "real": REAL_GRID, "all": GRID + REAL_GRID}
    cells = list(grids[args.grid])
    if args.cells:
        every = GRID + REAL_GRID
        wanted = [c.strip() for c in args.cells.split(",") if c.strip()]
        unknown = sorted(set(wanted) - {c.name for c in every})
        if unknown:
            known = ", ".join(c.name for c in every)
            console.print(f"[red]unknown cells {', '.join(unknown)}; known: {known}[/red]")
            return 2
        cells = [c for c in every if c.name in wanted]
    if any(c.trace for c in cells):
        try:
            table = load_throughputs(throughputs)
            cells = [resolve(c, args.traces, table) for c in cells]
        except (OSError, ValueError) as error:
            console.print(f"[red]real-trace cells need --traces: {error}[/red]")
            return 2
    try:
        ours = parse_overrides(args.shockwave_param)
        make_params(get_policy("shockwave"), ours)
    except ValueError as error:
        console.print(f"[red]--shockwave-param: {error}[/red]")
        return 2
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    policies = ("shockwave", *BASELINES)
    # Longest first, so the slow Shockwave runs of big cells do not finish last alone.
    tasks = sorted(
        ((cell, seed, name) for cell in cells for seed in seeds for name in policies),
        key=lambda t: (t[2] != "shockwave", -t[0].jobs),
    )
    started = time.perf_counter()
    runs: list[Run] = []
    args.out.mkdir(parents=True, exist_ok=True)
    # Each run as it finishes, so that a sweep stopped early keeps what it measured.
    partial = args.out / "runs.jsonl"
    partial.write_text("", encoding="utf-8")
    with (
        ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool,
        Progress(console=console, transient=True) as progress,
    ):
        bar = progress.add_task("simulating", total=len(tasks))
        futures = [
            pool.submit(
                run_one,
                c,
                s,
                p,
                str(throughputs),
                ours if p == "shockwave" else None,
                str(args.traces),
            )
            for c, s, p in tasks
        ]
        for future in as_completed(futures):
            runs.append(future.result())
            with partial.open("a", encoding="utf-8") as lines:
                lines.write(json.dumps(asdict(runs[-1])) + "\n")
            progress.advance(bar)
    wall = time.perf_counter() - started
    verdicts = judge(runs, frozenset(c.name for c in cells if c.trace))
    console.print(summary_table(cells, verdicts))
    met = all(v.met for v in verdicts)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cpu = sum(r.cpu_s for r in runs)
    console.print(
        f"{len(runs)} runs in {wall:.0f} s wall ({cpu:.0f} CPU-seconds) on {args.workers} workers "
        f"({platform.processor() or platform.machine()}, load average {load:.1f} at the end); "
        + ("every cell meets the targets" if met else "[red]some cells miss the targets[/red]")
    )
    out_json = args.json or args.out / "sweep.json"
    out_json.write_text(
        json.dumps(
            {
                "cells": [asdict(c) for c in cells],
                "seeds": list(seeds),
                "wall_s": wall,
                "cpu_s": cpu,
                "workers": args.workers,
                "shockwave_params": ours,
                "all_met": met,
                "verdicts": [asdict(v) | {"met": v.met} for v in verdicts],
                "runs": [asdict(r) for r in runs],
            },
            indent=1,
        )
    )
    plot(verdicts, cells, args.out / "sweep.png")
    console.print(f"wrote {out_json} and {args.out / 'sweep.png'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
