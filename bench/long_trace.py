"""CPU and wall time to simulate a months-long real trace: ITP cluster 4, all 60 days, on 512 GPUs.

Usage::

    python -m bench.long_trace [--traces ../shared/data/public-traces]
        [--throughputs ../shared/data/reference/throughputs/tacc_throughputs.json]
        [--policies shockwave] [--gpus 512] [--days 60] [--bound-s 600] [--log-every N]
        [--json FILE]

The log (15,802 jobs of 1 to 64 GPUs) is imported by ``shockwave import-trace``'s rule with
seed 0 (:func:`shockwave.workloads.trace_import.import_job_log`), the first ``--days`` days of it,
on ``--gpus`` GPUs in nodes of 8; each policy is simulated once with the simulator's default
settings. Printed per policy: wall and CPU seconds of the simulation (the import and the
reading of files are not timed), rounds, makespan against its lower bound, average JCT and
worst FTF, and the mean 1-minute load average over the run. A progress bar (jobs finished,
simulated time) goes to stderr when it is a terminal.

Exit status 1 when a policy's simulation took longer than ``--bound-s`` CPU seconds (the
target: 10 minutes for Shockwave on this two-core machine; CPU time, because on a shared
machine wall time counts the other processes too: on a quiet one the two agree), or left a
job unfinished; 2 on bad input. ``--log-every N`` prints a line every N rounds (simulated
time, jobs finished, CPU seconds so far) to stderr, for runs without a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from shockwave.domain.model import Cluster
from shockwave.simulation.metrics import summarize
from shockwave.simulation.simulator import simulate
from shockwave.workloads.trace_import import ImportOptions, import_job_log
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import (
    InputError,
    load_throughputs,
    policy_params,
    resolve_policies,
)
from solver_service.collector import quiet_collector

CLUSTER_LOG = "itp/cluster04.csv"
GPUS_PER_NODE = 8
DAY_S = 86_400.0


def load(traces: Path, throughputs: Path, days: float) -> Workload:
    """The first ``days`` days of ITP cluster 4 as a workload (import-trace's rule, seed 0)."""
    path = traces / CLUSTER_LOG
    text = path.read_text(encoding="utf-8")
    options = ImportOptions(seed=0, until=days * DAY_S, skip_bad_rows=True)
    # the log's clock starts at collection, the first job a little after; `until` is in it
    return import_job_log(text, str(path), load_throughputs(throughputs), options).workload


def run(
    workload: Workload, cluster: Cluster, policy_name: str, err: Console, log_every: int = 0
) -> dict[str, float]:
    """Simulate ``policy_name`` once; its figures and wall and CPU seconds. ``log_every``: a
    line to ``err`` every that many rounds (0: none)."""
    (policy,) = resolve_policies(policy_name)
    params = policy_params(policy, None)
    columns = (
        TextColumn("[bold]{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs  t={task.fields[now]:>11,.0f} s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, disable=not err.is_terminal) as progress:
        task = progress.add_task(policy.name, total=len(workload.jobs), now=0.0)

        rounds = [0]
        started = time.process_time()
        loads = [os.getloadavg()[0]]

        def on_round(now: float, finished: int, total: int, task_id: TaskID = task) -> None:
            progress.update(task_id, completed=finished, now=now)
            rounds[0] += 1
            if rounds[0] % 500 == 0:
                loads.append(os.getloadavg()[0])
            if log_every and rounds[0] % log_every == 0:
                cpu_s = time.process_time() - started
                err.print(
                    f"{policy.name}: round {rounds[0]:,}, t={now:,.0f} s, {finished:,}/{total:,}"
                    f" jobs finished, {cpu_s:,.1f} s CPU",
                    highlight=False,
                )

        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(workload, cluster, policy, params, on_round=on_round)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        loads.append(os.getloadavg()[0])
    metrics = summarize(result)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "load_average": sum(loads) / len(loads),
        "rounds": len(result.rounds),
        "makespan_s": metrics.makespan_s,
        "lower_bound_s": metrics.lower_bound_s,
        "avg_jct_s": metrics.avg_jct_s,
        "worst_ftf": metrics.worst_ftf,
        "jobs_completed": metrics.jobs_completed,
        "jobs_total": metrics.jobs_total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--traces",
        type=Path,
        default=Path("../shared/data/public-traces"),
        help="folder of the public traces (holding itp/cluster04.csv)",
    )
    parser.add_argument(
        "--throughputs",
        type=Path,
        default=Path("../shared/data/reference/throughputs/tacc_throughputs.json"),
        help="throughput table the import assigns epoch times from",
    )
    parser.add_argument(
        "--policies", default="shockwave", help="comma-separated policies to simulate"
    )
    parser.add_argument("--gpus", type=int, default=512, help="GPUs of the cluster (nodes of 8)")
    parser.add_argument("--days", type=float, default=60.0, help="first days of the log to run")
    parser.add_argument(
        "--bound-s",
        type=float,
        default=600.0,
        help="most CPU seconds a policy's simulation may take (exit status 1 past it)",
    )
    parser.add_argument(
        "--log-every",
        type=int,
        default=0,
        help="print progress to stderr every this many rounds (0: only the progress bar)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    out, err = Console(), Console(stderr=True)
    if args.gpus <= 0 or args.gpus % GPUS_PER_NODE or args.days <= 0 or args.bound_s <= 0:
        err.print(f"--gpus must be a positive multiple of {GPUS_PER_NODE}; --days, --bound-s > 0")
        return 2
    if args.log_every < 0:
        err.print("--log-every must be >= 0")
        return 2
    try:
        workload = load(args.traces, args.throughputs, args.days)
        names = [p.name for p in resolve_policies(args.policies)]
    except (OSError, InputError, ValueError) as error:
        err.print(f"long_trace: {error}")
        return 2
    cluster = Cluster.of_gpus(args.gpus, GPUS_PER_NODE)
    out.print(
        f"ITP cluster 4, first {args.days:g} days: {len(workload.jobs)} jobs on {args.gpus} GPUs"
        f" ({args.gpus // GPUS_PER_NODE} nodes x {GPUS_PER_NODE}); bound {args.bound_s:,.0f} s"
    )
    with quiet_collector():
        figures = {name: run(workload, cluster, name, err, args.log_every) for name in names}
    headers = (
        "policy",
        "wall s",
        "cpu s",
        "load",
        "rounds",
        "makespan / bound",
        "avg JCT s",
        "worst FTF",
    )
    table = Table(*headers)
    for name, f in figures.items():
        table.add_row(
            name,
            f"{f['wall_s']:,.1f}",
            f"{f['cpu_s']:,.1f}",
            f"{f['load_average']:.1f}",
            f"{f['rounds']:,.0f}",
            f"{f['makespan_s'] / f['lower_bound_s']:.3f}",
            f"{f['avg_jct_s']:,.0f}",
            f"{f['worst_ftf']:.2f}",
        )
    out.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"jobs": len(workload.jobs), "runs": figures}, indent=2))
    slow = [name for name, f in figures.items() if f["cpu_s"] > args.bound_s]
    unfinished = [n for n, f in figures.items() if f["jobs_completed"] < f["jobs_total"]]
    if slow or unfinished:
        out.print(
            f"MISSED: over {args.bound_s:,.0f} s of CPU: {slow or 'none'}; unfinished: {unfinished}"
        )
        return 1
    out.print(f"every policy within {args.bound_s:,.0f} s of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
