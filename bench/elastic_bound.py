"""Lower bounds on the average JCT any schedule can reach when every job is elastic.

Usage::

    python -m bench.elastic_bound --trace F --trajectories F --throughputs F --gpus 32
        [--elastic-max-gpus 8] [--slot-seconds 120] [--json OUT]

Why: elastic Shockwave is asked for an average JCT 1.5x better than rigid Shockwave's. These
bounds say how far any policy could go on a workload, fairness aside, so that a miss can be told
apart from an impossibility. Each is a relaxation: every real schedule is feasible in it, so its
optimum is at most the true optimum. Restart overheads, placement, whole-GPU counts and the order
of a job's batch-size regimes are all relaxed away.

A job's *work* is counted in min-work units: the GPU-seconds it needs at its most efficient count
for each regime (``w_j``). On ``g`` GPUs it does at most ``E_j(g)`` units a second, the best over
its regimes of ``min-work per epoch / seconds per epoch on g GPUs`` (``E_j(g) <= g``).

- ``alone``: each job running by itself at its fastest count from its arrival (the height bound).
- ``srpt``: preemptive shortest-remaining-first on one machine of ``--gpus`` unit-speed GPUs with
  job sizes ``w_j``: optimal for that single machine with release dates, and every real schedule
  is one of its schedules (the whole cluster as one job's, perfectly efficient).
- ``lp``: a time-indexed LP (slots of ``--slot-seconds``): ``x[j, s, g]`` seconds of slot ``s`` in
  which job ``j`` runs on ``g`` GPUs; per slot, at most the slot's length per job (from its
  arrival) and at most ``--gpus`` x length GPU-seconds in all; each job's units
  ``sum E_j(g) x[j, s, g]`` equal to ``w_j``. A job's completion is at least its work-weighted
  mean busy time plus half its shortest possible duration (``C_j >= M_j + w_j / (2 E_j(max))``:
  a job that cannot run faster than ``E_j(max)`` has at least that much of its run after its mean),
  and ``M_j`` is counted from each slot's start. Solved with SCIP (pyscipopt) as a pure LP.

Prints each bound's average JCT and, given ``--rigid-jct``, the best ratio over that figure any
schedule could reach.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shockwave.domain.model import VALID_WIDTHS
from shockwave.market.elastic import make_elastic
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import InputError, load_throughputs, load_workload

WIDTHS = VALID_WIDTHS


@dataclass(frozen=True, slots=True)
class ElasticJob:
    """One job reduced to what the bounds need: arrival, min-work units and the unit rates."""

    arrival_s: float
    work: float  # min-work units (GPU-seconds at the most efficient count of each regime)
    rate: dict[int, float]  # GPU count -> units per second at best over the regimes


@dataclass(frozen=True, slots=True)
class Bounds:
    jobs: int
    gpus: int
    alone_s: float
    srpt_s: float
    lp_s: float | None
    lp_seconds: float | None
    lp_busy_s: float | None = None
    lp_busy_seconds: float | None = None


def add_elastic_inputs(parser: argparse.ArgumentParser) -> None:
    """The inputs of this bench and ``bench/elastic_oracle.py``: the trace, its trajectories
    and throughput table, the cluster's GPUs, and how wide every job may run."""
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--trajectories", type=Path, required=True)
    parser.add_argument("--throughputs", type=Path, required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--elastic-max-gpus", type=int, default=8, choices=WIDTHS)


def load_elastic(args: argparse.Namespace, bench: str) -> Workload | None:
    """The workload of :func:`add_elastic_inputs`' files made elastic from 1 to
    ``--elastic-max-gpus`` GPUs (the simulator's ``--elastic``); None after naming the bad
    file on stderr as ``bench: ...``. One loader for this bench and ``bench/elastic_oracle.py``."""
    try:
        table = load_throughputs(args.throughputs)
        workload = load_workload(args.trace, args.trajectories, table)
    except InputError as error:
        print(f"{bench}: {error}", file=sys.stderr)
        return None
    return make_elastic(workload, table, args.elastic_max_gpus)


def elastic_jobs(workload: Workload) -> list[ElasticJob]:
    """Each elastic job's min-work and its best rate at every count it can run on."""
    jobs = []
    for job in workload.jobs:
        spec = job.spec
        if spec.elastic is None:
            raise ValueError(f"job {spec.job_id} is not elastic")
        work = 0.0
        rate: dict[int, float] = {}
        for regime in job.trajectory:
            seconds = {spec.gpus: job.epoch_seconds[regime.batch_size]}
            for gpus, speedup in spec.elastic.speedup.items():
                if regime.batch_size in speedup:
                    seconds[gpus] = seconds[spec.gpus] / speedup[regime.batch_size]
            per_epoch = min(g * s for g, s in seconds.items())
            work += regime.epochs * per_epoch
            for g, s in seconds.items():
                rate[g] = max(rate.get(g, 0.0), per_epoch / s)
        jobs.append(ElasticJob(spec.arrival_s, work, rate))
    return jobs


def alone_bound(jobs: Sequence[ElasticJob]) -> float:
    """Average of each job's shortest run time from its arrival."""
    return sum(j.work / max(j.rate.values()) for j in jobs) / len(jobs)


def srpt_bound(jobs: Sequence[ElasticJob], gpus: int) -> float:
    """Average JCT of preemptive SRPT on one machine of speed ``gpus``, sizes ``work``."""
    events = sorted((j.arrival_s, j.work / gpus, i) for i, j in enumerate(jobs))
    now, nxt, total = 0.0, 0, 0.0
    heap: list[list[float]] = []
    while nxt < len(events) or heap:
        if not heap:
            now = max(now, events[nxt][0])
        while nxt < len(events) and events[nxt][0] <= now:
            heapq.heappush(heap, [events[nxt][1], events[nxt][2]])
            nxt += 1
        size, index = heap[0]
        arrival = events[nxt][0] if nxt < len(events) else float("inf")
        if now + size <= arrival:
            heapq.heappop(heap)
            now += size
            total += now - jobs[int(index)].arrival_s
        else:
            heap[0][0] -= arrival - now
            now = arrival
    return total / len(jobs)


def lp_bound(
    jobs: Sequence[ElasticJob], gpus: int, slot_s: float, horizon_s: float, busy: bool = False
) -> float:
    """The time-indexed LP's optimum, as an average JCT (see the module docstring); with
    ``busy``, also the busy-time cuts (``lp+busy``)."""
    from pyscipopt import Model, quicksum

    slots = int(horizon_s // slot_s) + 1
    model = Model("elastic-jct-bound")
    model.hideOutput()
    use: dict[int, list[tuple[int, Any]]] = {s: [] for s in range(slots)}
    finish: list[Any] = []
    for index, job in enumerate(jobs):
        units = []
        mean: list[tuple[float, Any]] = []
        fastest = max(job.rate.values())
        first = int(job.arrival_s // slot_s)
        per_slot: list[tuple[float, list[Any]]] = []
        for s in range(first, slots):
            start = s * slot_s
            length = min(slot_s, start + slot_s - job.arrival_s)
            here = []
            for g, rate in job.rate.items():
                x = model.addVar(lb=0.0, name=f"x{index}_{s}_{g}")
                here.append(x)
                use[s].append((g, x))
                units.append((rate, x))
                # mean busy time counted from the slot's start (or the arrival inside it)
                mean.append((max(start, job.arrival_s) * rate / job.work, x))
            model.addCons(quicksum(here) <= length)
            per_slot.append((max(start, job.arrival_s), here))
        model.addCons(quicksum(rate * x for rate, x in units) == job.work)
        c = model.addVar(lb=job.arrival_s, name=f"c{index}")
        finish.append(c)
        model.addCons(c >= quicksum(k * x for k, x in mean) + job.work / (2 * fastest))
        if busy:
            # C_j >= t_s U_s / w_j + B_s: B_s the seconds the job runs from slot s on, U_s
            # the units it does then (a job that runs after t_s ends at t_s + B_s or later)
            after_b: Any = 0.0
            after_u: Any = 0.0
            for t, here in reversed(per_slot):
                b = model.addVar(lb=0.0)
                u = model.addVar(lb=0.0)
                model.addCons(b == after_b + quicksum(here))
                model.addCons(
                    u
                    == after_u
                    + quicksum(r * x for r, x in zip(job.rate.values(), here, strict=True))
                )
                model.addCons(c >= (t / job.work) * u + b)
                after_b, after_u = b, u
    for terms in use.values():
        if terms:
            model.addCons(quicksum(g * x for g, x in terms) <= gpus * slot_s)
    model.setObjective(quicksum(finish), "minimize")
    model.optimize()
    if model.getStatus() != "optimal":
        raise RuntimeError(f"the LP ended {model.getStatus()}: raise --horizon")
    return (model.getObjVal() - sum(j.arrival_s for j in jobs)) / len(jobs)


def bounds(
    workload: Workload, gpus: int, slot_s: float, lp: bool = True, busy: bool = False
) -> Bounds:
    jobs = elastic_jobs(workload)
    horizon = max(j.arrival_s for j in jobs) + sum(j.work for j in jobs) / gpus * 1.5 + 4 * slot_s
    started = time.perf_counter()
    lp_s = lp_bound(jobs, gpus, slot_s, horizon) if lp else None
    lp_seconds = time.perf_counter() - started if lp else None
    started = time.perf_counter()
    lp_busy_s = lp_bound(jobs, gpus, slot_s, horizon, busy=True) if busy else None
    return Bounds(
        jobs=len(jobs),
        gpus=gpus,
        alone_s=alone_bound(jobs),
        srpt_s=srpt_bound(jobs, gpus),
        lp_s=lp_s,
        lp_seconds=lp_seconds,
        lp_busy_s=lp_busy_s,
        lp_busy_seconds=time.perf_counter() - started if busy else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_elastic_inputs(parser)
    parser.add_argument("--slot-seconds", type=float, default=120.0)
    parser.add_argument("--no-lp", action="store_true", help="only the two closed-form bounds")
    parser.add_argument("--busy-cuts", action="store_true", help="also the LP with busy-time cuts")
    parser.add_argument("--rigid-jct", type=float, help="average JCT to compare (s)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.slot_seconds <= 0:
        parser.error("--gpus and --slot-seconds must be positive")
    workload = load_elastic(args, "elastic_bound")
    if workload is None:
        return 2
    result = bounds(workload, args.gpus, args.slot_seconds, lp=not args.no_lp, busy=args.busy_cuts)
    print(f"{result.jobs} jobs on {result.gpus} GPUs, elastic 1-{args.elastic_max_gpus}:")
    rows = [
        ("alone", result.alone_s),
        ("srpt", result.srpt_s),
        ("lp", result.lp_s),
        ("lp+busy", result.lp_busy_s),
    ]
    for name, value in rows:
        if value is None:
            continue
        line = f"  {name:7s} average JCT >= {value:,.0f} s"
        if args.rigid_jct:
            line += f"  (at most {args.rigid_jct / value:.2f}x better than {args.rigid_jct:,.0f})"
        print(line)
    if result.lp_seconds is not None:
        print(f"  (LP solved in {result.lp_seconds:.1f} s, slots of {args.slot_seconds:g} s)")
    if result.lp_busy_seconds is not None:
        print(f"  (LP with busy-time cuts solved in {result.lp_busy_seconds:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
