"""Gavel's round-based mechanism that turns time-fraction allocations into rounds.

Every Gavel-style baseline (max-min fairness, MST, Themis, AlloX, Gandiva-Fair, OSSP) computes an
allocation ``x_j`` in [0, 1]: the share of time job j should hold its GPUs. This module turns
those fractions into a concrete job set per round, the way the reference simulator does
(SIMULATOR-NOTES.md section 1), so that our baselines reproduce the paper's figures:

1. Credit each job with the useful seconds it ran since the last recompute (``T_j``): the
   initial credit plus the work its finished epochs measure now (:func:`work_done_s`) less the
   work they measured at the last recompute. The reference adds each round's useful seconds
   to ``T_j`` once per decision; counting from the job's progress gives the same ``T_j`` in
   the simulator (one decision per round) and stays right where a shell decides several times
   a round or has no per-round figure (the service plans on every change, from client events).
   Where the shell gives a job's stints from its lease history (the service), the work is
   counted from those instead (:func:`service_s`): the reports lag and round each job's
   training by seconds to tens of seconds, which breaks the simulator's exact ties among jobs
   that held the same rounds; the leases say what each job held.
2. Recompute the allocation only when the set of active jobs changed since the last recompute
   *and* at least ``min_seconds_between_allocations`` have passed (or no recompute has yet
   happened after time 0: :func:`allocation_due`). At a recompute, fold the service each job got
   against its share into a deficit, ``deficit_j += x_j (t - t_last) - (T_j - credit)``, and
   reset ``T_j`` to the initial credit (half a round). ``t`` is the start of the round decided
   (``Snapshot.round_start``), the reference's clock: it decides once, at the round's start.
3. Rank jobs by priority ``x_j / T_j`` (0 for a job with no share), then deficit, then ``x_j``,
   ties in arrival order, and walk the list greedily: a gang that does not fit the GPUs left is
   skipped so that smaller jobs behind it can backfill.

A job admitted after the last recompute has no share yet, so it cannot run until the next
recompute (this is what shapes the reference's figures). The reference also walks it through the
greedy pass, where it takes GPUs that then stay idle; ``absent_jobs_hold_gpus`` (on by default)
keeps that too, though on the reference traces it changes nothing: such jobs rank last, so no job
behind them could have used those GPUs (docs/simulator.md).

A job the shell learnt of only after it had decided a recompute's round, though it arrived
before that round's start, is one the reference counted in that recompute: the service plans a
round ahead and begins it a little early, so a job submitted in the last seconds before the
boundary is not in the round's snapshot, and its share (and everyone's, for the next 1000 s)
would differ from the reference's. The next decision makes that recompute again with it
(:func:`late_arrivals`): from the inputs it was made from, at the same time, without folding
deficits twice or moving the gate. The simulator decides each round at its start with every
job that has arrived, so it never has a late job.

All state is carried in :class:`PriorityState`, returned in the decision and handed back in the
next snapshot, so ``decide`` stays a pure function. A shell may decide the same round several
times (the service plans the next round at every change during the current one): each such
decision starts from the state the round started with (:func:`round_start_state`), so the
last one is the decision the reference would make once, and a recompute made for a round is
made again, with the jobs known then, rather than closing the gate for the next 1000 s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, Self, TypeVar

from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.domain.stints import received_seconds
from shockwave.domain.tenancy import TenantMarket
from shockwave.policies.policy import Decision


class RoundMemory(Protocol):
    """A mechanism state that knows the round it was decided for and the state it started
    from (:func:`round_start_state`)."""

    @property
    def decided_round(self) -> int | None: ...

    @property
    def before(self) -> Self | None: ...


S = TypeVar("S", bound=RoundMemory)


class RecomputeMemory(Protocol):
    """A mechanism state that knows its last recompute: when, and the jobs it counted."""

    @property
    def recomputed_at(self) -> float | None: ...

    @property
    def job_set(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class AllocationJob:
    """The inputs Gavel gives every allocator, for one active job.

    ``steps_per_second``: isolated throughput of the whole gang at the current batch size
    (iterations/s). ``remaining_steps``: iterations left at the current batch size.
    ``age_s``: time since arrival. ``weight``: priority weight (the job's budget; with tenants,
    its market budget: its tenant's share split among the tenant's jobs,
    :func:`shockwave.domain.tenancy.job_budgets`). ``tenant``: the job's tenant path.
    ``tenant_gpus``: the GPUs its tenant is entitled to at this recompute
    (:func:`shockwave.domain.tenancy.entitlements`); None with a single tenant and no limits.
    ``weight_in_tenant``: the job's weight among its tenant's jobs (its budget times its
    priority class's multiplier).
    """

    job_id: str
    gpus: int
    steps_per_second: float
    remaining_steps: float
    age_s: float
    weight: float
    tenant: str = ""
    tenant_gpus: float | None = None
    weight_in_tenant: float = 1.0

    @property
    def remaining_seconds(self) -> float:
        return self.remaining_steps / self.steps_per_second


class Allocator(Protocol):
    """Computes time fractions. ``memory`` is the allocator's own state from its last call."""

    def __call__(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class TimeFractionParams:
    """Knobs of the round mechanism, with the reference simulator's values as defaults.

    ``min_seconds_between_allocations``: Gavel's gate between allocation recomputes (1000 s).
    ``initial_credit_s``: the credit T_j starts from (half a 120 s round).
    ``absent_jobs_hold_gpus``: see the module docstring.
    ``restart_overhead_s``, ``overhead_guard_s``: the restore a start costs and the short
    stretch spared it, as the simulator charges them
    (:class:`~shockwave.simulation.simulator.SimSettings`): what :func:`service_s` takes off a job's
    stints where the shell gives them."""

    min_seconds_between_allocations: float = 1000.0
    initial_credit_s: float = 60.0
    absent_jobs_hold_gpus: bool = True
    restart_overhead_s: float = 20.0
    overhead_guard_s: float = 5.0


@dataclass(frozen=True, slots=True)
class PriorityState:
    """Memory of the mechanism between rounds (plain values, so shells can persist it)."""

    allocation: Mapping[str, float] = field(default_factory=dict)
    recomputed_at: float | None = None
    recomputed_after_start: bool = False
    job_set: frozenset[str] = frozenset()
    received: Mapping[str, float] = field(default_factory=dict)
    deficit: Mapping[str, float] = field(default_factory=dict)
    memory: Mapping[str, Any] = field(default_factory=dict)
    work_base: Mapping[str, float] = field(default_factory=dict)
    """Per job, :func:`work_done_s` at the last recompute (0 before its first): ``received``
    is the initial credit plus the work done since."""
    origin_s: float | None = None
    """Time 0 of the reference's clock: the first job's arrival, set at the first recompute."""
    decided_round: int | None = None
    """The round the decision that returned this state was for."""
    recompute_inputs: tuple[AllocationJob, ...] = ()
    """What the last recompute allocated from: each job's inputs at ``recomputed_at``, and the
    shares and allocator memory it started from (``recompute_previous``, ``recompute_memory``):
    what making it again with a late arrival needs (:func:`late_arrivals`)."""
    recompute_previous: Mapping[str, float] = field(default_factory=dict)
    recompute_memory: Mapping[str, Any] = field(default_factory=dict)
    before: PriorityState | None = None
    """The state that decision started from (:func:`round_start_state`)."""


class TimeFractionPolicy:
    """Base of the Gavel-style baselines: subclasses set ``name``, ``Params`` and ``allocate``."""

    name: ClassVar[str]
    Params: ClassVar[type[Any]]

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        raise NotImplementedError

    def mechanism(self, params: Any) -> TimeFractionParams:
        """The round-mechanism knobs; a policy's Params may carry them as ``mechanism``."""
        found = getattr(params, "mechanism", None)
        return found if isinstance(found, TimeFractionParams) else TimeFractionParams()

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        knobs = self.mechanism(params)
        handed = snapshot.policy_state
        start = round_start_state(
            handed if isinstance(handed, PriorityState) else PriorityState(), snapshot.round_index
        )
        state = start
        now = snapshot.round_start
        active_ids = frozenset(j.job_id for j in snapshot.jobs)

        work = {job.job_id: service_s(job, snapshot, knobs) for job in snapshot.jobs}
        base = {job.job_id: state.work_base.get(job.job_id, 0.0) for job in snapshot.jobs}
        # to the microsecond: equal service ranks equal (ties go to arrival order), as it does
        # when the seconds are added up round by round
        received = {j: round(knobs.initial_credit_s + work[j] - base[j], 6) for j in work}
        deficit = {job.job_id: state.deficit.get(job.job_id, 0.0) for job in snapshot.jobs}
        allocation: Mapping[str, float] = {
            k: v for k, v in state.allocation.items() if k in active_ids
        }
        origin = first_arrival(snapshot) if state.origin_s is None else state.origin_s
        if state.recomputed_at is None and now > origin and any(v > 0 for v in work.values()):
            state = self._founding_recompute(state, snapshot, origin, params)
            allocation = state.allocation
        memory = state.memory
        recomputed_at = state.recomputed_at
        after_start = state.recomputed_after_start

        late = late_arrivals(snapshot.jobs, state)
        late_ids = {job.job_id for job in late}
        changed = active_ids != state.job_set | late_ids
        gate_open = allocation_due(
            recomputed_at, after_start, now, origin, knobs.min_seconds_between_allocations
        )
        job_set = state.job_set
        inputs, previous, memory_before = (
            state.recompute_inputs,
            state.recompute_previous,
            state.recompute_memory,
        )
        if changed and gate_open:
            since = 0.0 if recomputed_at is None else now - recomputed_at
            for job_id in active_ids:
                share = allocation.get(job_id, 0.0)
                deficit[job_id] += share * since - (received[job_id] - knobs.initial_credit_s)
                received[job_id] = knobs.initial_credit_s
                base[job_id] = work[job_id]
            shares = snapshot.market()
            inputs = tuple(allocation_job(job, now, shares) for job in snapshot.jobs)
            previous, memory_before = allocation, memory
            allocation, memory = self.allocate(
                inputs, snapshot.cluster.total_gpus, allocation, memory, params
            )
            recomputed_at = now
            after_start = after_start or now > origin
            job_set = active_ids
        elif late and recomputed_at is not None:
            # the last recompute again, as the reference made it: with the late jobs (deficit
            # and work base 0, as at their first recompute), at the same time
            shares = snapshot.market()
            inputs = (*inputs, *(allocation_job(job, recomputed_at, shares) for job in late))
            allocation, memory = self.allocate(
                inputs, snapshot.cluster.total_gpus, previous, memory_before, params
            )
            allocation = {k: v for k, v in allocation.items() if k in active_ids}
            job_set = job_set | late_ids

        chosen, reasons = _greedy_round(
            snapshot.jobs, allocation, received, deficit, snapshot, knobs
        )
        new_state = PriorityState(
            allocation=MappingProxyType(dict(allocation)),
            recomputed_at=recomputed_at,
            recomputed_after_start=after_start,
            job_set=job_set,
            received=MappingProxyType(received),
            deficit=MappingProxyType(deficit),
            memory=memory,
            work_base=MappingProxyType(base),
            origin_s=origin if recomputed_at is not None else None,
            decided_round=snapshot.round_index,
            recompute_inputs=inputs,
            recompute_previous=MappingProxyType(dict(previous)),
            recompute_memory=memory_before,
            before=replace(start, before=None),
        )
        return Decision(jobs=tuple(chosen), state=new_state, allocation=allocation, reasons=reasons)

    def _founding_recompute(
        self, state: PriorityState, snapshot: Snapshot, origin: float, params: Any
    ) -> PriorityState:
        """The recompute the reference made at time 0 (``origin``, the first arrival), where
        the shell ran its jobs before this policy's first decision (its first round went
        first in, first out: no plan was back yet): the jobs that had arrived by then, as they
        were (no progress), allocated at ``origin``. Without it the first recompute here would
        fold no deficit for that first round, and every job in it would carry a deficit one
        round off the reference's, which decides its ties with the others from then on."""
        founders = [job for job in snapshot.jobs if job.spec.arrival_s <= origin]
        shares = replace(snapshot, jobs=tuple(founders)).market()
        inputs = tuple(
            allocation_job(
                ActiveJob(job.spec, JobProgress(batch_size=job.spec.initial_batch_size)),
                origin,
                shares,
            )
            for job in founders
        )
        allocation, memory = self.allocate(
            inputs, snapshot.cluster.total_gpus, {}, state.memory, params
        )
        return replace(
            state,
            allocation=MappingProxyType(dict(allocation)),
            recomputed_at=origin,
            job_set=frozenset(job.job_id for job in founders),
            memory=memory,
            origin_s=origin,
            recompute_inputs=inputs,
            recompute_previous=MappingProxyType({}),
            recompute_memory=state.memory,
        )


def round_start_state(state: S, round_index: int) -> S:
    """The state a decision for ``round_index`` starts from: the one handed over, unless an
    earlier decision for the same round returned it (its ``decided_round``): then the state
    that one started from, so that deciding a round again replaces the earlier decision (the
    reference decides each round once; the service at every change before the round)."""
    if state.decided_round == round_index and state.before is not None:
        return state.before
    return state


def late_arrivals(jobs: Sequence[ActiveJob], state: RecomputeMemory) -> list[ActiveJob]:
    """The jobs that arrived by the last recompute's time but were not in it: the shell did not
    know them when it decided that round (see the module docstring); none before the first."""
    if state.recomputed_at is None:
        return []
    return [
        job
        for job in jobs
        if job.job_id not in state.job_set and job.spec.arrival_s <= state.recomputed_at
    ]


def allocation_due(
    recomputed_at: float | None,
    after_start: bool,
    now: float,
    origin: float,
    min_seconds: float,
) -> bool:
    """Whether a changed set of jobs may have its allocation recomputed at ``now``: the first
    time; once more at the first change after time 0 (``origin``, the first job's arrival:
    the reference's simulator starts at 0 with its first job, and recomputes again when
    ``now > 0``; counted from the first arrival, the rule is the same at any clock origin, such
    as the service's Unix time or a trace whose first job arrives at 1 s); then once
    ``min_seconds`` have passed since the last. ``after_start``: a recompute happened after
    time 0."""
    return (
        recomputed_at is None
        or (not after_start and now > origin)
        or now - recomputed_at >= min_seconds
    )


def first_arrival(snapshot: Snapshot) -> float:
    """The earliest arrival among the snapshot's jobs (time 0 of the reference's clock, read
    at the first recompute); the round's start where there are none."""
    return min((j.spec.arrival_s for j in snapshot.jobs), default=snapshot.round_start)


def work_done_s(job: ActiveJob) -> float:
    """Seconds of training the job's finished epochs took: each regime it left behind and the
    epochs of the current one, at the measured epoch time of their batch size (the declared
    one where none was measured). In the simulator this is the useful time it attained
    (restores excluded); in the service, what its progress events report."""
    total = 0.0
    seen = 0.0
    for regime in job.progress.observed_regimes:
        total += regime.epochs * (job.epoch_seconds(regime.batch_size) or 0.0)
        seen += regime.epochs
    current = max(0.0, job.progress.epochs_done - seen)
    return total + current * (job.epoch_seconds() or 0.0)


def service_s(job: ActiveJob, snapshot: Snapshot, knobs: TimeFractionParams) -> float:
    """The useful seconds ``job`` has received by the start of the round decided: from its
    stints where the shell keeps a lease history (:func:`shockwave.domain.stints.received_seconds`,
    the simulator's restore rule with ``knobs``), else from its progress
    (:func:`work_done_s` plus :func:`served_until_start`). The simulator's progress is exact,
    so jobs that held the same rounds tie exactly and the deficit decides; a service's reports
    lag and round a job's training by seconds to tens of seconds, enough to break those ties
    at random, where its leases say what each job held."""
    stints = job.progress.stints
    if stints is not None:
        return received_seconds(stints, knobs.restart_overhead_s, knobs.overhead_guard_s)
    return work_done_s(job) + served_until_start(job, snapshot)


def served_until_start(job: ActiveJob, snapshot: Snapshot) -> float:
    """Seconds a running job trains between the snapshot's time and the start of the round
    decided: its lease runs to that boundary. The reference decides at the round's start, when
    the round before is over and a job that ran in it has been served for all of it; a shell
    that plans during the round before (the service) sees that job served only up to the
    plan's time, so it would look less served than it is and keep its GPUs for a second round
    where the reference rotates it out. 0 where the decision is made at the round's start (the
    simulator) and for a job not running."""
    return max(0.0, snapshot.round_start - snapshot.now) if job.running else 0.0


def allocation_job(job: ActiveJob, now: float, shares: TenantMarket | None = None) -> AllocationJob:
    """Gavel's common inputs for one job; a job with unknown throughput counts as 1 step/s.
    ``shares``: the round's market by tenant (:meth:`Snapshot.market`); None or a single
    tenant: the job's weight is its own budget."""
    rate = job.steps_per_second() or 1.0
    market = shares if shares is not None and not shares.single else None
    return AllocationJob(
        job_id=job.job_id,
        gpus=job.spec.gpus,
        steps_per_second=rate,
        remaining_steps=max(job.remaining_epochs * job.steps_per_epoch(), 1e-9),
        age_s=max(0.0, now - job.spec.arrival_s),
        weight=job.spec.budget if market is None else market.budgets[job.job_id],
        tenant=job.spec.tenant,
        tenant_gpus=None if market is None else market.entitled.get(job.spec.tenant, 0.0),
        weight_in_tenant=job.spec.budget if market is None else market.multipliers[job.job_id],
    )


def _greedy_round(
    jobs: Sequence[ActiveJob],
    allocation: Mapping[str, float],
    received: Mapping[str, float],
    deficit: Mapping[str, float],
    snapshot: Snapshot,
    knobs: TimeFractionParams,
) -> tuple[list[str], dict[str, str]]:
    """Rank by (priority, deficit, share), walk greedily; return the round's jobs and reasons."""

    def priority(job_id: str) -> float:
        share = allocation.get(job_id, 0.0)
        return share / received[job_id] if share > 0 and received[job_id] > 0 else 0.0

    order = sorted(
        jobs,
        key=lambda j: (
            -priority(j.job_id),
            -deficit[j.job_id],
            -allocation.get(j.job_id, 0.0),
        ),
    )
    free = snapshot.cluster.total_gpus
    chosen: list[str] = []
    reasons: dict[str, str] = {}
    for job in order:
        job_id = job.job_id
        if job.spec.gpus > free:
            reasons[job_id] = f"needs {job.spec.gpus} GPUs, {free} left after higher priorities"
            continue
        if job_id not in allocation:
            reasons[job_id] = "arrived after the last allocation; waits for the next recompute"
            if knobs.absent_jobs_hold_gpus:
                free -= job.spec.gpus
            continue
        free -= job.spec.gpus
        chosen.append(job_id)
    return chosen, reasons
