"""A workload for the simulator: job specs plus each job's true batch-size trajectory.

The trajectory and the true epoch times are ground truth that only the simulator reads; the
policies see the :class:`~shockwave.domain.model.JobSpec` and observed progress only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from shockwave.domain.model import JobSpec, Regime, ValidationError
from shockwave.domain.tenancy import Tenant


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a workload.

    ``trajectory``: the regimes the job really goes through, in order; their epochs sum to
    ``spec.epochs`` and the first runs at ``spec.initial_batch_size``. ``epoch_seconds``: the true
    seconds per epoch on the job's GPUs at each batch size of the trajectory, running alone.
    ``trace_fields``: the job's original trace line fields (command, working directory, ...), kept
    so a workload can be written back in the same format. ``epoch_seconds_by_type``: the true
    epoch times on other GPU types (type -> batch size -> seconds); a type absent here runs at
    ``epoch_seconds`` (the reference type, :mod:`shockwave.market.heterogeneity`).
    """

    spec: JobSpec
    trajectory: tuple[Regime, ...]
    epoch_seconds: Mapping[int, float]
    trace_fields: Mapping[str, str] = field(default_factory=dict)
    epoch_seconds_by_type: Mapping[str, Mapping[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epoch_seconds", MappingProxyType(dict(self.epoch_seconds)))
        object.__setattr__(
            self,
            "epoch_seconds_by_type",
            MappingProxyType(
                {t: MappingProxyType(dict(m)) for t, m in self.epoch_seconds_by_type.items()}
            ),
        )
        object.__setattr__(self, "trace_fields", MappingProxyType(dict(self.trace_fields)))
        if not self.trajectory:
            raise ValidationError("trajectory", "needs at least one regime")
        total = sum(r.epochs for r in self.trajectory)
        if total != self.spec.epochs:
            raise ValidationError(
                "trajectory", f"regimes sum to {total} epochs but the job has {self.spec.epochs}"
            )
        for i, regime in enumerate(self.trajectory):
            seconds = self.epoch_seconds.get(regime.batch_size)
            if seconds is None or not seconds > 0:
                raise ValidationError(
                    f"trajectory[{i}]", f"no positive epoch time for batch size {regime.batch_size}"
                )

    @property
    def t_exclusive_s(self) -> float:
        """Run time alone on its requested GPUs: the sum of epochs x epoch time over regimes."""
        return sum(r.epochs * self.epoch_seconds[r.batch_size] for r in self.trajectory)

    @property
    def gpu_seconds(self) -> float:
        return self.t_exclusive_s * self.spec.gpus


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs in arrival order (ties kept in trace order).

    ``tenants``: the tenants' settings by path (:mod:`shockwave.domain.tenancy`; each job names its
    tenant in ``spec.tenant``, and a tenant not here has weight 1 and no limits).
    ``priority_classes``: priority class name -> its multiplier within a tenant.
    """

    jobs: tuple[SimJob, ...]
    name: str = "workload"
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    priority_classes: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [j.spec.job_id for j in self.jobs]
        if len(set(ids)) != len(ids):
            raise ValidationError("jobs", "job ids must be unique")

    def makespan_lower_bound(self, total_gpus: int) -> float:
        """The physical limit: max(total GPU-seconds / GPUs, latest arrival + exclusive run time).

        No schedule can finish the workload sooner, whatever the policy.
        """
        if not self.jobs:
            return 0.0
        work = sum(j.gpu_seconds for j in self.jobs) / total_gpus
        critical = max(j.spec.arrival_s + j.t_exclusive_s for j in self.jobs)
        return max(work, critical)
