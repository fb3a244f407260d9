"""Shockwave on a typed cluster: a market per GPU type, and per-type prices that place jobs.

On a typed cluster the window is planned in two steps (docs/heterogeneity.md):

1. **Type prices.** Each job j takes the type T that minimises p_T R_j(T), where R_j(T) is its
   predicted remaining run time on T (its reference-type estimate divided by its speed there,
   :func:`shockwave.market.heterogeneity.type_speed`; plus the restart overhead when it runs now on
   another type) and p_T is the price of a second of type T. Prices start equal, so every job
   asks for its fastest type; then each type's price moves with its load, the time its jobs
   need on its GPUs, H_T = max(sum_{j on T} g_j R_j(T) / M_T, max_{j on T} R_j(T)), until
   the loads meet. A job moves off an overloaded type when its relative advantage there is
   smallest: comparative advantage, as in a market. Of the price rounds, the assignment with
   the lowest makespan bound H = max_T H_T is kept; that bound is the heterogeneous
   cluster's makespan term. A job whose remainder at its fastest type is at least theta_c H
   (the planner's critical-path margin) is on the critical path: it is pinned to its fastest
   type and the prices run again for the rest. Every job's deadline in its type's market is
   its fairness deadline or theta_c H from now, the sooner, so the jobs whose remainder on
   their type nears H are planned before the market's fairness alone would plan them.
2. **A market per type.** Each type's jobs are planned by the homogeneous planner
   (:func:`shockwave.market.planner.plan`) on that type's GPUs, a round of type T valued by the
   progress the job makes on T (its outlook with times divided by its speed there). The FTF
   estimate rho_hat and the fairness deadline, which set the market weights, are on the
   cluster's average GPU (:func:`shockwave.market.heterogeneity.mean_speed`), the same yardstick as
   the FTF metric.

The rounds of the per-type plans are merged; :class:`~shockwave.policies.policy.Decision` names the
type of every job, and placement keeps each gang on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shockwave.domain.snapshot import ActiveJob, Snapshot
from shockwave.market.heterogeneity import speeds
from shockwave.market.planner import Plan, PlanJob, SolveStatus, plan

if TYPE_CHECKING:
    from shockwave.policies.shockwave_market.shockwave import JobOutlook, ShockwaveParams

PRICE_ROUNDS = 60
PRICE_STEP = 0.5
PRICE_MOVE = 1.25
"""Price rounds, and how a type's price moves each round: by (H_T / mean H)^PRICE_STEP, at
most PRICE_MOVE times up or down, so prices sweep through the ratios where single jobs move
rather than jump past them."""

PlanJobMaker = Callable[[ActiveJob, Any, Any, int, float], PlanJob]


def on_type(look: JobOutlook, slower: float, makespan_s: float = math.inf) -> JobOutlook:
    """``look`` (on the average GPU) on a type where the job runs ``slower`` times as long:
    its time estimates scale, its FTF estimate stays, and its deadline is its fairness
    deadline or the cluster's makespan bound ``makespan_s`` (seconds from now), the sooner."""
    return dataclasses.replace(
        look,
        deadline_s=min(look.deadline_s, makespan_s),
        remaining_s=look.remaining_s * slower,
        total_s=look.total_s * slower,
        error_factor=look.error_factor * slower,
        cautious_remaining_s=look.cautious_remaining_s * slower,
        soonest_remaining_s=look.soonest_remaining_s * slower,
        latest_remaining_s=look.latest_remaining_s * slower,
    )


def assign_types(
    remaining: Mapping[str, Mapping[str, float]],
    widths: Mapping[str, int],
    workers: Mapping[str, int],
) -> tuple[dict[str, str], float]:
    """Job -> type by the price rounds of step 1 (module docstring), and the makespan bound H
    of that assignment. ``remaining[j][T]``: the job's remaining run time on T (only the
    types its gang fits)."""
    kinds = list(workers)
    jobs = list(remaining)
    if not jobs:
        return {}, 0.0
    rem = np.array([[remaining[j].get(t, np.inf) for t in kinds] for j in jobs])
    width = np.array([widths[j] for j in jobs], dtype=float)
    gpus = np.array([workers[t] for t in kinds], dtype=float)
    price = np.ones(len(kinds))
    best = np.zeros(len(jobs), dtype=np.int64)
    best_h = math.inf
    rows = np.arange(len(jobs))
    for _ in range(PRICE_ROUNDS):
        choice = np.argmin(rem * price, axis=1)
        taken = rem[rows, choice]
        work = np.bincount(choice, weights=width * taken, minlength=len(kinds)) / gpus
        longest = np.zeros(len(kinds))
        np.maximum.at(longest, choice, taken)
        load = np.maximum(work, longest)
        h = float(load.max())
        if h < best_h - 1e-9:
            best, best_h = choice, h
        mean = float(load.mean()) or 1.0
        move = (np.maximum(load, 1e-9 * mean) / mean) ** PRICE_STEP
        price *= np.clip(move, 1 / PRICE_MOVE, PRICE_MOVE)
    return {j: kinds[int(k)] for j, k in zip(jobs, best, strict=True)}, best_h


