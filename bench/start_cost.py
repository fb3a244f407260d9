"""How a policy's figures move with what a start costs and with when the policy sees progress.

Usage::

    python -m bench.start_cost --reference ../shared/data/reference --policy gavel
        [--overheads 20,30,40,70] [--lags 0,60] [--progress exact,whole,attempt] [--watch 66]
        [--seeds 1]

Runs ``simulate`` on the 120-job reference trace (32 GPUs in nodes of 4) once per pair of
``--overheads`` (the restart overhead, s: what each start costs; the replay's starts also cost
their start lag, 6 to 11 s on a quiet machine and 30 to 70 s at a load of 4 to 12) and
``--lags`` (s: the policy sees every running job's progress that much late, as the service
did when it planned from the progress reported half a round before the boundary; 0: exact,
the simulator's own) and ``--progress`` (``exact``: fractional epochs, the simulator's own;
``whole``: only the epochs a job has finished, what a shell that knows only the programs'
per-epoch reports sees: the service did until it credited a running job with the time since
its last report, :meth:`shockwave.domain.snapshot.ActiveJob.trained_for`; ``attempt``: the finished
epochs plus, while a job runs, what it trained of its next epoch in its current attempt only:
the service until it carried what a stopped attempt had trained, ``jobs.carried_s``). Prints
makespan, average JCT, worst FTF, the jobs' starts, and the times the ``--watch`` job was
started (Gavel's job 66).

``--seeds N``: the makespan of one run moves by a percent or two under any small change (a
plan a round late, a start a few seconds later), so one run says little about a change of that
size. With N > 1 each row is N runs: seed 0 the trace as is, seeds 1 to N-1 with every arrival
moved later by up to :data:`JITTER_S` seconds (uniform, by the seed): makespan and average
JCT as mean and standard deviation, the worst FTF of all, the starts' mean. Runs go to
``--workers`` processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import random
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.replay_parity import reference_files
from shockwave.domain.model import Cluster
from shockwave.domain.snapshot import PART_OF_NEXT_EPOCH, ActiveJob, Snapshot
from shockwave.policies.policy import Decision, Policy, get_policy, make_params, policy_names
from shockwave.simulation.metrics import summarize
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import InputError, load_throughputs, load_workload

PROGRESS_VIEWS = ("exact", "whole", "attempt")
JITTER_S = 3.0
"""Seconds by which ``--seeds`` moves each arrival later at most."""


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


def this_attempt(snapshot: Snapshot, started: dict[str, float]) -> Snapshot:
    """``snapshot`` as the service saw it before it carried a stopped attempt's training: each
    job at its finished epochs plus, while it runs, the part of its next epoch trained since
    its attempt started (``started``: job -> the decision time at which it was first seen
    running, kept up to date here: a job that holds no GPU loses its entry), under
    :data:`~shockwave.domain.snapshot.PART_OF_NEXT_EPOCH`. What it trained of that epoch before it
    was stopped is not seen."""
    jobs = []
    for job in snapshot.jobs:
        job_id, done = job.spec.job_id, job.progress.epochs_done
        whole = float(math.floor(done + 1e-9))
        seconds = job.epoch_seconds()
        part = 0.0
        if job.running and seconds:
            since = snapshot.now - started.setdefault(job_id, snapshot.now)
            part = min(done - whole, since / seconds, PART_OF_NEXT_EPOCH)
        else:
            started.pop(job_id, None)
        if whole + part != done:
            job = ActiveJob(job.spec, dataclasses.replace(job.progress, epochs_done=whole + part))
        jobs.append(job)
    return dataclasses.replace(snapshot, jobs=tuple(jobs))


@dataclasses.dataclass
class Lagging:
    """``policy`` deciding on the ``view`` of each snapshot (:data:`PROGRESS_VIEWS`) with
    running jobs ``lag_s`` behind (:func:`lagged`); records when ``watch`` was chosen."""

    policy: Policy
    lag_s: float
    watch: str
    view: str = "exact"
    chosen_at: list[float] = dataclasses.field(default_factory=list)
    _started: dict[str, float] = dataclasses.field(default_factory=dict)
    _previous: float | None = None

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def Params(self) -> Any:  # the policy interface's name
        return self.policy.Params

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        seen = lagged(snapshot, self.lag_s, self.view == "whole")
        if self.view == "attempt":
            # a job seen running for the first time started at the decision before (a
            # boundary's start; a mid-round fill started later, so it is credited a little more)
            if self._previous is not None:
                for job in snapshot.jobs:
                    if job.running:
                        self._started.setdefault(job.spec.job_id, self._previous)
            seen = this_attempt(seen, self._started)
        self._previous = snapshot.now
        decision = self.policy.decide(seen, params)
        if self.watch in decision.jobs:
            self.chosen_at.append(snapshot.now)
        return decision


def jittered(workload: Workload, seed: int) -> Workload:
    """``workload`` with every arrival moved later by up to :data:`JITTER_S` seconds (uniform,
    by ``seed``), in arrival order again; seed 0: unchanged."""
    if seed == 0:
        return workload
    rng = random.Random(seed)
    jobs = [
        dataclasses.replace(
            job,
            spec=dataclasses.replace(
                job.spec, arrival_s=job.spec.arrival_s + rng.uniform(0, JITTER_S)
            ),
        )
        for job in workload.jobs
    ]
    jobs.sort(key=lambda job: job.spec.arrival_s)
    return dataclasses.replace(workload, jobs=tuple(jobs))


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One simulation's figures; ``chosen_at``: when the watched job was chosen."""

    makespan_s: float
    avg_jct_s: float
    worst_ftf: float
    starts: int
    chosen_at: tuple[float, ...]


