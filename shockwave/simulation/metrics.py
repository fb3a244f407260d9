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
- tenants (:class:`TenantFigures`): per tenant, the GPU-seconds it was entitled to (its
  water-filled share, capped by its demand: :mod:`shockwave.simulation.tenant_ledger`) and those it
  received, and ``worst_hour_ratio``, the lowest received / entitled over the hours in which it
  had demand; ``worst_tenant_ratio`` is the lowest of those over tenants, ``tenant_jain``
  Jain's index of the tenants' received / entitled over the whole run (1: every tenant got the
  same part of its entitlement). Each job's FTF within its tenant (``ftf_tenant``) is
  ``JCT / (t_exclusive * N)`` with N the jobs per GPU of its fair share inside its tenant's
  share, averaged over its rounds (:attr:`shockwave.domain.tenancy.TenantMarket.contention`).
- lower bound: the workload's makespan lower bound on this cluster (see
  :meth:`~shockwave.workloads.workload.Workload.makespan_lower_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from shockwave.simulation.simulator import JobOutcome, SimResult


@dataclass(frozen=True, slots=True)
class DecisionTimes:
    median: float
    p99: float
    max: float


MIN_HOUR_SHARE = 0.05
"""An hour enters a tenant's ``worst_hour_ratio`` when its entitlement that hour is at least
this share of an hour of one GPU (3 GPU-minutes): in an hour where a tenant's demand lasted
seconds (its first job arrived at the hour's last tick) no scheduler can show a ratio."""


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """One tenant's figures over a run (GPU-seconds; ratios received / entitled)."""

    entitled_gpu_s: float
    received_gpu_s: float
    worst_hour_ratio: float
    hours: int
    jobs: int
    avg_jct_s: float
    worst_ftf: float

    def as_dict(self) -> dict[str, object]:
        return {
            "entitled_gpu_s": self.entitled_gpu_s,
            "received_gpu_s": self.received_gpu_s,
            "ratio": self.received_gpu_s / self.entitled_gpu_s if self.entitled_gpu_s else None,
            "worst_hour_ratio": self.worst_hour_ratio,
            "hours": self.hours,
            "jobs": self.jobs,
            "avg_jct_s": self.avg_jct_s,
            "worst_ftf": self.worst_ftf,
        }


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
    tenants: dict[str, TenantFigures] = field(default_factory=dict)
    worst_tenant_ratio: float = 1.0
    tenant_jain: float = 1.0
    ftf_tenant: tuple[float | None, ...] = ()

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
            "tenants": {name: t.as_dict() for name, t in self.tenants.items()},
            "worst_tenant_ratio": self.worst_tenant_ratio,
            "tenant_jain": self.tenant_jain,
            "ftf_tenant": list(self.ftf_tenant),
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


def tenant_ftf(job: JobOutcome) -> float | None:
    """rho within the job's tenant: JCT / (t_excl * N_tenant), N_tenant the jobs per GPU of the
    job's fair share inside its tenant's share over its rounds (at least 1)."""
    jct = job.jct_s
    if jct is None or job.t_exclusive_s <= 0:
        return None
    return jct / (job.t_exclusive_s * max(1.0, job.mean_tenant_contention))


def tenant_figures(
    result: SimResult, ftf_tenant: Sequence[float | None]
) -> dict[str, TenantFigures]:
    """Each tenant's :class:`TenantFigures` (tenants in path order)."""
    names = sorted({j.tenant for j in result.jobs} | set(result.tenant_hours))
    figures: dict[str, TenantFigures] = {}
    for name in names:
        hours = result.tenant_hours.get(name, ())
        ratios = [got / ent for _, ent, got in hours if ent >= MIN_HOUR_SHARE * 3600.0]
        jobs = [j for j in result.jobs if j.tenant == name]
        jcts = [j.jct_s for j in jobs if j.jct_s is not None]
        rhos = [r for j, r in zip(result.jobs, ftf_tenant, strict=True) if j.tenant == name]
        figures[name] = TenantFigures(
            entitled_gpu_s=sum(ent for _, ent, _ in hours),
            received_gpu_s=sum(got for _, _, got in hours),
            worst_hour_ratio=min(ratios) if ratios else 1.0,
            hours=len(ratios),
            jobs=len(jobs),
            avg_jct_s=float(np.mean(jcts)) if jcts else 0.0,
            worst_ftf=_worst(rhos),
        )
    return figures


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything."""
    squares = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * squares) if values and squares > 0 else 1.0


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
    ftf_t = tuple(tenant_ftf(j) for j in result.jobs)
    tenants = tenant_figures(result, ftf_t)
    shares = [t.received_gpu_s / t.entitled_gpu_s for t in tenants.values() if t.entitled_gpu_s]
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
        tenants=tenants,
        worst_tenant_ratio=min((t.worst_hour_ratio for t in tenants.values()), default=1.0),
        tenant_jain=jain_index(shares),
        ftf_tenant=ftf_t,
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