def plan_typed(
    snapshot: Snapshot,
    params: ShockwaveParams,
    outlooks: Mapping[str, JobOutlook],
    make_job: PlanJobMaker,
) -> tuple[Plan, dict[str, str]]:
    """Plan the window on every type (module docstring); returns the merged plan and each
    job's type."""
    cluster = snapshot.cluster
    workers = {t: cluster.gpus_of_type(t) for t in cluster.gpu_types}
    window, length = params.planner.rounds, snapshot.round_seconds
    slower: dict[str, dict[str, float]] = {}
    remaining: dict[str, dict[str, float]] = {}
    for job in snapshot.jobs:
        look = outlooks[job.job_id]
        fast = speeds(job, cluster)
        avg = sum(fast[t] * workers[t] for t in workers) / cluster.total_gpus
        held = cluster.type_of(job.progress.gpus[0]) if job.progress.gpus else ""
        slower[job.job_id] = {t: avg / fast[t] for t in workers if job.spec.gpus <= workers[t]}
        remaining[job.job_id] = {
            t: look.remaining_s * k + (params.restart_overhead_s if held and t != held else 0.0)
            for t, k in slower[job.job_id].items()
        }
    widths = {j.job_id: j.spec.gpus for j in snapshot.jobs}
    remaining = {j: r for j, r in remaining.items() if r}  # a gang no type holds waits
    types, makespan = assign_types(remaining, widths, workers)
    margin = params.planner.critical_path_margin or 1.0
    critical = {j: r for j, r in remaining.items() if min(r.values()) >= margin * makespan}
    if critical:
        pinned = {j: {min(r, key=r.__getitem__): min(r.values())} for j, r in critical.items()}
        types, makespan = assign_types({**remaining, **pinned}, widths, workers)
    target = makespan * margin
    plans: list[Plan] = []
    for t in workers:
        mine = [j for j in snapshot.jobs if types.get(j.job_id) == t]
        looks = {j.job_id: on_type(outlooks[j.job_id], slower[j.job_id][t], target) for j in mine}
        jobs = [make_job(j, looks[j.job_id], params, window, length) for j in mine]
        priority = [-looks[j.job_id].laxity_s for j in mine]
        plans.append(plan(jobs, workers[t], params.planner, length, priority))
    return _merge(plans, window), types


def _merge(plans: Sequence[Plan], window: int) -> Plan:
    rounds = tuple(
        tuple(j for p in plans if r < len(p.rounds) for j in p.rounds[r]) for r in range(window)
    )
    statuses = [p.status for p in plans if p.status is not SolveStatus.EMPTY]
    order = list(SolveStatus)
    status = max(statuses, key=order.index, default=SolveStatus.EMPTY)
    return Plan(
        counts={j: c for p in plans for j, c in p.counts.items()},
        rounds=rounds,
        objective=sum(p.objective for p in plans),
        bound=sum(p.bound for p in plans),
        empty_objective=sum(p.empty_objective for p in plans),
        status=status,
        solver="+".join(sorted({p.solver for p in plans})),
        unpacked=sum(p.unpacked for p in plans),
    )


def fill_typed(
    snapshot: Snapshot,
    planned: Sequence[str],
    outlooks: Mapping[str, JobOutlook],
    types: Mapping[str, str],
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The planned round on each type, then idle GPUs filled with the jobs that have most work
    left, on their own type if it has room, else on any type that has (work conservation).
    Returns the round's jobs, why the others wait, and every job's type."""
    cluster = snapshot.cluster
    by_id = {j.job_id: j for j in snapshot.jobs}
    free = {t: cluster.gpus_of_type(t) for t in cluster.gpu_types}
    chosen: list[str] = []
    placed = dict(types)
    for job_id in planned:
        t = types.get(job_id)
        width = by_id[job_id].spec.gpus
        if t in free and width <= free[t]:
            chosen.append(job_id)
            free[t] -= width
    reasons: dict[str, str] = {}
    taken = set(chosen)
    waiting = sorted(
        (j for j in snapshot.jobs if j.job_id not in taken),
        key=lambda j: -outlooks[j.job_id].remaining_s,
    )
    for job in waiting:
        own = types.get(job.job_id)
        fits = [t for t in dict.fromkeys([own, *free]) if t in free and job.spec.gpus <= free[t]]
        if fits:
            chosen.append(job.job_id)
            placed[job.job_id] = fits[0]
            free[fits[0]] -= job.spec.gpus
        else:
            look = outlooks[job.job_id]
            reasons[job.job_id] = (
                f"not planned for this round on {own or 'any type'} (predicted FTF "
                f"{look.rho:.2f}, {look.remaining_s:.0f} s left); no idle GPUs to fill"
            )
    return chosen, reasons, placed