def run_one(
    workload: Workload, policy_name: str, overhead: float, lag: float, view: str, watch: str
) -> Run:
    policy = get_policy(policy_name)
    wrapped = Lagging(policy, lag, watch, view)
    result = simulate(
        workload,
        Cluster.of_gpus(32, 4),
        wrapped,  # type: ignore[arg-type]
        make_params(policy),
        SimSettings(restart_overhead_s=overhead),
    )
    metrics = summarize(result)
    return Run(
        metrics.makespan_s,
        metrics.avg_jct_s,
        metrics.worst_ftf,
        sum(job.restarts for job in result.jobs),
        tuple(wrapped.chosen_at),
    )


@functools.cache
def reference_workload(reference: Path, seed: int) -> Workload:
    """The reference trace's workload jittered by ``seed``, read once per process: a worker of
    ``--workers`` reads its own (a workload holds read-only mappings, which do not pickle)."""
    trace, trajectories, throughputs = reference_files(reference)
    return jittered(load_workload(trace, trajectories, load_throughputs(throughputs)), seed)


def run_seeded(
    reference: Path, seed: int, policy_name: str, overhead: float, lag: float, view: str, watch: str
) -> Run:
    """:func:`run_one` on :func:`reference_workload` (what a ``--workers`` process runs)."""
    return run_one(reference_workload(reference, seed), policy_name, overhead, lag, view, watch)


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


def positive(text: str) -> int:
    """``--seeds`` / ``--workers``: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, default=Path("../shared/data/reference"))
    parser.add_argument("--policy", default="gavel", choices=policy_names())
    parser.add_argument("--overheads", type=seconds_list, default=[20.0, 30.0, 40.0, 70.0])
    parser.add_argument("--lags", type=seconds_list, default=[0.0, 60.0])
    parser.add_argument("--progress", type=views_list, default=["exact"])
    parser.add_argument("--watch", default="66")
    parser.add_argument("--seeds", type=positive, default=1)
    parser.add_argument("--workers", type=positive, default=2)
    args = parser.parse_args(argv)
    try:
        reference_workload(args.reference, 0)  # a bad reference fails here, on one line
    except InputError as error:
        print(f"start_cost: {error}", file=sys.stderr)
        return 2
    rows = [(o, lag, view) for o in args.overheads for lag in args.lags for view in args.progress]
    tasks = [
        (args.reference, seed, args.policy, *row, args.watch)
        for row in rows
        for seed in range(args.seeds)
    ]
    if args.workers > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(min(args.workers, len(tasks))) as pool:
            runs = list(pool.map(run_seeded, *zip(*tasks, strict=True)))
    else:
        runs = [run_seeded(*task) for task in tasks]
    title = f"{args.policy}: start cost and progress lag (simulate"
    title += f", {args.seeds} seeds: mean and sd)" if args.seeds > 1 else ")"
    table = Table(title=title)
    columns = ("overhead s", "lag s", "progress", "makespan s", "avg JCT s", "worst FTF", "starts")
    for column in columns:
        table.add_column(column, justify="right")
    table.add_column(f"job {args.watch} chosen at (s)")
    for i, (overhead, lag, view) in enumerate(rows):
        group = runs[i * args.seeds : (i + 1) * args.seeds]
        first = group[0]
        shown = ", ".join(f"{t:,.0f}" for t in first.chosen_at[:6])
        more = len(first.chosen_at) - 6
        table.add_row(
            f"{overhead:g}",
            f"{lag:g}",
            view,
            _spread([r.makespan_s for r in group]),
            _spread([r.avg_jct_s for r in group]),
            f"{max(r.worst_ftf for r in group):.2f}",
            f"{statistics.mean(r.starts for r in group):,.0f}",
            shown + (f" (+{more})" if more > 0 else "") + (" (seed 0)" if args.seeds > 1 else ""),
        )
    Console(width=200).print(table)
    return 0


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    return f"{statistics.mean(values):,.0f} ± {statistics.pstdev(values):,.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
