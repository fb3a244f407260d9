"""Run metrics, defined once here and used by the simulator CLI, benchmarks and tests.

Definitions:

- makespan: the time the last job finishes, from time 0 (the first arrival).
- average JCT: mean of finish - arrival over completed jobs.
- utilization: useful GPU-seconds (after restart overhead) / (GPUs x makespan).
- finish-time fairness (FTF) rho, two ways:

  * reference-compatible: ``rho = JCT / (t_exclusive * max(1, N_trace / G))`` with ``N_trace``
    the number of jobs in the whole workload and ``G`` the GPUs; this is what the reference
    implementation recorded, so our figures compare with ``data/reference/results``;
  * contention-aware: the same with ``N`` = mean number of active jobs per round over the
    job's life (the reference's "themis" list).

  A job is unfairly treated when rho > 1; we report the worst rho and the share above 1.
- decision seconds: wall time of each ``decide`` call (median, p99, max).
- lower bound: the workload's makespan lower bound on this cluster (see
  :meth:`~shockwave.workload.Workload.makespan_lower_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shockwave.simulator import JobOutcome, SimResult


@dataclass(frozen=True, slots=True)
class DecisionTimes:
    median: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Figures of one run. FTF lists are per job, in workload order (None: not finished)."""

    policy: str
    makespan_s: float
    avg_jct_s: float
    utilization: float
    worst_ftf: float
    unfair_fraction: float
    worst_ftf_contention: float
    unfair_fraction_contention: float
    jobs_completed: int
    jobs_total: int
    decision_seconds: DecisionTimes
    lower_bound_s: float
    ftf: tuple[float | None, ...]
    ftf_contention: tuple[float | None, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready dict; the keys are the ones metrics.json promises."""
        return {
            "policy": self.policy,
            "makespan_s": self.makespan_s,
            "avg_jct_s": self.avg_jct_s,
            "utilization": self.utilization,
            "worst_ftf": self.worst_ftf,
            "unfair_fraction": self.unfair_fraction,
            "worst_ftf_contention": self.worst_ftf_contention,
            "unfair_fraction_contention": self.unfair_fraction_contention,
            "jobs_completed": self.jobs_completed,
            "jobs_total": self.jobs_total,
            "decision_seconds": {
                "median": self.decision_seconds.median,
                "p99": self.decision_seconds.p99,
                "max": self.decision_seconds.max,
            },
            "makespan_lower_bound_s": self.lower_bound_s,
            "makespan_over_lower_bound": (
                self.makespan_s / self.lower_bound_s if self.lower_bound_s > 0 else None
            ),
            "ftf": list(self.ftf),
            "ftf_contention": list(self.ftf_contention),
        }


def reference_ftf(job: JobOutcome, trace_jobs: int, gpus: int) -> float | None:
    """rho = JCT / (t_exclusive * max(1, N_trace / G)); None when the job did not finish."""
    jct = job.jct_s
    if jct is None or job.t_exclusive_s <= 0:
        return None
    return jct / (job.t_exclusive_s * max(1.0, trace_jobs / gpus))


def contention_ftf(job: JobOutcome, gpus: int) -> float | None:
    """rho with N = mean active jobs over the job's life: JCT / (t_excl * max(1, N / G))."""
    jct = job.jct_s
    if jct is None or job.t_exclusive_s <= 0:
        return None
    return jct / (job.t_exclusive_s * max(1.0, job.mean_active_jobs / gpus))


def utilization(result: SimResult) -> float:
    """Useful GPU-seconds over GPU-seconds available until the makespan."""
    if result.makespan_s <= 0:
        return 0.0
    busy = sum(r.busy_gpu_seconds for r in result.rounds)
    return busy / (result.cluster.total_gpus * result.makespan_s)


def utilization_over_time(result: SimResult) -> list[tuple[float, float]]:
    """(round start, busy share of the cluster in that round) for every round."""
    gpus = result.cluster.total_gpus
    points = []
    for r in result.rounds:
        length = r.end_s - r.start_s
        share = r.busy_gpu_seconds / (gpus * length) if length > 0 else 0.0
        points.append((r.start_s, share))
    return points


def summarize(result: SimResult) -> RunMetrics:
    gpus = result.cluster.total_gpus
    total = len(result.jobs)
    ftf = tuple(reference_ftf(j, total, gpus) for j in result.jobs)
    ftf_c = tuple(contention_ftf(j, gpus) for j in result.jobs)
    jcts = [j.jct_s for j in result.jobs if j.jct_s is not None]
    times = [r.decision_seconds for r in result.rounds]
    return RunMetrics(
        policy=result.policy,
        makespan_s=result.makespan_s,
        avg_jct_s=float(np.mean(jcts)) if jcts else 0.0,
        utilization=utilization(result),
        worst_ftf=_worst(ftf),
        unfair_fraction=_unfair(ftf),
        worst_ftf_contention=_worst(ftf_c),
        unfair_fraction_contention=_unfair(ftf_c),
        jobs_completed=len(jcts),
        jobs_total=total,
        decision_seconds=_decision_times(times),
        lower_bound_s=result.lower_bound_s,
        ftf=ftf,
        ftf_contention=ftf_c,
    )


def _worst(values: Sequence[float | None]) -> float:
    known = [v for v in values if v is not None]
    return max(known) if known else 0.0


def _unfair(values: Sequence[float | None]) -> float:
    known = [v for v in values if v is not None]
    return sum(1 for v in known if v > 1.0) / len(known) if known else 0.0


def _decision_times(times: Sequence[float]) -> DecisionTimes:
    if not times:
        return DecisionTimes(0.0, 0.0, 0.0)
    arr = np.asarray(times, dtype=float)
    return DecisionTimes(
        median=float(np.median(arr)), p99=float(np.percentile(arr, 99)), max=float(arr.max())
    )
