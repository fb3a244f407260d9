"""Themis finish-time fairness (``themis``), in Gavel's form, which the reference runs.

Source: Mahajan et al., "Themis: Fair and Efficient GPU Cluster Scheduling" (NSDI'20), as
implemented by Gavel's ``finish_time_fairness`` policy (SIMULATOR-NOTES.md section 4): choose
time fractions that minimize the worst predicted finish-time fairness

    max_j (age_j + rem_j / (thr_j x_j)) / (C_j + rem_j / iso_j),
    iso_j = thr_j * min(1, M / (m sf_j)),

where ``C_j`` accumulates, at each recompute, the isolated-time equivalent of the progress made
since the previous one: ``C_j += (rem_prev - rem_now) / iso_prev``. There is no filter or
auction in this form; the paper's filter-based Themis is not implemented here. With tenants,
the fair share in ``iso_j`` is the job's weight's part of the cluster, ``M w_j / sum w``, w_j its
tenant's share split among the tenant's jobs (:func:`shockwave.domain.tenancy.job_budgets`).

Simplification: the problem is quasi-convex in one variable, the target rho: for a given rho each
job needs x_j >= rem_j / (thr_j (rho D_j - age_j)), D_j = C_j + rem_j / iso_j. We bisect on rho
until the GPU capacity binds, which gives the exact min-max value without an LP solver (the
reference used Gurobi; the choice of optimal vertex moves its figures by about 1%).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from shockwave.policies.gavel_family.time_fraction import (
    AllocationJob,
    TimeFractionParams,
    TimeFractionPolicy,
)


@dataclass(frozen=True, slots=True)
class ThemisParams:
    """``tolerance``: relative precision of the bisection on the worst FTF."""

    mechanism: TimeFractionParams = field(default_factory=TimeFractionParams)
    tolerance: float = 1e-7


def min_max_ftf_shares(
    jobs: Sequence[AllocationJob],
    total_gpus: int,
    denominators: Mapping[str, float],
    tolerance: float,
) -> tuple[dict[str, float], float]:
    """Time fractions minimizing the worst (age + rem / (thr x)) / D; returns (x, worst rho)."""
    if not jobs:
        return {}, 0.0

    def need(job: AllocationJob, rho: float) -> float:
        slack = rho * denominators[job.job_id] - job.age_s
        return 1.0 if slack <= 0 else min(1.0, job.remaining_seconds / slack)

    def used(rho: float) -> float:
        return sum(j.gpus * need(j, rho) for j in jobs)

    low = max((j.age_s + j.remaining_seconds) / denominators[j.job_id] for j in jobs)
    if used(low) <= total_gpus:
        return {j.job_id: need(j, low) for j in jobs}, low
    high = low * 2.0
    while used(high) > total_gpus:
        low, high = high, high * 2.0
    while high - low > tolerance * high:
        mid = 0.5 * (low + high)
        if used(mid) > total_gpus:
            low = mid
        else:
            high = mid
    return {j.job_id: need(j, high) for j in jobs}, high


class Themis(TimeFractionPolicy):
    name: ClassVar[str] = "themis"
    Params: ClassVar[type[Any]] = ThemisParams

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        m = len(jobs)
        credit: dict[str, float] = {}
        last_rem: Mapping[str, float] = memory.get("remaining_steps", {})
        last_iso: Mapping[str, float] = memory.get("isolated_rate", {})
        old_credit: Mapping[str, float] = memory.get("credit", {})
        isolated: dict[str, float] = {}
        denominators: dict[str, float] = {}
        tenanted = any(j.tenant_gpus is not None for j in jobs)
        weights = sum(j.weight for j in jobs)
        for job in jobs:
            # the fair share the job's FTF is against: an equal part of the cluster, or with
            # tenants its weight's part (its tenant's share split among the tenant's jobs)
            fair = total_gpus * job.weight / weights if tenanted else total_gpus / m
            isolated[job.job_id] = job.steps_per_second * min(1.0, fair / job.gpus)
            c = old_credit.get(job.job_id, 0.0)
            if job.job_id in last_rem:
                c += (last_rem[job.job_id] - job.remaining_steps) / last_iso[job.job_id]
            credit[job.job_id] = c
            denominators[job.job_id] = c + job.remaining_steps / isolated[job.job_id]
        shares, _ = min_max_ftf_shares(jobs, total_gpus, denominators, params.tolerance)
        new_memory = {
            "remaining_steps": MappingProxyType({j.job_id: j.remaining_steps for j in jobs}),
            "isolated_rate": MappingProxyType(isolated),
            "credit": MappingProxyType(credit),
        }
        return shares, MappingProxyType(new_memory)
