"""Gandiva-Fair (``gandiva_fair``): an equal time share for every job.

Source: Chaudhary et al., "Balancing Efficiency and Fairness in Heterogeneous GPU Clusters for
Deep Learning" (EuroSys'20), as the reference runs it (Gavel's ``gandiva_fair`` proportional
policy): x_j = min(1, M / m) for each of the m active jobs, whatever its width, so the allocation
may oversubscribe; all behaviour then comes from the round mechanism's priorities.

Simplification (the reference's own): no tickets, stride scheduling or trading between users.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shockwave.policies.time_fraction import (
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
        share = min(1.0, total_gpus / len(jobs)) if jobs else 0.0
        return {j.job_id: share for j in jobs}, memory
