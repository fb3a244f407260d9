"""How a policy's figures move with what a start costs and with when the policy sees progress.

Usage::

    python -m bench.start_cost --reference ../shared/data/reference --policy gavel
        [--overheads 20,30,40,70] [--lags 0,60] [--progress exact,whole] [--watch 66]

Runs ``simulate`` on the 120-job reference trace (32 GPUs in nodes of 4) once per pair of
``--overheads`` (the restart overhead, s: what each start costs; the replay's starts also cost
their start lag, 6 to 11 s on a quiet machine and 30 to 70 s at a load of 4 to 12) and
``--lags`` (s: the policy sees every running job's progress that much late, as the service
did when it planned from the progress reported half a round before the boundary; 0: exact,
the simulator's own) and ``--progress`` (``exact``: fractional epochs, the simulator's own;
``whole``: only the epochs a job has finished, what a shell that knows only the programs'
per-epoch reports sees: the service did until it credited a running job with the time since
its last report, :meth:`shockwave.snapshot.ActiveJob.trained_for`). Prints makespan, average
JCT, worst FTF, the jobs' starts, and the times the ``--watch`` job was started (issue 15:
Gavel's job 66).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.replay_parity import reference_files
from shockwave.metrics import summarize
from shockwave.model import Cluster
from shockwave.policy import Decision, Policy, get_policy, make_params, policy_names
from shockwave.simulator import SimSettings, simulate
from shockwave.snapshot import ActiveJob, Snapshot
from shockwave_cli.inputs import InputError, load_throughputs, load_workload

PROGRESS_VIEWS = ("exact", "whole")


def lagged(snapshot: Snapshot, lag_s: float, whole: bool = False) -> Snapshot:
    """``snapshot`` with each running job ``lag_s`` seconds of training behind (at its epoch
    time, never below 0 epochs); ``whole``: then every job at the whole epochs it has
    finished."""
    if lag_s <= 0 and not whole:
        return snapshot
    jobs = []
    for job in snapshot.jobs:
        done = job.progress.epochs_done
        seconds = job.epoch_seconds()
        if lag_s > 0 and job.running and seconds:
            done = max(0.0, done - lag_s / seconds)
        if whole:
            done = float(math.floor(done + 1e-9))
        if done != job.progress.epochs_done:
            job = ActiveJob(job.spec, dataclasses.replace(job.progress, epochs_done=done))
        jobs.append(job)
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


@dataclasses.dataclass
class Lagging:
    """``policy`` deciding on :func:`lagged` snapshots; records when ``watch`` was chosen."""

    policy: Policy
    lag_s: float
    watch: str
    whole: bool = False
    chosen_at: list[float] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def Params(self) -> Any:  # the policy interface's name
        return self.policy.Params

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        decision = self.policy.decide(lagged(snapshot, self.lag_s, self.whole), params)
        if self.watch in decision.jobs:
            self.chosen_at.append(snapshot.now)
        return decision


def seconds_list(text: str) -> list[float]:
    """``--overheads`` / ``--lags``: comma-separated seconds, each finite and >= 0."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of seconds"
        ) from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be a finite number >= 0")
    return values


def views_list(text: str) -> list[str]:
    """``--progress``: comma-separated views, each one of :data:`PROGRESS_VIEWS`."""
    views = [x.strip() for x in text.split(",")]
    wrong = [x for x in views if x not in PROGRESS_VIEWS]
    if wrong:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, wrong))}: each must be one of {', '.join(PROGRESS_VIEWS)}"
        )
    return views


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, default=Path("../shared/data/reference"))
    parser.add_argument("--policy", default="gavel", choices=policy_names())
    parser.add_argument("--overheads", type=seconds_list, default=[20.0, 30.0, 40.0, 70.0])
    parser.add_argument("--lags", type=seconds_list, default=[0.0, 60.0])
    parser.add_argument("--progress", type=views_list, default=["exact"])
    parser.add_argument("--watch", default="66")
    args = parser.parse_args(argv)
    trace, trajectories, throughputs = reference_files(args.reference)
    try:
        workload = load_workload(trace, trajectories, load_throughputs(throughputs))
    except InputError as error:
        print(f"start_cost: {error}", file=sys.stderr)
        return 2
    table = Table(title=f"{args.policy}: start cost and progress lag (simulate)")
    columns = ("overhead s", "lag s", "progress", "makespan s", "avg JCT s", "worst FTF", "starts")
    for column in columns:
        table.add_column(column, justify="right")
    table.add_column(f"job {args.watch} chosen at (s)")
    runs = [(o, lag, view) for o in args.overheads for lag in args.lags for view in args.progress]
    for overhead, lag, view in runs:
        policy = get_policy(args.policy)
        wrapped = Lagging(policy, lag, args.watch, whole=view == "whole")
        result = simulate(
            workload,
            Cluster.of_gpus(32, 4),
            wrapped,  # type: ignore[arg-type]
            make_params(policy),
            SimSettings(restart_overhead_s=overhead),
        )
        metrics = summarize(result)
        shown = ", ".join(f"{t:,.0f}" for t in wrapped.chosen_at[:6])
        more = len(wrapped.chosen_at) - 6
        table.add_row(
            f"{overhead:g}",
            f"{lag:g}",
            view,
            f"{metrics.makespan_s:,.0f}",
            f"{metrics.avg_jct_s:,.0f}",
            f"{metrics.worst_ftf:.2f}",
            f"{sum(job.restarts for job in result.jobs):,}",
            shown + (f" (+{more})" if more > 0 else ""),
        )
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
