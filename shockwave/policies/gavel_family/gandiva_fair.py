"""Gandiva-Fair (``gandiva_fair``): an equal time share for every job.

Source: Chaudhary et al., "Balancing Efficiency and Fairness in Heterogeneous GPU Clusters for
Deep Learning" (EuroSys'20), as the reference runs it (Gavel's ``gandiva_fair`` proportional
policy): x_j = min(1, M / m) for each of the m active jobs, whatever its width, so the allocation
may oversubscribe; all behaviour then comes from the round mechanism's priorities.

With tenants, a tenant's tickets are split among its jobs (the paper's user tickets): each job's
share is M b_j / sum b, with b_j its market budget (its tenant's share divided among the
tenant's jobs, :func:`shockwave.domain.tenancy.job_budgets`), capped at 1.

Simplification (the reference's own): no stride scheduling or trading between users.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shockwave.policies.gavel_family.time_fraction import (
    AllocationJob,
    TimeFractionParams,
    TimeFractionPolicy,
)


@dataclass(frozen=True, slots=True)
class GandivaFairParams:
    mechanism: TimeFractionParams = field(default_factory=TimeFractionParams)


class GandivaFair(TimeFractionPolicy):
    name: ClassVar[str] = "gandiva_fair"
    Params: ClassVar[type[Any]] = GandivaFairParams

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        if any(j.tenant_gpus is not None for j in jobs):
            tickets = sum(j.weight for j in jobs)
            return {j.job_id: min(1.0, total_gpus * j.weight / tickets) for j in jobs}, memory
        share = min(1.0, total_gpus / len(jobs)) if jobs else 0.0
        return {j.job_id: share for j in jobs}, memory
