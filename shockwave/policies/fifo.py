"""First in, first out (``fifo``): jobs run to completion in arrival order.

Source: Gavel's ``fifo`` policy. Head-of-line blocking: the walk stops at the first job (in
arrival order) that does not fit the GPUs left, so a wide job is never starved by narrow ones
behind it. Not in the reference's recorded results; kept as the simplest yardstick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from shockwave.domain.snapshot import Snapshot
from shockwave.policies.policy import Decision


@dataclass(frozen=True, slots=True)
class FifoParams:
    """``backfill``: let smaller later jobs use GPUs a blocked head job cannot (off: pure FIFO)."""

    backfill: bool = False


class Fifo:
    name: ClassVar[str] = "fifo"
    Params: ClassVar[type[Any]] = FifoParams

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        free = snapshot.cluster.total_gpus
        chosen: list[str] = []
        reasons: dict[str, str] = {}
        blocked = False
        for job in sorted(snapshot.jobs, key=lambda j: j.spec.arrival_s):
            if blocked or job.spec.gpus > free:
                reasons[job.job_id] = "waits behind earlier jobs (first in, first out)"
                blocked = blocked or not params.backfill
                continue
            free -= job.spec.gpus
            chosen.append(job.job_id)
        return Decision(jobs=tuple(chosen), allocation={j: 1.0 for j in chosen}, reasons=reasons)
