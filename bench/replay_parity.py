"""Parity: ``shockwave replay`` (the real service, simulated agents) against ``shockwave
simulate`` (the core's engine on a virtual clock), same workload, cluster and policy.

Usage::

    python -m bench.replay_parity --reference ../shared/data/reference
        [--cases ref-shockwave,ref-gavel,mixed-shockwave,flood-shockwave,itp-shockwave,...]
        [--modes embedded,distributed] [--time-scale 120] [--long-poll | --no-long-poll]
        [--traces ../shared/data/public-traces] [--itp-cluster 06] [--itp-window 78000:84000]
        [--itp-gpus 160] [--out out/parity] [--json F]

Cases: ``ref-<policy>``: the 120-job reference trace on 32 GPUs in nodes of 4;
``mixed-<policy>``: a generated workload of small jobs (``--mixed-jobs``, default 30, seed 1)
on mixed nodes ``--mixed-nodes`` (default 2x8,3x4,2x2: 32 GPUs); ``flood-<policy>`` and
``flood31-<policy>``: the reference trace with its jobs drawn into tenants ``a`` and ``b``
(``--tenants a:5,b:1``, seed 0: 94 jobs against 26) of weights 1:1 and 3:1, each job submitted
by a user of its tenant; ``itp-<policy>``: a window of a production week with gangs wider than
a node, imported by ``shockwave import-trace`` (default rule, seed 0) from
``<traces>/itp/cluster<NN>.csv``: the jobs arriving in ``--itp-window`` START:END seconds from
the start of the cluster's busiest week (the week of the ``bench.sweep --grid real`` cells), on
``--itp-gpus`` GPUs in nodes of 8. The default is the smallest busiest week with such gangs,
cluster06's (312 jobs), and the 6 hours from 78,000 s into it: 14 jobs, nine 32-GPU gangs and
five of 4 GPUs, on the 160 GPUs of that week's 0.8x cell (about 17,000 simulated seconds).

Each replay runs the ``shockwave replay`` command in a process of its own (the reference trace
is about 22,000 simulated seconds, at 120x three to four minutes), the simulation runs in this
process. Per case it prints makespan, average JCT, worst FTF and the FTF>1 share of both, the
worst tenant's ratio, the differences, the replay's plan sources, fills, late boundaries and
events, and whether the issue's bounds hold: makespan and average JCT within 3% (5% for the
distributed mode), worst FTF within 0.1, FTF>1 share within 2 points, the worst tenant's ratio
(``worst_tenant_ratio``) within 0.05, every job completed, no event lost or duplicated.
``--long-poll``/``--no-long-poll`` is handed to each replay (default: the replay's own default
for the mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shockwave.domain.model import Cluster
from shockwave.policies.policy import get_policy, make_params
from shockwave.simulation.metrics import RunMetrics, summarize
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.generator import SIZE_CLASSES, generate_workload
from shockwave.workloads.tenant_workload import assign_tenants, parse_tenant_values, tenant_settings
from shockwave.workloads.trace_import import WEEK_S, busiest_window, parse_job_log
from shockwave.workloads.traces import format_trace, format_trajectories
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import load_throughputs, load_workload
from shockwave_cli.runtime.supervision import shockwave_argv

REF_NAME = "120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic"
BOUNDS = {"embedded": 0.03, "distributed": 0.05}
TENANT_RATIO_BOUND = 0.05
FLOODS = {
    "flood": ["--tenants", "a:5,b:1", "--tenant-weights", "a:1,b:1"],
    "flood31": ["--tenants", "a:5,b:1", "--tenant-weights", "a:3,b:1"],
}
"""Case kind -> the tenant options of ``simulate`` and ``replay`` (seed 0, the default)."""


def with_tenant_options(workload: Workload, options: list[str]) -> Workload:
    """``workload`` with the tenants and weights that ``options`` (:data:`FLOODS`) give."""
    named = dict(zip(options[::2], options[1::2], strict=True))
    drawn = assign_tenants(workload, parse_tenant_values(named["--tenants"], "--tenants"), 0)
    weights = parse_tenant_values(named["--tenant-weights"], "--tenant-weights")
    return dataclasses.replace(drawn, tenants=tenant_settings(weights, {}, {}))


def reference_files(reference: Path) -> tuple[Path, Path, Path]:
    return (
        reference / "traces" / f"{REF_NAME}.trace",
        reference / "trajectories" / f"{REF_NAME}.tacc.trajectories.json",
        reference / "throughputs" / "tacc_throughputs.json",
    )


def mixed_files(out: Path, throughputs: Path, jobs: int, seed: int) -> tuple[Path, Path]:
    """A generated workload of small jobs (0.2 to 8 GPU-hours: a run of minutes, not of the
    hours one XL job takes), written in the reference formats (the replay reads files)."""
    small = (dataclasses.replace(SIZE_CLASSES[0], probability=1.0),)
    workload = generate_workload(
        jobs, seed=seed, throughputs=load_throughputs(throughputs), size_classes=small
    )
    trace, trajectories = out / "mixed.trace", out / "mixed.trajectories.json"
    trace.write_text(format_trace(workload), encoding="utf-8")
    trajectories.write_text(json.dumps(format_trajectories(workload)), encoding="utf-8")
    return trace, trajectories


def itp_files(
    traces: Path, cluster: str, window: str, throughputs: Path, out: Path
) -> tuple[Path, Path]:
    """``shockwave import-trace`` of the jobs arriving in ``window`` (``START:END`` seconds
    from the start of the cluster's busiest week), rebased to 0, in the trace formats."""
    csv = traces / "itp" / f"cluster{cluster}.csv"
    start_s, _, end_s = window.partition(":")
    start, end = float(start_s), float(end_s)
    if not 0 <= start < end <= WEEK_S:
        raise ValueError(f"--itp-window must be START:END with 0 <= START < END <= {WEEK_S:g}")
    jobs, _, _ = parse_job_log(csv.read_text(encoding="utf-8"), str(csv))
    week_start, _ = busiest_window(jobs, WEEK_S)
    trace, trajectories = out / f"itp{cluster}.trace", out / f"itp{cluster}.trajectories.json"
    argv = [
        *shockwave_argv(),
        "import-trace",
        "--csv",
        str(csv),
        "--throughputs",
        str(throughputs),
        "--out-trace",
        str(trace),
        "--out-trajectories",
        str(trajectories),
        "--since",
        f"{week_start + start:.0f}",
        "--until",
        f"{week_start + end:.0f}",
        "--seed",
        "0",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return trace, trajectories


def simulated(workload: Workload, cluster: Cluster, policy: str) -> RunMetrics:
    chosen = get_policy(policy)
    return summarize(simulate(workload, cluster, chosen, make_params(chosen), SimSettings()))


def replayed(
    trace: Path,
    trajectories: Path,
    throughputs: Path,
    cluster: list[str],
    policy: str,
    mode: str,
    time_scale: float,
    out: Path,
    long_poll: bool | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    argv = [
        *shockwave_argv(),
        "replay",
        "--trace",
        str(trace),
        "--trajectories",
        str(trajectories),
        "--throughputs",
        str(throughputs),
        *cluster,
        "--round-seconds",
        "120",
        "--time-scale",
        f"{time_scale:g}",
        "--policy",
        policy,
        "--mode",
        mode,
        "--out",
        str(out),
    ]
    argv += extra or []
    if long_poll is not None:
        argv.append("--long-poll" if long_poll else "--no-long-poll")
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    record: dict[str, Any] = json.loads((out / "metrics.json").read_text())[0]
    record["bench_wall_s"] = time.perf_counter() - began
    return record


def compare(sim: RunMetrics, rep: dict[str, Any], mode: str) -> dict[str, Any]:
    bound = BOUNDS[mode]
    events = rep["replay"]["events"]
    row = {
        "sim": {
            "makespan_s": sim.makespan_s,
            "avg_jct_s": sim.avg_jct_s,
            "worst_ftf": sim.worst_ftf,
            "unfair_fraction": sim.unfair_fraction,
            "jobs_completed": sim.jobs_completed,
            "worst_tenant_ratio": sim.worst_tenant_ratio,
        },
        "replay": {
            k: rep[k]
            for k in (
                "makespan_s",
                "avg_jct_s",
                "worst_ftf",
                "unfair_fraction",
                "jobs_completed",
                "worst_tenant_ratio",
            )
        },
        "makespan_diff": rep["makespan_s"] / sim.makespan_s - 1,
        "avg_jct_diff": rep["avg_jct_s"] / sim.avg_jct_s - 1,
        "worst_ftf_diff": rep["worst_ftf"] - sim.worst_ftf,
        "unfair_points_diff": 100 * (rep["unfair_fraction"] - sim.unfair_fraction),
        "tenant_ratio_diff": rep["worst_tenant_ratio"] - sim.worst_tenant_ratio,
        "plan_sources": rep["replay"]["plan_sources"],
        "fills": rep["replay"]["fills"],
        "late_boundaries": rep["replay"]["late_boundaries"],
        "events": events,
        "wall_s": rep["bench_wall_s"],
    }
    row["pass"] = (
        abs(row["makespan_diff"]) <= bound
        and abs(row["avg_jct_diff"]) <= bound
        and abs(row["worst_ftf_diff"]) <= 0.1
        and abs(row["unfair_points_diff"]) <= 2.0
        and abs(row["tenant_ratio_diff"]) <= TENANT_RATIO_BOUND
        and rep["jobs_completed"] == rep["jobs_total"]
        and events["lost"] == 0
        and events["duplicated"] == 0
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, default=Path("../shared/data/reference"))
    parser.add_argument(
        "--cases",
        default="ref-shockwave,ref-gavel,mixed-shockwave,mixed-gavel",
        help="comma-separated: ref-, mixed-, flood- or flood31- followed by a policy",
    )
    parser.add_argument("--modes", default="embedded")
    parser.add_argument("--time-scale", type=float, default=120.0)
    parser.add_argument("--mixed-nodes", default="2x8,3x4,2x2")
    parser.add_argument("--mixed-jobs", type=int, default=30)
    parser.add_argument("--mixed-seed", type=int, default=1)
    parser.add_argument("--traces", type=Path, default=Path("../shared/data/public-traces"))
    parser.add_argument("--itp-cluster", default="06", help="the ITP cluster of itp cases")
    parser.add_argument(
        "--itp-window",
        default="78000:84000",
        help="itp cases: START:END seconds from the start of the cluster's busiest week",
    )
    parser.add_argument("--itp-gpus", type=int, default=160, help="itp cases: GPUs, nodes of 8")
    parser.add_argument("--out", type=Path, default=Path("out/parity"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--long-poll", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    trace, trajectories, throughputs = reference_files(args.reference)
    table = load_throughputs(throughputs)
    console = Console(width=220)
    rows: list[dict[str, Any]] = []
    for case in args.cases.split(","):
        kind, _, policy = case.partition("-")
        extra = FLOODS.get(kind, [])
        if kind == "ref" or extra:
            files = (trace, trajectories)
            cluster, flags = Cluster.of_gpus(32, 4), ["--gpus", "32", "--gpus-per-node", "4"]
        elif kind == "mixed":
            files = mixed_files(args.out, throughputs, args.mixed_jobs, args.mixed_seed)
            cluster, flags = Cluster.parse(args.mixed_nodes), ["--nodes", args.mixed_nodes]
        elif kind == "itp":
            try:
                files = itp_files(
                    args.traces, args.itp_cluster, args.itp_window, throughputs, args.out
                )
            except ValueError as error:
                parser.error(str(error))
            cluster = Cluster.of_gpus(args.itp_gpus, 8)
            flags = ["--gpus", str(args.itp_gpus), "--gpus-per-node", "8"]
        else:
            parser.error(f"unknown case {case!r}")
        workload = load_workload(*files, table)
        if extra:
            workload = with_tenant_options(workload, extra)
        sim = simulated(workload, cluster, policy)
        for mode in args.modes.split(","):
            out = args.out / f"{case}-{mode}"
            rep = replayed(
                *files,
                throughputs,
                flags,
                policy,
                mode,
                args.time_scale,
                out,
                args.long_poll,
                extra,
            )
            row = {"case": case, "mode": mode, **compare(sim, rep, mode)}
            rows.append(row)
            console.print(_table([row]))
            if args.json:  # after each case: a long run stopped early keeps what it measured
                args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    console.print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r["pass"] for r in rows) else 1


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="replay vs simulate")
    for name in (
        "case",
        "mode",
        "makespan s sim/replay",
        "diff",
        "avg JCT s sim/replay",
        "diff",
        "worst FTF sim/replay",
        "FTF>1 sim/replay",
        "worst tenant sim/replay",
        "done",
        "sources plan/prev/greedy",
        "fills",
        "late",
        "events lost/dup",
        "wall s",
        "pass",
    ):
        table.add_column(name)
    for r in rows:
        s, p, src = r["sim"], r["replay"], r["plan_sources"] or {}
        table.add_row(
            r["case"],
            r["mode"],
            f"{s['makespan_s']:,.0f} / {p['makespan_s']:,.0f}",
            f"{100 * r['makespan_diff']:+.1f}%",
            f"{s['avg_jct_s']:,.0f} / {p['avg_jct_s']:,.0f}",
            f"{100 * r['avg_jct_diff']:+.1f}%",
            f"{s['worst_ftf']:.2f} / {p['worst_ftf']:.2f}",
            f"{100 * s['unfair_fraction']:.1f}% / {100 * p['unfair_fraction']:.1f}%",
            f"{s['worst_tenant_ratio']:.2f} / {p['worst_tenant_ratio']:.2f}",
            f"{p['jobs_completed']}",
            f"{src.get('plan')}/{src.get('previous_plan')}/{src.get('greedy')}",
            f"{r['fills']}",
            f"{r['late_boundaries']}",
            f"{r['events']['lost']}/{r['events']['duplicated']}",
            f"{r['wall_s']:.0f}",
            "yes" if r["pass"] else "NO",
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
