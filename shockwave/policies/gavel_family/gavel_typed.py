"""Gavel's heterogeneity-aware max-min fairness (``gavel`` on a typed cluster).

Source: Narayanan et al. (OSDI'20), policy ``max_min_fairness_perf``, as the published code
computes it (stanford-futuredata/gavel, scheduler/policies/max_min_fairness.py,
``MaxMinFairnessPolicyWithPerf``, and proportional.py). With x[j, T] the share of time job j
holds GPUs of type T, tp[j, T] its throughput there, sf_j its gang width, w_j its weight:

    maximize  min_j  sum_T tp[j, T] sf_j x[j, T] / (w_j tp_prop[j])
    s.t.      sum_T x[j, T] <= 1,   sum_j sf_j x[j, T] <= M_T,   x >= 0

where tp_prop[j] = sum_T tp[j, T] M_T / M is the job's throughput under an equal share of
every type (the published code's ``ProportionalPolicy``: x_prop[T] = (M_T / m) / (M / m)).
We solve it as a linear program with SCIP; among the max-min optima we take the one with the
largest sum of normalised throughputs (a 1e-6 weighted second term; the published code takes
whatever vertex its solver returns). tp[j, T] is the job's relative speed
(:func:`shockwave.market.heterogeneity.type_speed`); the reference throughput cancels.

The round mechanism is Gavel's per-type one (scheduler.py, ``_schedule_jobs_on_workers_helper``
and ``_update_priorities``): each type keeps its own received time and deficit per job; the
priority of j on T is x[j, T] / received[j, T]; types are walked fastest first (the published
code's fixed v100, p100, k80 order), each type's jobs by (priority, deficit, share), a job
taken at most once, on the first type in the walk with room for its gang. The recompute gate
and the credit are :mod:`shockwave.policies.gavel_family.time_fraction`'s, and so is the rule for a
job the shell learnt of after the recompute it arrived before (:func:`late_arrivals`): the next
decision solves that recompute's program again with it, from the inputs it was made from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shockwave.domain.snapshot import ActiveJob, Snapshot
from shockwave.market.heterogeneity import order_types, speeds
from shockwave.policies.gavel_family.time_fraction import (
    TimeFractionParams,
    allocation_due,
    first_arrival,
    late_arrivals,
    round_start_state,
)
from shockwave.policies.policy import Decision

PARETO_WEIGHT = 1e-6


@dataclass(frozen=True, slots=True)
class TypedPriorityState:
    """The per-type mechanism's memory: allocation, received time and deficit, job -> type ->
    value."""

    allocation: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    recomputed_at: float | None = None
    recomputed_after_start: bool = False
    job_set: frozenset[str] = frozenset()
    received: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    deficit: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    origin_s: float | None = None
    decided_round: int | None = None
    recompute_speed: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """The last recompute's program inputs per job (speed per type, gang width, weight): what
    solving it again with a late arrival needs."""
    recompute_widths: Mapping[str, int] = field(default_factory=dict)
    recompute_weights: Mapping[str, float] = field(default_factory=dict)
    before: TypedPriorityState | None = None
    """``origin_s``, ``decided_round`` and ``before`` as
    :class:`~shockwave.policies.gavel_family.time_fraction.PriorityState`'s."""


def max_min_fairness_perf(
    speed: Mapping[str, Mapping[str, float]],
    widths: Mapping[str, int],
    weights: Mapping[str, float],
    workers: Mapping[str, int],
) -> dict[str, dict[str, float]]:
    """x[j][T] of the program in the module docstring. ``speed[j][T]``: throughput on T (any
    unit common to the job's types); ``workers[T]``: GPUs of type T."""
    from pyscipopt import Model, quicksum

    jobs = list(speed)
    kinds = list(workers)
    if not jobs:
        return {}
    total = sum(workers.values())
    model = Model("max_min_fairness_perf")
    model.hideOutput()
    x = {
        (j, t): model.addVar(lb=0.0, ub=1.0, name=f"x_{i}_{k}")
        for i, j in enumerate(jobs)
        for k, t in enumerate(kinds)
    }
    z = model.addVar(lb=0.0, ub=None, name="z")
    coef: dict[tuple[str, str], float] = {}
    for j in jobs:
        prop = sum(speed[j].get(t, 0.0) * workers[t] / total for t in kinds) or 1.0
        for t in kinds:
            coef[j, t] = speed[j].get(t, 0.0) * widths[j] / (weights[j] * prop)
        model.addCons(quicksum(x[j, t] for t in kinds) <= 1.0)
        model.addCons(quicksum(coef[j, t] * x[j, t] for t in kinds) >= z)
    for t in kinds:
        model.addCons(quicksum(widths[j] * x[j, t] for j in jobs) <= workers[t])
    model.setObjective(
        z + PARETO_WEIGHT * quicksum(coef[k] * x[k] for k in x) / len(jobs), "maximize"
    )
    model.optimize()
    return {j: {t: min(1.0, max(0.0, model.getVal(x[j, t]))) for t in kinds} for j in jobs}


