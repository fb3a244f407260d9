"""Max-sum-throughput (``mst``): maximize the cluster's total throughput.

Source: Gavel (OSDI'20), policy ``max_sum_throughput_perf``; as run by the reference: maximize
sum_j thr_j x_j in raw iterations per second, subject to sum_j sf_j x_j <= M and x_j <= 1. This
favours jobs with a high step rate, and a job loses rank when it scales its batch size up.

Simplification: the LP is a fractional knapsack, solved exactly by filling GPUs in order of
iterations per second per GPU (ties in arrival order). The reference's LP solver returned a
degenerate vertex; which of the tied vertices it picks moves makespan by about 2%.

With tenants the objective is weighted, sum_j w_j thr_j x_j, w_j the job's part of its tenant's
share (:func:`shockwave.domain.tenancy.job_budgets`): tenant weights as job weights.
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
class MaxSumThroughputParams:
    mechanism: TimeFractionParams = field(default_factory=TimeFractionParams)


class MaxSumThroughput(TimeFractionPolicy):
    name: ClassVar[str] = "mst"
    Params: ClassVar[type[Any]] = MaxSumThroughputParams

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        shares = {j.job_id: 0.0 for j in jobs}
        left = float(total_gpus)
        tenanted = any(j.tenant_gpus is not None for j in jobs)

        def value(job: AllocationJob) -> float:
            # throughput per GPU, weighted with tenants by the job's part of its tenant's share
            return job.steps_per_second / job.gpus * (job.weight if tenanted else 1.0)

        for job in sorted(jobs, key=lambda j: -value(j)):
            if left <= 1e-12:
                break
            take = min(1.0, left / job.gpus)
            shares[job.job_id] = take
            left -= take * job.gpus
        return shares, memory
