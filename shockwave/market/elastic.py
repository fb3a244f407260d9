"""Elastic workers: the market chooses how many GPUs a job gets as well as when it runs.

A job that declares an :class:`~shockwave.domain.model.ElasticRange` may run on any of its GPU
counts; its throughput there is its declared profile times the range's speed-up. The planner's count
problem (:mod:`shockwave.market.planner`) gains one choice per job: besides n_j, the rounds it gets,
its width g_j for the window. phi_j keeps its terms (NSW log-utility with the FTF weight, the
makespan and deadline terms) and its constants (:class:`~shockwave.market.planner.ObjectiveTerms`);
only the tables change with g: n rounds on g GPUs train as n x speed-up rounds on the requested
count. Remaining work is always counted on the requested count (so the makespan term prices
GPU-seconds the same whatever width is chosen), and capacity is GPU-rounds: g_j n_j.

Solving: per job, the points (cost g n, value phi_j(g, n)) over every width and n form a
multiple-choice knapsack. The greedy on each job's upper concave envelope over cost (by gain
per GPU-round) solves its relaxation exactly, which bounds the optimum and certifies the
integer plan's gap, as the rigid planner does (docs/elastic.md). A job's width is fixed over
the window; the plan is re-made every 8 rounds (the policy's lazy elastic re-planning), so
widths follow the load. Counts are then packed into rounds by
:func:`shockwave.market.planner.pack_rounds`.

``make_elastic`` turns a simulator workload elastic from a throughput table (``--elastic``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shockwave.domain.model import VALID_WIDTHS, ElasticRange
from shockwave.market.planner import (
    ObjectiveTerms,
    Plan,
    PlanJob,
    PlannerParams,
    Problem,
    SolveStatus,
    pack_rounds,
)
from shockwave.workloads.traces import ThroughputTable
from shockwave.workloads.workload import Workload


@dataclass(frozen=True, slots=True)
class ElasticPlanJob:
    """One job for the elastic planner: ``base`` on its requested count (``base.gpus``), and
    ``variants[g]``: its tables (utility, remaining on the requested count, overdue) when it
    runs on g GPUs, ``gpus`` left at the requested count so the penalties price work alike.
    A rigid job has the one variant ``{base.gpus: base}``. ``top_speed``: its fastest width's
    speed-up over the requested count; ``base``'s soonest and latest remaining times are at
    that width (what the critical-path reservation judges). ``must_run``: the job runs every
    round of the window it still needs (a long job, whose remainder is the makespan's)."""

    base: PlanJob
    variants: Mapping[int, PlanJob]
    top_speed: float = 1.0
    must_run: bool = False


@dataclass(frozen=True, slots=True)
class ElasticPlan:
    """A solved elastic plan: the rigid :class:`~shockwave.market.planner.Plan` (its ``counts`` and
    ``rounds``), and each planned job's width for the window."""

    plan: Plan
    widths: Mapping[str, int]


def _envelope(points: list[tuple[float, float, int, int]]) -> list[tuple[float, float, int, int]]:
    """Upper concave hull of (cost, value, width, n) from the first point, rising only."""
    points.sort(key=lambda p: (p[0], -p[1]))
    hull: list[tuple[float, float, int, int]] = [points[0]]
    for p in points[1:]:
        if p[0] <= hull[-1][0] or p[1] <= hull[-1][1]:
            continue
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (b[1] - a[1]) * (p[0] - a[0]) <= (p[1] - a[1]) * (b[0] - a[0]):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def empty_row_value(
    values: npt.NDArray[np.float64], owner: list[tuple[int, int]], job: int
) -> float:
    """phi_j(0) of ``job`` (its base row's first value)."""
    return float(values[owner.index((job, 0)), 0])


def plan_elastic(
    jobs: Sequence[ElasticPlanJob],
    total_gpus: int,
    params: PlannerParams,
    round_seconds: float,
    priority: Sequence[float] | None = None,
    completion_weight: float = 0.0,
    floor_progress: bool = False,
) -> ElasticPlan:
    """Choose each job's width and rounds for the window, and pack them into rounds.

    ``completion_weight`` (kappa): each job's value also loses (kappa / Z0) x its predicted
    finish (n D when it ends in the window, T D + the time it has left otherwise). Without it
    a job that ends inside the window is worth as much on one GPU as on eight (its utility is
    1 either way), so the market would never spend idle GPUs to finish jobs sooner."""
    t = params.rounds
    window_s = t * round_seconds
    rounds_s = np.arange(t + 1) * round_seconds
    if not jobs:
        empty: tuple[tuple[str, ...], ...] = tuple(() for _ in range(t))
        return ElasticPlan(Plan({}, empty, 0.0, 0.0, 0.0, SolveStatus.EMPTY), {})
    terms = ObjectiveTerms.of([j.base for j in jobs], total_gpus, params, round_seconds)
    hulls: list[list[tuple[float, float, int, int]]] = []
    rows: list[PlanJob] = []
    owner: list[tuple[int, int]] = []
    for i, job in enumerate(jobs):
        rows.append(job.base)
        owner.append((i, 0))
        for width, variant in job.variants.items():
            if width <= total_gpus:
                rows.append(variant)
                owner.append((i, width))
    values, lefts, caps, floors = terms.rows(rows)
    finish = np.where(lefts > 0, window_s + lefts, rounds_s[None, :])
    values -= completion_weight / terms.z0 * finish
    by_job: list[list[int]] = [[] for _ in jobs]
    floor_of = [0] * len(jobs)
    target_of = [0.0] * len(jobs)
    empty_value = 0.0
    for r, (i, width) in enumerate(owner):
        if width == 0:
            floor_of[i] = params.rounds if jobs[i].must_run else int(floors[r])
            target_of[i] = float(lefts[r, floor_of[i]])
            empty_value += float(values[r, 0])
        else:
            by_job[i].append(r)
    steps_n = np.arange(t + 1)
    forced_cost = 0.0
    for i, job in enumerate(jobs):
        costs, gains, widths_at, counts_at = [], [], [], []
        for r in by_job[i]:
            width, cap = owner[r][1], int(caps[r])
            # The critical-path floor: the job runs at least ``floor`` rounds of the window
            # (all it needs, if fewer), on whichever width the market picks.
            n = steps_n[min(floor_of[i], cap) : cap + 1]
            if floor_progress and floor_of[i] > 0:
                # ... and makes at least the progress ``floor`` rounds on its requested count
                # would (the closest it can come, if no width can).
                need = max(target_of[i], float(lefts[r, cap]))
                n = steps_n[: cap + 1][lefts[r, : cap + 1] <= need + 1e-9]
            costs.append(n * width)
            gains.append(values[r, n])
            widths_at.append(np.full(len(n), width))
            counts_at.append(n)
        if not costs:
            hulls.append([(0.0, empty_row_value(values, owner, i), job.base.gpus, 0)])
            continue
        cost, gain = np.concatenate(costs).astype(float), np.concatenate(gains)
        width_of, count_of = np.concatenate(widths_at), np.concatenate(counts_at)
        order = np.lexsort((-gain, cost))
        cost, gain, width_of, count_of = cost[order], gain[order], width_of[order], count_of[order]
        best = np.maximum.accumulate(gain)
        keep = np.concatenate(([True], gain[1:] > best[:-1]))
        hull = _envelope(
            list(
                zip(
                    cost[keep].tolist(),
                    gain[keep].tolist(),
                    width_of[keep].tolist(),
                    count_of[keep].tolist(),
                    strict=True,
                )
            )
        )
        forced_cost += hull[0][0]
        hulls.append(hull)
    capacity = float(total_gpus * t)
    chosen = [0] * len(jobs)
    value = sum(h[0][1] for h in hulls)
    left = capacity - forced_cost
    steps = []
    for i, hull in enumerate(hulls):
        for k in range(1, len(hull)):
            step_cost = hull[k][0] - hull[k - 1][0]
            step_gain = hull[k][1] - hull[k - 1][1]
            steps.append((step_gain / step_cost, i, k, step_cost, step_gain))
    steps.sort(key=lambda s: (-s[0], s[1], s[2]))
    bound = value
    blocked = [False] * len(jobs)
    fractional_done = False
    for ratio, i, k, step_cost, step_gain in steps:
        if blocked[i] or chosen[i] != k - 1:
            continue
        if step_cost <= left + 1e-9:
            chosen[i] = k
            left -= step_cost
            value += step_gain
            if not fractional_done:
                bound += step_gain
        else:
            blocked[i] = True
            if not fractional_done:
                bound += max(0.0, ratio) * max(0.0, left)
                fractional_done = True
    bound = max(bound, value)
    widths = {}
    counts = np.zeros(len(jobs), dtype=np.int64)
    packed_jobs = []
    for i, job in enumerate(jobs):
        _, _, width, rounds_run = hulls[i][chosen[i]]
        counts[i] = rounds_run
        width = width if rounds_run > 0 else job.base.gpus
        widths[job.base.job_id] = width
        packed_jobs.append(dataclasses.replace(job.base, gpus=width))
    gain_total = bound - empty_value
    certified = gain_total <= 1e-15 or (bound - value) <= params.relative_gap * gain_total
    status = SolveStatus.OPTIMAL if certified else SolveStatus.GREEDY
    zeros = np.zeros((len(jobs), t + 1))
    problem = Problem(
        tuple(packed_jobs),
        total_gpus,
        t,
        terms.coupling,
        zeros,
        zeros,
        counts,
        np.array([j.gpus for j in packed_jobs], dtype=float),
    )
    weights = list(priority) if priority is not None else [j.base.weight for j in jobs]
    rounds, lost = pack_rounds(problem, counts, weights)
    plan = Plan(
        counts={j.base.job_id: int(c) for j, c in zip(jobs, counts, strict=True)},
        rounds=rounds,
        objective=value,
        bound=bound,
        empty_objective=empty_value,
        status=status,
        solver="elastic-greedy",
        unpacked=lost,
    )
    return ElasticPlan(plan, {j: w for j, w in widths.items() if plan.counts[j] > 0})


def elastic_range(
    requested: int,
    max_gpus: int,
    batch_sizes: Sequence[int],
    rate: Mapping[tuple[int, int], float],
    min_gpus: int = 1,
) -> ElasticRange:
    """The range [min_gpus, max(max_gpus, requested)] with speed-ups ``rate[(bs, g)] /
    rate[(bs, requested)]`` wherever both are known (``rate``: steps/s of the job's model at
    batch size and GPU count, e.g. a throughput table's)."""
    top = max(max_gpus, requested)
    low = min(min_gpus, requested)
    speedup: dict[int, dict[int, float]] = {}
    for g in VALID_WIDTHS:
        if not low <= g <= top or g == requested:
            continue
        known = {
            bs: rate[(bs, g)] / rate[(bs, requested)]
            for bs in batch_sizes
            if (bs, g) in rate and (bs, requested) in rate and rate[(bs, requested)] > 0
        }
        if known:
            speedup[g] = known
    return ElasticRange(low, top, speedup)


def make_elastic(workload: Workload, table: ThroughputTable, max_gpus: int = 8) -> Workload:
    """Every job of ``workload`` elastic from 1 GPU to ``max(max_gpus, its request)``, its
    speed-ups the ratios of ``table``'s rates for its model (the simulator's ``--elastic``)."""
    if max_gpus not in VALID_WIDTHS:
        raise ValueError(f"--elastic-max-gpus must be one of {VALID_WIDTHS}, got {max_gpus}")
    jobs = []
    for job in workload.jobs:
        spec = job.spec
        rates = {(bs, g): r for (model, bs, g), r in table.rates.items() if model == spec.model}
        sizes = sorted({bs for bs, _ in rates} | {r.batch_size for r in job.trajectory})
        elastic = elastic_range(spec.gpus, max_gpus, sizes, rates)
        jobs.append(dataclasses.replace(job, spec=dataclasses.replace(spec, elastic=elastic)))
    return Workload(tuple(jobs), name=f"{workload.name} (elastic 1-{max_gpus})")
