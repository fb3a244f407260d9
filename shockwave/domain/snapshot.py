"""What a policy may see: the snapshot of the cluster and its active jobs at a round boundary.

A snapshot holds only what a real scheduler knows: each job's declared spec, the epochs it has
finished, the batch size it runs at now, the regimes it has already left behind (learnt from its
scaling events), the epoch times measured so far and the service it has had. It never holds a
job's future trajectory. The simulator and the service build the same snapshot type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shockwave.domain.memo import IdentityMemo
from shockwave.domain.model import Cluster, JobSpec, Regime
from shockwave.domain.population import EMPTY_PRIOR, PopulationPrior
from shockwave.domain.stints import Stint
from shockwave.domain.tenancy import Tenant, TenantMarket, market

PART_OF_NEXT_EPOCH = 0.99
"""The most of its next epoch :meth:`ActiveJob.trained_for` credits a running job with."""


@dataclass(frozen=True, slots=True)
class JobProgress:
    """Observed progress of one job.

    ``epochs_done`` counts finished epochs (fractional where the shell reports within-epoch
    progress). ``observed_regimes`` are the regimes the job has completed, in order; the current
    regime, at ``batch_size``, started at epoch ``sum(r.epochs for r in observed_regimes)``.
    ``attained_s`` is the wall time the job has held its GPUs doing useful work;
    ``executed_last_round_s`` the useful seconds it got in the round just ended;
    ``gpus`` the global GPU indices it held in that round (empty when it did not run).
    ``measured_by_type``: epoch seconds measured on GPU types other than the reference one,
    type -> batch size -> seconds (``measured_epoch_seconds`` holds the reference type's).
    ``stints``: the job's stints on GPUs as the shell's lease history has them, a live one to
    its lease's end (the start of the round decided); ``None`` where the shell keeps no such
    history (the simulator, whose decisions come at the boundary with exact progress). A policy
    that ranks jobs by the service they received counts it from these when given
    (:func:`shockwave.domain.stints.received_seconds`): a job's reports lag and round its training,
    its leases do not.
    """

    batch_size: int
    epochs_done: float = 0.0
    observed_regimes: tuple[Regime, ...] = ()
    measured_epoch_seconds: Mapping[int, float] = field(default_factory=dict)
    attained_s: float = 0.0
    executed_last_round_s: float = 0.0
    gpus: tuple[int, ...] = ()
    measured_by_type: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    stints: tuple[Stint, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "measured_epoch_seconds", MappingProxyType(dict(self.measured_epoch_seconds))
        )
        object.__setattr__(
            self,
            "measured_by_type",
            MappingProxyType(
                {t: MappingProxyType(dict(m)) for t, m in self.measured_by_type.items()}
            ),
        )


@dataclass(frozen=True, slots=True)
class ActiveJob:
    """An admitted, unfinished job: its spec and what has been observed of it."""

    spec: JobSpec
    progress: JobProgress

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def remaining_epochs(self) -> float:
        return max(0.0, self.spec.epochs - self.progress.epochs_done)

    @property
    def running(self) -> bool:
        """Whether the job held GPUs in the round that just ended."""
        return bool(self.progress.gpus)

    def epoch_seconds(self, batch_size: int | None = None) -> float | None:
        """Seconds per epoch at ``batch_size`` (default: the current one), or None if unknown.

        A measurement wins over the declared throughput profile: it is what the job really did.
        """
        bs = self.progress.batch_size if batch_size is None else batch_size
        measured = self.progress.measured_epoch_seconds.get(bs)
        if measured is not None:
            return measured
        if self.spec.throughput.knows(bs):
            return self.spec.throughput.epoch_seconds(bs, self.spec.samples_per_epoch)
        return None

    def steps_per_second(self) -> float | None:
        """Iterations per second at the current batch size (Gavel's throughput unit)."""
        seconds = self.epoch_seconds()
        if seconds is None:
            return None
        return self.steps_per_epoch() / seconds

    def steps_per_epoch(self, batch_size: int | None = None) -> int:
        bs = self.progress.batch_size if batch_size is None else batch_size
        return -(-self.spec.samples_per_epoch // bs)

    def trained_for(self, seconds: float, carried_s: float = 0.0) -> ActiveJob:
        """The job as it stands ``seconds`` of training on the GPUs it holds after its last
        report, with ``carried_s`` seconds trained since that report by its earlier attempts:
        its reported epochs plus the part of the next one those seconds cover at its epoch time
        (measured, else declared; the held GPUs' part of an elastic job off its requested count
        at its range's speed-up, the carried part at its requested count).

        A program reports each epoch as it ends, so a shell that knows only the reports sees a
        running job up to one epoch behind (an epoch of the reference jobs takes 1 to 590 s),
        where the simulator sees its fractional progress: the policy's remaining work, and so
        its finish-time and makespan estimates, then differ between the two. A program stopped
        mid-epoch checkpoints where it is and resumes from there (the SDK's examples checkpoint
        at the next step), so what its earlier attempts trained of the epoch counts too, queued
        or running. The part stays under one epoch (:data:`PART_OF_NEXT_EPOCH`): only the job's
        own report moves it past the next epoch, and never to its end. Unchanged for a job
        with no such time or whose epoch time is unknown."""
        per_epoch = self.epoch_seconds()
        if per_epoch is None or per_epoch <= 0:
            return self
        part = max(0.0, carried_s) / per_epoch
        width = len(self.progress.gpus)
        if seconds > 0 and width > 0:
            held = per_epoch
            if self.spec.elastic is not None:  # 1.0 on the requested count
                held /= self.spec.elastic.factor(width, self.spec.gpus, self.progress.batch_size)
            part += seconds / held
        if part <= 0:
            return self
        whole = float(int(self.progress.epochs_done))
        done = min(
            whole + min(part, PART_OF_NEXT_EPOCH), self.spec.epochs - (1 - PART_OF_NEXT_EPOCH)
        )
        if done <= self.progress.epochs_done:
            return self
        return ActiveJob(self.spec, replace(self.progress, epochs_done=done))

    def remaining_seconds_at_current_rate(self) -> float | None:
        """Remaining time if the job kept its current batch size (what reactive policies assume)."""
        seconds = self.epoch_seconds()
        return None if seconds is None else self.remaining_epochs * seconds


@dataclass(frozen=True, slots=True)
class RevealedTrajectory:
    """A job's true future, for oracle experiments in the simulator only.

    A real scheduler never has this; the simulator hands it over only when asked
    (``SimSettings.reveal_trajectories``), to measure how much prediction costs.
    """

    trajectory: tuple[Regime, ...]
    epoch_seconds: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The input of every policy at a round boundary.

    ``jobs`` are the active jobs in arrival order. ``policy_state`` is whatever the same policy
    returned in its previous :class:`~shockwave.policies.policy.Decision` (None at the first round),
    so that a policy with memory (priorities, plans) stays a pure function. ``revealed`` is empty
    except in oracle experiments (see :class:`RevealedTrajectory`). ``population``: what the
    jobs that have finished so far teach (:mod:`shockwave.domain.population`): their trajectories
    and measured rates, never a job's future. ``excluded``: active jobs the shell could not turn
    into a job of the model (a stored spec that the model's bounds now refuse), with why; they
    are not in ``jobs`` and a decision reports them
    (:func:`shockwave.policies.policy.decide_isolating`). ``round_start_s``: when round
    ``round_index`` starts, on ``now``'s clock, where the shell decides ahead of it (the service
    plans the next round during the current one, at every change); None where it decides at the
    round's start (the simulator): then it is ``now``. ``tenants``: the configured tenants by path
    (:mod:`shockwave.domain.tenancy`; a tenant not in it has weight 1 and no limits);
    ``priority_classes``: priority class name -> its multiplier of a job's weight within its tenant
    (a class not in it: 1). Both empty: one default tenant, every job's weight its own budget, as
    before tenants. ``prior_groups`` / ``priors``: where jobs must learn apart (the service: one
    group per tenant, named by its path, so that no tenant's jobs learn from another's
    self-reported epochs), each job's group (job id to group) and each group's prior; a job in a
    group plans with its group's prior and the measurements of its group's active jobs only
    (:meth:`learning_groups`; with other tenants beside it, :meth:`learns_apart`). A
    job in no group (the simulator's: both are empty) learns from ``population`` and every
    other job in no group.
    """

    now: float
    round_index: int
    round_seconds: float
    cluster: Cluster
    jobs: tuple[ActiveJob, ...]
    policy_state: object | None = None
    revealed: Mapping[str, RevealedTrajectory] = field(default_factory=dict)
    population: PopulationPrior = EMPTY_PRIOR
    excluded: Mapping[str, str] = field(default_factory=dict)
    round_start_s: float | None = None
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    priority_classes: Mapping[str, float] = field(default_factory=dict)
    prior_groups: Mapping[str, str] = field(default_factory=dict)
    priors: Mapping[str, PopulationPrior] = field(default_factory=dict)

    @property
    def round_start(self) -> float:
        """When the round this snapshot is for starts: ``round_start_s``, else ``now``."""
        return self.now if self.round_start_s is None else self.round_start_s

    def market(self) -> TenantMarket:
        """The round's market by tenant (:func:`shockwave.domain.tenancy.market`): each tenant's
        water-filled share of the cluster, each job's budget and finish-time contention."""
        specs = [j.spec for j in self.jobs]
        # a function of the specs (the very objects), tenants and capacity: the simulator and
        # the policy ask for it with each snapshot, and it holds while no job comes or goes
        return _MARKETS.get(
            (self.tenants, self.priority_classes, *specs),
            self.cluster.total_gpus,
            lambda: market(specs, self.tenants, self.priority_classes, self.cluster.total_gpus),
        )

    def prior_of(self, job_id: str) -> PopulationPrior:
        """The prior job ``job_id`` plans with: its group's, else ``population``."""
        group = self.prior_groups.get(job_id)
        return self.population if group is None else self.priors.get(group, EMPTY_PRIOR)

    def learns_apart(self, job_id: str, shares: TenantMarket | None = None) -> bool:
        """Whether job ``job_id`` plans with a prior its tenant learns apart while other tenants
        share the cluster: it is in a learning group (``prior_groups``) and the round's market
        has more than one tenant (not :attr:`TenantMarket.single`). With one tenant, its prior
        is the cluster's, as ``population`` is, and plans as the one prior does. ``shares``:
        the round's market where the caller holds it (:meth:`market` keys its memo by every
        job's spec, so asking it once per job costs the square of the jobs)."""
        if job_id not in self.prior_groups:
            return False
        return not (self.market() if shares is None else shares).single

    def learning_groups(self) -> list[tuple[PopulationPrior, tuple[ActiveJob, ...]]]:
        """The jobs that learn from one another, with their prior: one entry per group (in
        order of first appearance among ``jobs``), the jobs in no group last."""
        grouped: dict[str | None, list[ActiveJob]] = {}
        for job in self.jobs:
            grouped.setdefault(self.prior_groups.get(job.job_id), []).append(job)
        return [
            (self.population if group is None else self.priors.get(group, EMPTY_PRIOR), tuple(js))
            for group, js in sorted(grouped.items(), key=lambda item: item[0] is None)
        ]

    def job(self, job_id: str) -> ActiveJob:
        for job in self.jobs:
            if job.job_id == job_id:
                return job
        raise KeyError(job_id)


_MARKETS: IdentityMemo[TenantMarket] = IdentityMemo(limit=16)
""":meth:`Snapshot.market` by (tenants, priority classes, the jobs' specs; capacity)."""
