"""An all-knowing elastic schedule, run through the real simulator.

Usage::

    python -m bench.elastic_oracle --trace F --trajectories F --throughputs F --gpus 32
        [--gpus-per-node 4] [--elastic-max-gpus 8] [--beta 1.0 ...] [--target S]
        [--ftf-cap C] [--makespan-cap S] [--margin S] [--urgent-order deadline|laxity]
        [--order area|smith|arrival] [--online [--online-ftf-cap C] [--path-theta T]] [--future]
        [--no-shrink] [--json OUT]

docs/benchmarks.md lists it beside the elastic bounds.

Why: elastic Shockwave is asked for an average JCT 1.5x better than rigid Shockwave's
(5,219 s on the 120-job trace). ``bench/elastic_bound.py`` bounds what any schedule can reach
by relaxations (no restarts, fractional GPUs, a job's best rate in every regime); this script
builds a real schedule that knows everything a policy cannot (every job's true trajectory and
its true speed at every count) and runs it through ``shockwave.simulation.simulator.simulate``, so
the 20 s restarts, whole GPUs, placement in nodes and each regime's own rate are charged. If even
this schedule stays above the target, the target is out of reach of any practical policy; if
it gets below, what it does is what the elastic planner would have to learn.

The schedule (``OraclePolicy``, a throwaway :class:`~shockwave.policies.policy.Policy`; not
registered, not a production policy) decides every round from the truth
(``SimSettings.reveal_trajectories``):

- *Order*: shortest remaining area first, the area ``min_g g R_j(g)`` with ``R_j(g)`` the job's
  true remaining seconds on g GPUs (a running job's area less ``restart_s`` GPU-seconds, so
  that a job only a little shorter does not preempt it). This is SRPT on the one machine the
  cluster would be if every job scaled perfectly (the ``srpt`` bound's order). With
  ``--order smith``, once the widths are chosen (below) the jobs are sorted again by their
  area at the width chosen, ``g_j R_j(g_j)`` (Smith's rule on what each job will really use).
- *Width* (marginal efficiency): each job j takes the width g that minimizes its own finish
  plus the delay it imposes on the ``n_j`` jobs ordered after it,
  ``R_j(g) + c_j(g) + beta n_j g R_j(g) / G`` (``c_j(g)``: ``restart_s`` when g is not its
  width now, ``G`` the GPUs). A wide job finishes sooner but spends more GPU-seconds, which
  delay, in the fluid picture of the cluster, every job behind it by their share over the G
  GPUs: beta = 1 prices exactly that; beta < 1 widens more, beta > 1 less.
  ``--future`` also counts, in ``n_j``, the jobs that have not arrived yet and are longer
  than j (the oracle knows they will queue behind it).
- *Packing*: in that order, each job at its width, else at the widest of its counts that
  still fits (when ``--shrink``), until the GPUs run out; every active job's width is named
  in ``Decision.widths`` and the whole order is the decision's next column, so that the
  engine's mid-round fills start the next jobs in this order at their widths.
- *Deadlines* (optional): ``--ftf-cap`` gives each job the finish that keeps its reference FTF
  at the cap, ``--makespan-cap`` a finish for every job. A job that could no longer meet its
  deadline at its width (or at its widest, ``--margin`` seconds ahead) is urgent: urgent jobs
  go first, earliest deadline first, each at the narrowest count that still meets it (a
  running one keeps its count while that does).
- ``--online``: instead of the truth, what a scheduler knows: a job's remaining epochs at its
  current batch size's epoch time (measured, else declared), with ``--online-ftf-cap`` the
  FTF deadlines from the declared profile and ``--path-theta`` a makespan rule from the work
  left. It shows how much of the schedule's gain needs the future.

Prints, for each beta, makespan, average JCT, worst FTF (reference definition, as the CLI's
metrics), the share of jobs over FTF 1, utilization and restarts, with the target beside them.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bench.elastic_bound import add_elastic_inputs, load_elastic
from shockwave.domain.model import Cluster, JobSpec, Regime
from shockwave.domain.snapshot import ActiveJob, Snapshot
from shockwave.market import heterogeneity
from shockwave.policies.policy import Decision
from shockwave.simulation.metrics import summarize
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.workload import Workload


@dataclass(frozen=True, slots=True)
class OracleParams:
    """``beta``: price of a GPU-second given to one job, in seconds of delay per job behind it
    over the cluster's GPUs (1: the fluid model's). ``restart_s``: the restart a change of
    width or a start costs (the simulator's 20 s). ``shrink``: a job whose width does not fit
    the GPUs left runs narrower rather than waits. ``future``: arrivals the policy cannot see
    yet, as (arrival s, whole area GPU-s), counted among the jobs behind a longer job.
    ``deadlines``: job id -> the finish it must meet (:func:`deadlines`); ``margin_s``: how
    long before it a job turns urgent. ``order``: "area" (shortest remaining area first),
    "smith" (widths chosen in that order, then jobs sorted by their area at the width chosen)
    or "arrival" (for comparison). ``online``: know only remaining epochs at the current rate.
    ``online_ftf_cap``: FTF deadlines from the declared profile, ``ftf_share`` the reference
    FTF's max(1, N / G). ``path_theta``: > 0, every job's deadline is also now + theta x the
    work left over the GPUs (an online makespan rule). ``urgent_order``: urgent jobs by
    "deadline" (the longest first among equal ones) or by "laxity" (least slack first)."""

    beta: float = 1.0
    restart_s: float = 20.0
    shrink: bool = True
    future: tuple[tuple[float, float], ...] = ()
    deadlines: Mapping[str, float] = field(default_factory=dict)
    margin_s: float = 600.0
    order: str = "area"
    online: bool = False
    online_ftf_cap: float | None = None
    ftf_share: float = 1.0
    path_theta: float = 0.0
    urgent_order: str = "deadline"


def on_gpus(spec: JobSpec, gpus: int, batch_size: int, seconds: float) -> float:
    """``seconds`` of ``spec``'s work at its requested count, run on ``gpus`` GPUs instead."""
    if gpus == spec.gpus:
        return seconds
    assert spec.elastic is not None, f"job {spec.job_id} is not elastic"
    return seconds / spec.elastic.factor(gpus, spec.gpus, batch_size)


def trajectory_seconds(
    spec: JobSpec,
    trajectory: Sequence[Regime],
    epoch_seconds: Mapping[int, float],
    gpus: int,
    done: float = 0.0,
) -> float:
    """Seconds the epochs of ``trajectory`` past the first ``done`` take on ``gpus`` GPUs
    (``epoch_seconds``: batch size -> seconds an epoch at the requested count)."""
    total = 0.0
    for regime in trajectory:
        left = regime.epochs - done
        done = max(0.0, done - regime.epochs)
        if left > 0:
            seconds = epoch_seconds[regime.batch_size]
            total += left * on_gpus(spec, gpus, regime.batch_size, seconds)
    return total


def remaining_seconds(job: ActiveJob, snapshot: Snapshot, gpus: int, online: bool = False) -> float:
    """True seconds ``job`` still needs on ``gpus`` GPUs (its revealed trajectory); with
    ``online``, what a scheduler knows instead: its remaining epochs at the current batch
    size's epoch time (measured, else declared), as if it kept that batch size."""
    if online:
        seconds = job.remaining_seconds_at_current_rate() or 0.0
        return on_gpus(job.spec, gpus, job.progress.batch_size, seconds)
    truth = snapshot.revealed[job.job_id]
    return trajectory_seconds(
        job.spec, truth.trajectory, truth.epoch_seconds, gpus, job.progress.epochs_done
    )


def _widths(job: ActiveJob, gpus: int) -> tuple[int, ...]:
    if job.spec.elastic is None:
        return (job.spec.gpus,)
    return tuple(g for g in job.spec.elastic.widths if g <= gpus)


def choose_widths(
    times: Sequence[Mapping[int, float]],
    current: Sequence[int],
    behind: Sequence[float],
    gpus: int,
    params: OracleParams,
) -> list[int]:
    """Each job's width: the g minimizing ``R(g) + restart + beta behind g R(g) / gpus``
    (``times[i][g]``: R(g); ``current[i]``: the width job i runs on now, 0 if none;
    ``behind[i]``: how many jobs wait behind it). Pure, so the rule can be tested alone."""
    chosen = []
    for t, now, n in zip(times, current, behind, strict=True):
        best, best_cost = 0, math.inf
        for g, seconds in sorted(t.items()):
            cost = seconds + (params.restart_s if g != now else 0.0)
            cost += params.beta * n * g * seconds / gpus
            if cost < best_cost - 1e-9:
                best, best_cost = g, cost
        chosen.append(best)
    return chosen


class OraclePolicy:
    """SRPT by remaining area with marginal-efficiency widths, from the true trajectories."""

    name: ClassVar[str] = "oracle"
    Params: ClassVar[type[Any]] = OracleParams

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        total = snapshot.cluster.total_gpus
        jobs = list(snapshot.jobs)
        times = [
            {g: remaining_seconds(j, snapshot, g, params.online) for g in _widths(j, total)}
            for j in jobs
        ]
        areas = []
        for job, t in zip(jobs, times, strict=True):
            area = min(g * s for g, s in t.items())
            if job.running:
                area -= params.restart_s * len(job.progress.gpus)
            areas.append(area)
        if params.order == "arrival":  # for comparison: first come, first served
            order = sorted(range(len(jobs)), key=lambda i: jobs[i].spec.arrival_s)
        else:
            order = sorted(range(len(jobs)), key=lambda i: (areas[i], jobs[i].spec.arrival_s))
        rank = {i: k for k, i in enumerate(order)}
        future = [a for t, a in params.future if t > snapshot.now]
        behind = []
        for i in range(len(jobs)):
            n = float(len(jobs) - 1 - rank[i])
            n += sum(1 for a in future if a > areas[i])
            behind.append(n)
        current = [len(j.progress.gpus) for j in jobs]
        widths = choose_widths(times, current, behind, total, params)
        if params.order == "smith":  # then by the area at the width chosen (Smith's rule)
            order = sorted(order, key=lambda i: widths[i] * times[i][widths[i]])
        urgent = []
        due = self._deadlines(snapshot, areas, params)
        for i, job in enumerate(jobs):
            deadline = due[job.job_id]
            if deadline == math.inf:
                continue
            room = deadline - snapshot.now - params.margin_s
            if times[i][max(times[i])] < room and times[i][widths[i]] < room:
                continue
            # the narrowest width that still meets the deadline, else the widest; a running
            # job keeps its width while that still meets it (each change is a restart)
            fit = [g for g, s in sorted(times[i].items()) if s <= room]
            if current[i] in fit:
                widths[i] = max(widths[i], current[i])
            else:
                widths[i] = max(widths[i], fit[0] if fit else max(times[i]))
            urgent.append(i)
        if urgent:
            if params.urgent_order == "laxity":  # least slack at the width chosen first
                first = sorted(urgent, key=lambda i: due[jobs[i].job_id] - times[i][widths[i]])
            else:  # earliest deadline first, the longest first among equal deadlines
                first = sorted(urgent, key=lambda i: (due[jobs[i].job_id], -min(times[i].values())))
            pending = set(urgent)
            order = first + [i for i in order if i not in pending]
        free = total
        chosen: list[str] = []
        named: dict[str, int] = {}  # the widths off the requested counts
        for i in order:
            job = jobs[i]
            fits = [g for g in times[i] if g <= min(free, widths[i])]
            if not fits or (not params.shrink and widths[i] > free):
                g = widths[i]
            else:
                g = max(fits)
                chosen.append(job.job_id)
                free -= g
            if g != job.spec.gpus:
                named[job.job_id] = g
        # the next column: every job in priority order, so mid-round fills follow it too
        ranked = tuple(jobs[i].job_id for i in order)
        return Decision(jobs=tuple(chosen), widths=named, planned=(ranked,))

    def _deadlines(
        self, snapshot: Snapshot, areas: Sequence[float], params: OracleParams
    ) -> dict[str, float]:
        """Each job's deadline: the given one (from the truth), and with ``online_ftf_cap``
        the FTF deadline from the declared profile (arrival + cap x share x the job's
        epochs at its first batch size's epoch time), with ``path_theta`` the work bound
        now + theta x (remaining areas / GPUs) (both knowable online)."""
        work = sum(max(0.0, a) for a in areas) / snapshot.cluster.total_gpus
        out = {}
        for job in snapshot.jobs:
            d = params.deadlines.get(job.job_id, math.inf)
            if params.online_ftf_cap is not None:
                regimes = job.progress.observed_regimes
                first = regimes[0].batch_size if regimes else job.progress.batch_size
                seconds = job.epoch_seconds(first) or 0.0
                t_excl = job.spec.epochs * seconds
                d = min(d, job.spec.arrival_s + params.online_ftf_cap * params.ftf_share * t_excl)
            if params.path_theta > 0:
                d = min(d, snapshot.now + params.path_theta * work)
            out[job.job_id] = d
        return out


@dataclass(frozen=True, slots=True)
class OracleRun:
    beta: float
    future: bool
    makespan_s: float
    avg_jct_s: float
    worst_ftf: float
    unfair_fraction: float
    utilization: float
    restarts: int


def run_oracle(workload: Workload, cluster: Cluster, params: OracleParams) -> OracleRun:
    """One simulation of the oracle schedule with the reference's mechanics and the truth."""
    settings = SimSettings(reveal_trajectories=True)
    result = simulate(workload, cluster, OraclePolicy(), params, settings)
    m = summarize(result)
    return OracleRun(
        beta=params.beta,
        future=bool(params.future),
        makespan_s=m.makespan_s,
        avg_jct_s=m.avg_jct_s,
        worst_ftf=m.worst_ftf,
        unfair_fraction=m.unfair_fraction,
        utilization=m.utilization,
        restarts=sum(j.restarts for j in result.jobs),
    )


def deadlines(
    workload: Workload, cluster: Cluster, ftf_cap: float | None, makespan_cap: float | None
) -> dict[str, float]:
    """Each job's deadline: the finish that keeps its reference FTF at ``ftf_cap``
    (arrival + cap x max(1, N / G) x t_exclusive) and the run's makespan at ``makespan_cap``."""
    out = {}
    share = max(1.0, len(workload.jobs) / cluster.total_gpus)
    for job in workload.jobs:
        d = math.inf
        if ftf_cap is not None:
            t_excl = heterogeneity.t_exclusive_s(job, cluster)
            d = job.spec.arrival_s + ftf_cap * share * t_excl
        if makespan_cap is not None:
            d = min(d, makespan_cap)
        if d < math.inf:
            out[job.spec.job_id] = d
    return out


def future_areas(workload: Workload, gpus: int) -> tuple[tuple[float, float], ...]:
    """Each job's arrival and its whole area at its most efficient count (GPU-seconds)."""
    out = []
    for job in workload.jobs:
        spec = job.spec
        widths = spec.elastic.widths if spec.elastic is not None else (spec.gpus,)
        best = min(
            g * trajectory_seconds(spec, job.trajectory, job.epoch_seconds, g)
            for g in widths
            if g <= gpus
        )
        out.append((spec.arrival_s, best))
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_elastic_inputs(parser)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--beta", type=float, nargs="+", default=[1.0])
    parser.add_argument(
        "--online", action="store_true", help="know only remaining epochs at the current rate"
    )
    parser.add_argument(
        "--online-ftf-cap", type=float, help="FTF deadlines from declared profiles (online)"
    )
    parser.add_argument(
        "--path-theta", type=float, default=0.0, help="online makespan rule: theta x work bound"
    )
    parser.add_argument("--urgent-order", choices=("deadline", "laxity"), default="deadline")
    parser.add_argument("--order", choices=("area", "smith", "arrival"), default="area")
    parser.add_argument("--future", action="store_true", help="count unseen arrivals behind")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--ftf-cap", type=float, help="deadline: keep each job's FTF under this")
    parser.add_argument("--makespan-cap", type=float, help="deadline: every job done by (s)")
    parser.add_argument("--margin", type=float, default=600.0, help="deadline margin (s)")
    parser.add_argument("--target", type=float, help="average JCT to reach (s)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    workload = load_elastic(args, "elastic_oracle")
    if workload is None:
        return 2
    cluster = Cluster.of_gpus(args.gpus, args.gpus_per_node)
    future = future_areas(workload, args.gpus) if args.future else ()
    due = deadlines(workload, cluster, args.ftf_cap, args.makespan_cap)
    runs = []
    print(f"{len(workload.jobs)} jobs on {args.gpus} GPUs, elastic 1-{args.elastic_max_gpus}:")
    for beta in args.beta:
        params = OracleParams(
            beta=beta,
            shrink=not args.no_shrink,
            future=future,
            deadlines=due,
            margin_s=args.margin,
            order=args.order,
            online=args.online,
            online_ftf_cap=args.online_ftf_cap,
            ftf_share=max(1.0, len(workload.jobs) / args.gpus),
            path_theta=args.path_theta,
            urgent_order=args.urgent_order,
        )
        run = run_oracle(workload, cluster, params)
        runs.append(run)
        line = (
            f"  beta {beta:<5g} makespan {run.makespan_s:9,.0f} s  avg JCT {run.avg_jct_s:7,.0f} s"
            f"  worst FTF {run.worst_ftf:.2f} ({run.unfair_fraction:.1%} > 1)"
            f"  util {run.utilization:.2f}  restarts {run.restarts}"
        )
        if args.target:
            line += f"  ({run.avg_jct_s / args.target:.3f}x the target)"
        print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