def decide_typed(snapshot: Snapshot, knobs: TimeFractionParams) -> Decision:
    """One round of heterogeneity-aware Gavel on a typed cluster (module docstring)."""
    cluster = snapshot.cluster
    kinds = cluster.gpu_types
    handed = snapshot.policy_state
    start = round_start_state(
        handed if isinstance(handed, TypedPriorityState) else TypedPriorityState(),
        snapshot.round_index,
    )
    state = start
    now = snapshot.round_start
    active = frozenset(j.job_id for j in snapshot.jobs)
    speed = {j.job_id: speeds(j, cluster) for j in snapshot.jobs}
    received: dict[str, dict[str, float]] = {}
    deficit: dict[str, dict[str, float]] = {}
    for job in snapshot.jobs:
        ran_on = cluster.type_of(job.progress.gpus[0]) if job.progress.gpus else ""
        got = state.received.get(job.job_id, {})
        received[job.job_id] = {
            t: got.get(t, knobs.initial_credit_s)
            + (job.progress.executed_last_round_s if t == ran_on else 0.0)
            for t in kinds
        }
        deficit[job.job_id] = dict(state.deficit.get(job.job_id, dict.fromkeys(kinds, 0.0)))
    allocation: Mapping[str, Mapping[str, float]] = {
        k: v for k, v in state.allocation.items() if k in active
    }
    recomputed_at, after_start = state.recomputed_at, state.recomputed_after_start
    origin = first_arrival(snapshot) if state.origin_s is None else state.origin_s
    job_set = state.job_set
    gate_open = allocation_due(
        recomputed_at, after_start, now, origin, knobs.min_seconds_between_allocations
    )
    workers = {t: cluster.gpus_of_type(t) for t in kinds}
    late = {job.job_id for job in late_arrivals(snapshot.jobs, state)}
    budgets = snapshot.market().budgets  # with tenants, each tenant's share split among its jobs
    inputs = (state.recompute_speed, state.recompute_widths, state.recompute_weights)
    if active != state.job_set | late and gate_open:
        since = 0.0 if recomputed_at is None else now - recomputed_at
        for j in active:
            for t in kinds:
                share = allocation.get(j, {}).get(t, 0.0)
                deficit[j][t] += share * since - (received[j][t] - knobs.initial_credit_s)
                received[j][t] = knobs.initial_credit_s
        inputs = (
            speed,
            {j.job_id: j.spec.gpus for j in snapshot.jobs},
            {j.job_id: budgets[j.job_id] for j in snapshot.jobs},
        )
        allocation = max_min_fairness_perf(*inputs, workers)
        recomputed_at, after_start, job_set = now, after_start or now > origin, active
    elif late:  # that recompute again, with the late jobs (time_fraction.late_arrivals)
        jobs = {j.job_id: j for j in snapshot.jobs if j.job_id in late}
        inputs = (
            {**inputs[0], **{k: speed[k] for k in late}},
            {**inputs[1], **{k: j.spec.gpus for k, j in jobs.items()}},
            {**inputs[2], **{k: budgets[k] for k in jobs}},
        )
        solved = max_min_fairness_perf(*inputs, workers)
        allocation = {k: v for k, v in solved.items() if k in active}
        job_set = job_set | late
    chosen, types, reasons = _walk(
        snapshot.jobs, workers, speed, allocation, received, deficit, knobs
    )
    new_state = TypedPriorityState(
        allocation=MappingProxyType({j: MappingProxyType(dict(a)) for j, a in allocation.items()}),
        recomputed_at=recomputed_at,
        recomputed_after_start=after_start,
        job_set=job_set,
        received=MappingProxyType(received),
        deficit=MappingProxyType(deficit),
        origin_s=origin if recomputed_at is not None else None,
        decided_round=snapshot.round_index,
        recompute_speed=MappingProxyType(
            {j: MappingProxyType(dict(v)) for j, v in inputs[0].items()}
        ),
        recompute_widths=MappingProxyType(dict(inputs[1])),
        recompute_weights=MappingProxyType(dict(inputs[2])),
        before=replace(start, before=None),
    )
    return Decision(
        jobs=tuple(chosen),
        state=new_state,
        allocation={j: sum(a.values()) for j, a in allocation.items()},
        reasons=reasons,
        types=types,
    )


def _walk(
    jobs: Sequence[ActiveJob],
    workers: Mapping[str, int],
    speed: Mapping[str, Mapping[str, float]],
    allocation: Mapping[str, Mapping[str, float]],
    received: Mapping[str, Mapping[str, float]],
    deficit: Mapping[str, Mapping[str, float]],
    knobs: TimeFractionParams,
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Gavel's per-type greedy walk: the round's jobs, the type of each, and why others wait.
    A job that arrived after the last recompute has no share; like the homogeneous mechanism
    (``absent_jobs_hold_gpus``) it holds the GPUs of the first type it fits, unused."""
    left = dict(workers)
    kinds = list(workers)
    queue: list[tuple[ActiveJob, str]] = []
    for t in order_types(list(speed.values()), kinds):

        def rank(job: ActiveJob, t: str = t) -> tuple[float, float, float]:
            share = allocation.get(job.job_id, {}).get(t, 0.0)
            got = received[job.job_id][t]
            priority = share / got if share > 0 and got > 0 else 0.0
            return (-priority, -deficit[job.job_id][t], -share)

        queue += [(j, t) for j in sorted(jobs, key=rank)]
    chosen: list[str] = []
    types: dict[str, str] = {}
    done: set[str] = set()
    for job, t in queue:
        job_id = job.job_id
        if job_id in done or job.spec.gpus > left[t]:
            continue
        done.add(job_id)
        left[t] -= job.spec.gpus
        if job_id not in allocation:
            if not knobs.absent_jobs_hold_gpus:
                left[t] += job.spec.gpus
            continue
        chosen.append(job_id)
        types[job_id] = t
    reasons = {
        j.job_id: (
            "arrived after the last allocation; waits for the next recompute"
            if j.job_id not in allocation
            else f"no type has {j.spec.gpus} GPUs left after higher priorities"
        )
        for j in jobs
        if j.job_id not in types
    }
    return chosen, types, reasons
