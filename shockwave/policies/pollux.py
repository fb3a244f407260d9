"""Pollux (``pollux``): goodput-driven worker allocation with p-norm fairness.

Source: Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
Learning" (OSDI'21), section 4.2. Each job j has SPEEDUP_j(a) = GOODPUT_j(a) / GOODPUT_j(1 GPU)
(adaptdl-sched's ``SpeedupFunction`` takes one replica as the base), and the cluster maximizes
the generalized mean FITNESS_p(A) = (1/J sum_j SPEEDUP_j(A_j)^p)^(1/p) with p = -1 (the paper's
fairness setting); an allocation that changes a running job's GPUs has its speed-up scaled by
1 - ``restart_penalty`` (adaptdl-sched's 0.1). Re-allocated every round.

As the Shockwave paper did for its comparison, the job's batch-size schedule is left as the
user set it, so goodput is the job's throughput at its current batch size (statistical
efficiency does not change with the allocation) and SPEEDUP comes from the job's elastic
range. A rigid job has speed-up 1 on its requested count and 0 elsewhere.

How the p = -1 mean is maximized (adaptdl-sched runs a genetic algorithm): with p < 0 a job
with no GPU has speed-up 0 and FITNESS 0, so an allocation that runs more jobs wins first:
jobs take their smallest count in turn (running jobs first: moving them costs the restart
penalty; then arrival order; a gang that does not fit is skipped so smaller ones backfill).
The GPUs left then go one step at a time to the job whose next allowed count raises
sum_j -SPEEDUP_j^p the most per GPU, until no step gains or none fits. docs/simulator.md says
what this leaves out of the full system.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from shockwave.domain.snapshot import ActiveJob, Snapshot
from shockwave.policies.policy import Decision


@dataclass(frozen=True, slots=True)
class PolluxParams:
    """``p``: the fairness exponent of the generalized mean (-1: the Pollux paper's).
    ``restart_penalty``: the share of speed-up a re-allocation costs (adaptdl-sched: 0.1)."""

    p: float = -1.0
    restart_penalty: float = 0.1

    def __post_init__(self) -> None:
        if self.p == 0 or self.p > 1:
            raise ValueError(f"p must be nonzero and at most 1, got {self.p!r}")
        if not 0 <= self.restart_penalty < 1:
            raise ValueError(f"restart_penalty must be in [0, 1), got {self.restart_penalty!r}")


def _widths(job: ActiveJob) -> tuple[int, ...]:
    return job.spec.elastic.widths if job.spec.elastic is not None else (job.spec.gpus,)


def speedup(job: ActiveJob, gpus: int, params: PolluxParams) -> float:
    """SPEEDUP_j(gpus): throughput on ``gpus`` over throughput on one GPU, at the job's batch
    size, times 1 - restart penalty when that is not the count the job runs on now."""
    if gpus == 0:
        return 0.0
    elastic, requested, bs = job.spec.elastic, job.spec.gpus, job.progress.batch_size
    if elastic is None:
        base = 1.0
        rate = 1.0
    else:
        base = elastic.factor(min(elastic.widths), requested, bs) / min(elastic.widths)
        rate = elastic.factor(gpus, requested, bs)
    value = rate / base
    if job.running and len(job.progress.gpus) != gpus:
        value *= 1.0 - params.restart_penalty
    return value


def _fitness_term(s: float, p: float) -> float:
    """The job's share of sum_j SPEEDUP^p, signed so that more is better."""
    return float(s**p) if p > 0 else -float(s**p)


class Pollux:
    name: ClassVar[str] = "pollux"
    Params: ClassVar[type[Any]] = PolluxParams

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        free = snapshot.cluster.total_gpus
        order = sorted(enumerate(snapshot.jobs), key=lambda item: (not item[1].running, item[0]))
        width: dict[str, int] = {}
        reasons: dict[str, str] = {}
        jobs = {j.job_id: j for j in snapshot.jobs}
        for _, job in order:
            start = min(_widths(job))
            if start <= free:
                width[job.job_id] = start
                free -= start
            else:
                reasons[job.job_id] = f"needs {start} GPUs, {free} left after earlier jobs"
        while free > 0:
            best: tuple[float, str, int] | None = None
            for job_id, g in width.items():
                job = jobs[job_id]
                up = [w for w in _widths(job) if g < w <= g + free]
                if not up:
                    continue
                now = _fitness_term(speedup(job, g, params), params.p)
                for w in up:
                    gain = (_fitness_term(speedup(job, w, params), params.p) - now) / (w - g)
                    if gain > 1e-12 and (best is None or gain > best[0]):
                        best = (gain, job_id, w)
            if best is None:
                break
            _, job_id, w = best
            free -= w - width[job_id]
            width[job_id] = w
        chosen = tuple(width)
        widths = {j: g for j, g in width.items() if g != jobs[j].spec.gpus}
        total = snapshot.cluster.total_gpus
        allocation = {j: g / total for j, g in width.items()}
        return Decision(jobs=chosen, allocation=allocation, reasons=reasons, widths=widths)
