"""Wall time of a full simulation of the 120-job reference trace on 32 GPUs, per baseline.

Usage::

    python bench/simulate.py --reference ../shared/data/reference [--policies gavel,mst]
        [--repeats 3] [--json bench-simulate.json]

For each policy it runs the whole simulation ``--repeats`` times and reports the median wall
seconds, the number of rounds, decisions per second of wall time (rounds / median seconds) and
the median time of one policy decision. The workload is read once, outside the timed part.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shockwave.domain.model import Cluster
from shockwave.policies import BASELINES
from shockwave.policies.policy import Policy
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import (
    InputError,
    load_throughputs,
    load_workload,
    policy_params,
    resolve_policies,
)

TRACE_NAME = "120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic"
GPUS = 32
GPUS_PER_NODE = 4


@dataclass(frozen=True, slots=True)
class Timing:
    """One policy's figures: seconds are wall time of the whole simulation (median of repeats)."""

    policy: str
    repeats: int
    median_s: float
    min_s: float
    rounds: int
    decisions_per_s: float
    decision_median_ms: float
    makespan_s: float


def load_reference(reference: Path) -> Workload:
    """The 120-job trace with its trajectories and the TACC throughput table."""
    table = load_throughputs(reference / "throughputs" / "tacc_throughputs.json")
    return load_workload(
        reference / "traces" / f"{TRACE_NAME}.trace",
        reference / "trajectories" / f"{TRACE_NAME}.tacc.trajectories.json",
        table,
    )


def time_policy(workload: Workload, cluster: Cluster, policy: Policy, repeats: int) -> Timing:
    params = policy_params(policy, None)
    walls: list[float] = []
    decisions: list[float] = []
    rounds = 0
    makespan = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        result = simulate(workload, cluster, policy, params, SimSettings(), timer=time.perf_counter)
        walls.append(time.perf_counter() - started)
        decisions.extend(r.decision_seconds for r in result.rounds)
        rounds = len(result.rounds)
        makespan = result.makespan_s
    median = statistics.median(walls)
    return Timing(
        policy=policy.name,
        repeats=repeats,
        median_s=median,
        min_s=min(walls),
        rounds=rounds,
        decisions_per_s=rounds / median if median > 0 else 0.0,
        decision_median_ms=statistics.median(decisions) * 1000 if decisions else 0.0,
        makespan_s=makespan,
    )


def timing_table(timings: Sequence[Timing], jobs: int, repeats: int) -> Table:
    table = Table(
        title=f"Simulation of {jobs} jobs on {GPUS} GPUs, median of {repeats} runs",
        title_justify="left",
    )
    table.add_column("policy", style="bold", no_wrap=True)
    for header in ("wall s", "min s", "rounds", "decisions/s", "decide median ms", "makespan s"):
        table.add_column(header, justify="right")
    for t in timings:
        table.add_row(
            t.policy,
            f"{t.median_s:.3f}",
            f"{t.min_s:.3f}",
            str(t.rounds),
            f"{t.decisions_per_s:,.0f}",
            f"{t.decision_median_ms:.3f}",
            f"{t.makespan_s:,.0f}",
        )
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reference", type=Path, required=True, help="reference data directory")
    parser.add_argument("--policies", default=",".join(BASELINES), help="comma-separated names")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy (median taken)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    try:
        policies = resolve_policies(args.policies)
        workload = load_reference(args.reference)
    except InputError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", soft_wrap=True)
        return 2
    cluster = Cluster.of_gpus(GPUS, GPUS_PER_NODE)
    timings = [time_policy(workload, cluster, policy, args.repeats) for policy in policies]
    console.print(timing_table(timings, len(workload.jobs), args.repeats))
    if args.json is not None:
        record = {
            "command": " ".join(["python", "bench/simulate.py", *(argv or sys.argv[1:])]),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "timings": [asdict(t) for t in timings],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        console.print(f"Wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
