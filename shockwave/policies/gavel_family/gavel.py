"""Gavel max-min fairness (``gavel``): an equal, weighted share of GPUs for every job.

Source: Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads" (OSDI'20), policy ``max_min_fairness``; as run by the reference (SIMULATOR-NOTES.md
section 4): throughputs are replaced by 1 and the objective is max min_j sf_j x_j / w_j, i.e. an
equal *GPU* share, not an equal time share.

With tenants (jobs of more than one tenant, or tenant limits), it is Gavel's hierarchical
policy (``max_min_fairness_water_filling`` with entity weights, the ``fairness`` reweighting
within each entity): :func:`hierarchical_shares`.

Simplification: we solve the max-min problem by water-filling, which gives the lexicographic
max-min solution exactly; with at least as many jobs as GPUs this is the reference's unique
LP solution ``x_j = M / (N sf_j)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shockwave.domain.snapshot import Snapshot
from shockwave.policies.gavel_family.gavel_typed import decide_typed
from shockwave.policies.gavel_family.time_fraction import (
    AllocationJob,
    TimeFractionParams,
    TimeFractionPolicy,
)
from shockwave.policies.policy import Decision


@dataclass(frozen=True, slots=True)
class MaxMinFairnessParams:
    mechanism: TimeFractionParams = field(default_factory=TimeFractionParams)


def water_fill(
    demands: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Max-min fair shares: share_j = min(demand_j, weight_j * level), summing to the capacity.

    ``demands`` caps each share (a job cannot use more GPUs than it asks for). When the demands
    fit, every job gets its demand.
    """
    shares = {k: 0.0 for k in demands}
    open_jobs = {k for k, d in demands.items() if d > 0}
    left = float(capacity)
    while open_jobs and left > 1e-12:
        total_weight = sum(weights[k] for k in open_jobs)
        level = left / total_weight
        capped = {k for k in open_jobs if demands[k] - shares[k] <= weights[k] * level + 1e-12}
        if not capped:
            for k in open_jobs:
                shares[k] += weights[k] * level
            break
        for k in capped:
            left -= demands[k] - shares[k]
            shares[k] = demands[k]
        open_jobs -= capped
    return shares


class MaxMinFairness(TimeFractionPolicy):
    """On a typed cluster: the heterogeneity-aware ``max_min_fairness_perf``
    (:mod:`shockwave.policies.gavel_family.gavel_typed`); untyped, the equal GPU share above."""

    name: ClassVar[str] = "gavel"
    Params: ClassVar[type[Any]] = MaxMinFairnessParams

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        if snapshot.cluster.is_typed:
            return decide_typed(snapshot, self.mechanism(params))
        return TimeFractionPolicy.decide(self, snapshot, params)

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        if any(j.tenant_gpus is not None for j in jobs):
            gpu_shares = hierarchical_shares(jobs)
        else:
            gpu_shares = water_fill(
                {j.job_id: float(j.gpus) for j in jobs},
                {j.job_id: j.weight for j in jobs},
                total_gpus,
            )
        return {j.job_id: gpu_shares[j.job_id] / j.gpus for j in jobs}, memory


def hierarchical_shares(jobs: Sequence[AllocationJob]) -> dict[str, float]:
    """Gavel's hierarchical max-min fairness (``max_min_fairness_water_filling`` with entity
    weights and the ``fairness`` reweighting within each entity): each tenant's GPUs are its
    water-filled entitlement (``tenant_gpus``; :func:`shockwave.domain.tenancy.entitlements`, which
    fills the tenants by weight up to their demand as Gavel fills entities), and within the
    tenant they are water-filled among its jobs by ``weight_in_tenant`` up to each job's gang
    width: a job that cannot use more gives its part to the other jobs of its tenant, as
    Gavel's reweighting gives a saturated job's weight to the unsaturated jobs of its entity.
    Returns GPUs per job id."""
    by_tenant: dict[str, list[AllocationJob]] = {}
    for job in jobs:
        by_tenant.setdefault(job.tenant, []).append(job)
    shares: dict[str, float] = {}
    for members in by_tenant.values():
        entitled = members[0].tenant_gpus or 0.0
        shares.update(
            water_fill(
                {j.job_id: float(j.gpus) for j in members},
                {j.job_id: j.weight_in_tenant for j in members},
                entitled,
            )
        )
    return shares
