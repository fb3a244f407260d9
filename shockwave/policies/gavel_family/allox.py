"""AlloX (``allox``): shortest remaining time first among the oldest jobs, non-preemptive.

Source: Le et al., "AlloX: Compute Allocation in Hybrid Clusters" (EuroSys'20), as Gavel's
``allox`` policy runs it in the reference (SIMULATOR-NOTES.md section 4, alpha = 0.2):

1. A job that already holds a full share (x = 1, a one-GPU job) keeps it until it finishes;
   n = M - (number of such pinned jobs) workers are free.
2. The other m jobs, oldest first, are cut to the first max(floor(alpha m), n) (the fairness
   filter).
3. AlloX assigns them to (worker, position) slots minimizing sum of position x processing time;
   with identical workers the jobs placed first on a worker are the n shortest, by remaining
   steps / throughput. Each gets x = 1 / sf; earlier shares of active jobs carry forward.

Simplification: instead of scipy's Hungarian assignment we take the n shortest directly, which
is the same optimum; only the tie-breaking between equal jobs may differ (about 0.5%).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shockwave.policies.gavel_family.time_fraction import (
    AllocationJob,
    TimeFractionParams,
    TimeFractionPolicy,
)


@dataclass(frozen=True, slots=True)
class AlloxParams:
    """``alpha``: share of the oldest jobs that pass AlloX's fairness filter (reference: 0.2)."""

    mechanism: TimeFractionParams = field(default_factory=TimeFractionParams)
    alpha: float = 0.2


class Allox(TimeFractionPolicy):
    name: ClassVar[str] = "allox"
    Params: ClassVar[type[Any]] = AlloxParams

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        shares = {j.job_id: previous.get(j.job_id, 0.0) for j in jobs}
        pinned = {j.job_id for j in jobs if previous.get(j.job_id) == 1.0}
        free_workers = max(0, total_gpus - len(pinned))
        others = sorted((j for j in jobs if j.job_id not in pinned), key=lambda j: -j.age_s)
        keep = max(math.floor(params.alpha * len(others)), free_workers)
        candidates = others[:keep]
        for job in sorted(candidates, key=lambda j: j.remaining_seconds)[:free_workers]:
            shares[job.job_id] = 1.0 / job.gpus
        return shares, memory
