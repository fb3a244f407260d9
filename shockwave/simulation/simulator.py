"""Trace-driven, discrete-event simulator on a virtual clock.

It runs any registered policy on a :class:`~shockwave.workloads.workload.Workload` with the same
``decide(snapshot, params)`` call the service makes. Each job follows its true batch-size
trajectory; the policy sees only what a real scheduler would (its spec, observed epochs, the
regimes it has left behind, measured epoch times).

Rounds go through the core's round engine (:mod:`shockwave.rounds.engine`), the same rule the
service's round driver applies, so a trace gets here what the service would give it:

1. At a boundary, admit every job whose arrival time has passed, build the snapshot and ask the
   policy for a plan. The plan is usable ``plan_latency_s`` after the state it reflects
   (0: at once, the reference's setting); the engine takes the freshest usable plan's column
   for the round (``plan``), an older plan's (``previous_plan``) or first in, first out
   (``greedy``), and places it over the node list (nodes may differ in size).
2. Each placed job runs ``e = min(lease, time it needs to finish)`` seconds. A job that did not
   run in the previous round (a start or a resume), or that was moved to other GPUs, pays the
   checkpoint-restart overhead: its useful time is ``e - overhead`` when ``e`` exceeds
   ``lease - overhead_guard`` (a short final stretch is not charged, as in the reference).
3. Between boundaries (``mid_round_fills``, on by default), the simulation is event-driven: when
   a job finishes or arrives, the engine's :func:`~shockwave.rounds.engine.fill` starts waiting jobs
   on the free GPUs at once, with a lease to the boundary (a start, so the overhead rule applies
   with that shorter lease). Off, the reference's mechanics hold exactly: jobs start only at
   boundaries and a GPU freed mid-round idles until the boundary
   (``SimSettings(mid_round_fills=False)`` reproduces the earlier figures).
4. The round ends when its longest stretch ends: normally at the boundary, sooner only when
   every running job finishes early and nothing waiting could start.

What the policy may learn from finished jobs: when a job finishes, its observed trajectory and
measured epoch times join the population prior (:mod:`shockwave.domain.population`) that the next
snapshots carry, so a prediction only ever knows the jobs finished before it (no look-ahead).
Where the jobs belong to more than one tenant, each tenant's jobs learn apart, as in the service
(no tenant's jobs learn from another's): from their tenant's prior, learnt from its finished jobs,
and from the measurements of their tenant's active jobs (``Snapshot.prior_groups``).

Nothing here reads a clock: pass ``timer`` (e.g. ``time.perf_counter``) to measure how long the
policy takes per decision.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shockwave.domain.model import Cluster, Regime
from shockwave.domain.population import EMPTY_PRIOR, FinishedJob, PopulationPrior
from shockwave.domain.snapshot import ActiveJob, JobProgress, RevealedTrajectory, Snapshot
from shockwave.domain.stints import useful_seconds
from shockwave.market import heterogeneity
from shockwave.policies.policy import Decision, Policy, SolveSummary
from shockwave.rounds import engine
from shockwave.rounds.engine import SOURCES, Plan
from shockwave.simulation.prediction_report import AtUse
from shockwave.simulation.tenant_ledger import TenantLedger
from shockwave.workloads.workload import SimJob, Workload

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SimSettings:
    """Knobs of the simulated system (not of the policy).

    ``round_seconds``: round length (paper and reference: 120 s). ``restart_overhead_s``: the
    checkpoint-restart cost of a start, resume or move (reference: 20 s). ``overhead_guard_s``:
    the overhead is charged only when the job runs more than ``round_seconds - guard`` in that
    round (reference: 5 s). ``charge_on_move``: also charge a continuing job whose GPUs changed.
    ``max_rounds``: a safety stop for a policy that never finishes the workload.
    ``reveal_trajectories``: hand the policy every job's true trajectory (oracle experiments
    only, to measure what prediction costs). ``learn_population``: learn the population prior
    from each job as it finishes (off: every snapshot carries the empty prior, the paper's
    setting of one prior for every job). ``mid_round_fills``: start waiting jobs on GPUs freed
    between boundaries (off: the reference's mechanics). ``plan_latency_s``: seconds from the
    state a plan is computed for to when the plan can be used (the solve time); > 0 exercises
    the previous-plan and first-in-first-out fallbacks as the service meets them.
    ``heterogeneity_agnostic``: on a typed cluster, show the policy an untyped one and no
    per-type knowledge (:func:`shockwave.market.heterogeneity.agnostic_view`); jobs still run at
    the true speed of the type they land on.
    """

    round_seconds: float = 120.0
    restart_overhead_s: float = 20.0
    overhead_guard_s: float = 5.0
    charge_on_move: bool = True
    max_rounds: int = 200_000
    reveal_trajectories: bool = False
    learn_population: bool = True
    mid_round_fills: bool = True
    plan_latency_s: float = 0.0
    heterogeneity_agnostic: bool = False

    def __post_init__(self) -> None:
        if not self.plan_latency_s >= 0:
            raise ValueError(f"plan_latency_s must be >= 0, got {self.plan_latency_s}")
        if not self.round_seconds > 0:
            raise ValueError(f"round_seconds must be > 0, got {self.round_seconds}")
        if self.restart_overhead_s < 0 or self.overhead_guard_s < 0:
            raise ValueError("restart_overhead_s and overhead_guard_s must be >= 0")
        if self.max_rounds <= 0:
            raise ValueError("max_rounds must be > 0")


class PolicyContractError(RuntimeError):
    """A policy returned a decision that breaks the interface (unknown job, over capacity)."""


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One simulated round: when it ran, who held which GPUs from the boundary
    (``assignment``) and who started mid-round (``fills``), the useful GPU-seconds, and where
    the boundary's jobs came from (``source``: plan, previous_plan or greedy)."""

    index: int
    start_s: float
    end_s: float
    assignment: Mapping[str, tuple[int, ...]]
    busy_gpu_seconds: float
    active_jobs: int
    decision_seconds: float
    source: str = "plan"
    fills: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one job fared. ``mean_active_jobs``: active jobs per round over the job's life.
    ``scalings``: (time, new batch size) at each change of batch size while it trained.
    ``tenant``: its tenant's path. ``mean_tenant_contention``: the jobs per GPU of its fair
    share inside its tenant's share (:attr:`shockwave.domain.tenancy.TenantMarket.contention`),
    averaged over its rounds: the N of its finish-time fairness within its tenant."""

    job_id: str
    gpus: int
    arrival_s: float
    finish_s: float | None
    t_exclusive_s: float
    attained_s: float
    restarts: int
    mean_active_jobs: float
    scalings: tuple[tuple[float, int], ...] = ()
    tenant: str = ""
    mean_tenant_contention: float = 1.0

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class SimResult:
    """Everything a run produced; :mod:`shockwave.simulation.metrics` turns it into figures.

    ``final_state``: the policy state of the last decision (the policy's own type), None for a
    policy without state. ``solve``: the last decision's solve figures, for reports (None for
    a policy that solves nothing). ``tenant_hours``: tenant -> (hour, entitled GPU-s,
    received GPU-s) for each hour of the run in which it had either
    (:class:`~shockwave.simulation.tenant_ledger.TenantLedger`).
    """

    policy: str
    workload: str
    cluster: Cluster
    settings: SimSettings
    makespan_s: float
    lower_bound_s: float
    jobs: tuple[JobOutcome, ...]
    rounds: tuple[RoundRecord, ...]
    notes: Mapping[str, Any] = field(default_factory=dict)
    final_state: object | None = None
    solve: SolveSummary | None = None
    tenant_hours: Mapping[str, tuple[tuple[int, float, float], ...]] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        return sum(1 for j in self.jobs if j.finish_s is not None)


class _JobRun:
    """Mutable true state of one job inside a run (never shown to the policy as such)."""

    __slots__ = (
        "_before",
        "_measures",
        "_view",
        "active_rounds",
        "active_sum",
        "attained",
        "executed_last",
        "finish",
        "gpu_type",
        "gpus",
        "measured",
        "measured_by_type",
        "regime_done",
        "regime_index",
        "restarts",
        "scalings",
        "sim",
        "tenant_contention",
        "width",
    )

    def __init__(self, sim: SimJob) -> None:
        self.sim = sim
        self.regime_index = 0
        self.regime_done = 0.0
        self.attained = 0.0
        self.executed_last = 0.0
        self.gpus: tuple[int, ...] = ()
        self.finish: float | None = None
        self.measured: dict[int, float] = {}
        self.measured_by_type: dict[str, dict[int, float]] = {}
        self.gpu_type = ""
        self.active_sum = 0.0
        self.active_rounds = 0
        self.restarts = 0
        self.scalings: list[tuple[float, int]] = []
        self.width = sim.spec.gpus
        self.tenant_contention = 0.0
        # epochs of the trajectory before each regime, and the last view with what it showed
        self._before = [0, *itertools.accumulate(r.epochs for r in sim.trajectory)]
        self._measures = 0
        self._view: tuple[Hashable, ActiveJob] | None = None

    @property
    def job_id(self) -> str:
        return self.sim.spec.job_id

    @property
    def regime(self) -> Regime:
        return self.sim.trajectory[min(self.regime_index, len(self.sim.trajectory) - 1)]

    @property
    def done(self) -> bool:
        return self.regime_index >= len(self.sim.trajectory)

    def epochs_done(self) -> float:
        before = self._before[min(self.regime_index, len(self.sim.trajectory))]
        return float(min(self.sim.spec.epochs, before + self.regime_done))

    def _type_epoch_seconds(self, batch_size: int) -> float:
        """True seconds per epoch on the requested count, on the GPU type the job runs on now."""
        if not self.gpu_type:
            return self.sim.epoch_seconds[batch_size]
        return heterogeneity.true_epoch_seconds(self.sim, self.gpu_type, batch_size)

    def epoch_seconds(self, batch_size: int, gpus: int) -> float:
        """True seconds per epoch at ``batch_size`` on ``gpus`` GPUs (an elastic job off its
        requested count runs at its range's speed-up)."""
        seconds = self._type_epoch_seconds(batch_size)
        elastic = self.sim.spec.elastic
        if elastic is None or gpus == self.sim.spec.gpus:
            return seconds
        return seconds / elastic.factor(gpus, self.sim.spec.gpus, batch_size)

    def seconds_to_finish(self, gpus: int | None = None) -> float:
        gpus = self.sim.spec.gpus if gpus is None else gpus
        total = 0.0
        for i in range(self.regime_index, len(self.sim.trajectory)):
            regime = self.sim.trajectory[i]
            left = regime.epochs - (self.regime_done if i == self.regime_index else 0.0)
            total += left * self.epoch_seconds(regime.batch_size, gpus)
        return total

    def advance(self, seconds: float, start_s: float = 0.0, gpus: int | None = None) -> None:
        """Train for ``seconds`` of useful time from ``start_s`` on ``gpus`` GPUs (default: the
        requested count), crossing regime boundaries as the truth says; each crossing to a new
        batch size is noted in ``scalings``. What the scheduler measures is the epoch time on
        the requested count (a shell normalizes an elastic job's by its declared speed-up), per
        GPU type on a typed cluster."""
        gpus = self.sim.spec.gpus if gpus is None else gpus
        now = start_s
        while seconds > _EPS and not self.done:
            regime = self.sim.trajectory[self.regime_index]
            per_epoch = self.epoch_seconds(regime.batch_size, gpus)
            self._measures += 1
            if self.gpu_type in self.sim.epoch_seconds_by_type:
                self.measured_by_type.setdefault(self.gpu_type, {})[regime.batch_size] = (
                    self._type_epoch_seconds(regime.batch_size)
                )
            else:
                self.measured[regime.batch_size] = self.sim.epoch_seconds[regime.batch_size]
            left = regime.epochs - self.regime_done
            if seconds + _EPS >= left * per_epoch:
                seconds -= left * per_epoch
                now += left * per_epoch
                self.regime_index += 1
                self.regime_done = 0.0
                if not self.done and self.regime.batch_size != regime.batch_size:
                    self.scalings.append((now, self.regime.batch_size))
            else:
                self.regime_done += seconds / per_epoch
                seconds = 0.0

    def finished(self) -> FinishedJob:
        """What the scheduler saw of the job once it finished: every regime and epoch time."""
        return FinishedJob(self.sim.spec, self.sim.trajectory, self.measured)

    def view(self) -> ActiveJob:
        """The job as the scheduler sees it now (the same object as last time while nothing
        it shows has changed: a waiting job's)."""
        shown = (
            self.regime_index,
            self.regime_done,
            self.attained,
            self.executed_last,
            self.gpus,
            self._measures,
        )
        if self._view is not None and self._view[0] == shown:
            return self._view[1]
        progress = JobProgress(
            batch_size=self.regime.batch_size,
            epochs_done=self.epochs_done(),
            observed_regimes=self.sim.trajectory[: self.regime_index],
            measured_epoch_seconds=self.measured,
            attained_s=self.attained,
            executed_last_round_s=self.executed_last,
            gpus=self.gpus,
            measured_by_type=self.measured_by_type,
        )
        job = ActiveJob(spec=self.sim.spec, progress=progress)
        self._view = (shown, job)
        return job


RoundCallback = Callable[[float, int, int], None]


def simulate(
    workload: Workload,
    cluster: Cluster,
    policy: Policy,
    params: Any,
    settings: SimSettings | None = None,
    *,
    timer: Callable[[], float] | None = None,
    on_round: RoundCallback | None = None,
) -> SimResult:
    """Run ``policy`` on ``workload`` until every job finishes (or ``max_rounds``).

    ``on_round(now, finished, total)`` is called after every round, for progress bars.
    ``notes`` of the result count the boundaries by plan source (``sources``) and the jobs
    started mid-round (``fills``), and score the predictions the policy read at its decisions
    against the truth (``predictions``: :class:`AtUse`, prediction at the moment of use).
    """
    settings = settings or SimSettings()
    for job in workload.jobs:
        heterogeneity.check_fits_typed(job.spec, cluster)
    agnostic = settings.heterogeneity_agnostic and cluster.is_typed
    run = _Run(workload, cluster, settings)
    rounds: list[RoundRecord] = []
    state: object | None = None
    solve: SolveSummary | None = None
    plans: list[Plan] = []
    sources: dict[str, int] = dict.fromkeys(SOURCES, 0)
    fills = 0
    at_use = AtUse()
    truths = {r.job_id: r.sim for r in run.runs}
    now = run.pending[-1].sim.spec.arrival_s if run.pending else 0.0
    makespan = now

    for index in range(settings.max_rounds):
        run.admit(now)
        if not run.active:
            if not run.pending:
                break
            now = run.pending[-1].sim.spec.arrival_s
            continue
        snapshot = Snapshot(
            now=now,
            round_index=index,
            round_seconds=settings.round_seconds,
            cluster=cluster,
            jobs=tuple(r.view() for r in run.active),
            policy_state=state,
            revealed=_revealed(run.active) if settings.reveal_trajectories else {},
            population=run.prior,
            prior_groups=run.prior_groups(),
            priors=MappingProxyType(dict(run.priors)),
            tenants=workload.tenants,
            priority_classes=workload.priority_classes,
        )
        shares = snapshot.market()
        run.ledger.boundary(now, {r.job_id: (r.sim.spec.tenant, r.width) for r in run.active})
        for r in run.active:
            r.tenant_contention += shares.contention[r.job_id]
        if agnostic:
            snapshot = heterogeneity.agnostic_view(snapshot)
        started = timer() if timer else 0.0
        decision = policy.decide(snapshot, params)
        spent = (timer() - started) if timer else 0.0
        state, solve = decision.state, decision.solve
        _check_decision(decision, run.by_id, cluster)
        at_use.add(decision.predictions, truths)
        run.set_widths(decision)
        plans = [p for p in plans if p.base_round + len(p.rounds) > index]
        plans.append(
            Plan(
                index,
                decision.rounds,
                run.version,
                now + settings.plan_latency_s,
                index,
                {} if agnostic else decision.types,
            )
        )
        changes = engine.boundary(
            r=index,
            now=now,
            state_version=run.version,
            jobs=run.waiting_view(),
            plans=plans,
            leases=run.previous,
            cluster=cluster,
            conserve=settings.mid_round_fills,
            tenants=workload.tenants,
        )
        sources[changes.source] += 1
        lease_end = now + settings.round_seconds
        end = now
        held: dict[str, tuple[int, ...]] = {}
        for job_id, gpus in changes.assignment.items():
            restarted = job_id not in run.previous or (
                settings.charge_on_move and set(run.previous[job_id]) != set(gpus)
            )
            end = max(end, run.start(job_id, gpus, now, lease_end, restarted))
            held[job_id] = gpus
        for r in run.active:
            if r.job_id not in held:
                r.executed_last = 0.0
                r.gpus = ()
            r.active_sum += len(run.active)
            r.active_rounds += 1
        filled: dict[str, tuple[int, ...]] = {}
        if settings.mid_round_fills:
            upcoming = engine.choose_plan(plans, index + 1, now)
            prefer = engine.next_column(upcoming, index)
            types = upcoming.types if upcoming is not None else {}
            for t in run.events(now, lease_end):
                fill = engine.fill(
                    jobs=run.waiting_view(),
                    leases=run.leases(held),
                    cluster=cluster,
                    prefer=prefer,
                    types=types,
                    tenants=workload.tenants,
                )
                for job_id, gpus in fill.assignment.items():
                    end = max(end, run.start(job_id, gpus, t, lease_end, True))
                    held[job_id] = gpus
                    filled[job_id] = gpus
            fills += len(filled)
        if not held:
            end = now + settings.round_seconds
            if run.pending:
                end = min(end, max(now + _EPS, run.pending[-1].sim.spec.arrival_s))
        rounds.append(
            RoundRecord(
                index=index,
                start_s=now,
                end_s=end,
                assignment=MappingProxyType(dict(changes.assignment)),
                busy_gpu_seconds=run.take_busy(),
                active_jobs=len(run.active),
                decision_seconds=spent,
                source=changes.source,
                fills=MappingProxyType(filled),
            )
        )
        run.finish_round(held)
        makespan = end
        now = end
        if on_round:
            on_round(now, run.finished, len(run.runs))

    outcomes = tuple(
        JobOutcome(
            job_id=r.job_id,
            gpus=r.sim.spec.gpus,
            arrival_s=r.sim.spec.arrival_s,
            finish_s=r.finish,
            t_exclusive_s=heterogeneity.t_exclusive_s(r.sim, cluster),
            attained_s=r.attained,
            restarts=r.restarts,
            mean_active_jobs=r.active_sum / r.active_rounds if r.active_rounds else 0.0,
            scalings=tuple(r.scalings),
            tenant=r.sim.spec.tenant,
            mean_tenant_contention=(
                r.tenant_contention / r.active_rounds if r.active_rounds else 1.0
            ),
        )
        for r in run.runs
    )
    run.ledger.advance(makespan)
    return SimResult(
        policy=policy.name,
        workload=workload.name,
        cluster=cluster,
        settings=settings,
        makespan_s=makespan,
        lower_bound_s=heterogeneity.makespan_lower_bound(workload, cluster),
        jobs=outcomes,
        rounds=tuple(rounds),
        notes={"sources": sources, "fills": fills, "predictions": at_use},
        final_state=state,
        solve=solve,
        tenant_hours=MappingProxyType(run.ledger.hours()),
    )


class _Run:
    """The mutable state of one simulation between and within rounds: who is pending, active,
    holding GPUs, and the finish and arrival events of the round under way."""

    def __init__(self, workload: Workload, cluster: Cluster, settings: SimSettings) -> None:
        self.settings = settings
        self.cluster = cluster
        self.runs = [_JobRun(job) for job in workload.jobs]
        self.pending = sorted(self.runs, key=lambda r: r.sim.spec.arrival_s)
        self.pending.reverse()
        self.active: list[_JobRun] = []
        self.by_id: dict[str, _JobRun] = {}
        self.previous: dict[str, tuple[int, ...]] = {}
        self.prior: PopulationPrior = EMPTY_PRIOR
        self.apart = len({r.sim.spec.tenant for r in self.runs}) > 1
        self.priors: dict[str, PopulationPrior] = {}
        self.version = 0
        self.finished = 0
        self._busy = 0.0
        self._ends: list[tuple[float, int, str]] = []
        self._seq = 0
        self.ledger = TenantLedger(workload.tenants, cluster.total_gpus)

    def prior_groups(self) -> Mapping[str, str]:
        """Job id -> its learning group (its tenant) for the active jobs where the workload's
        jobs belong to more than one tenant; empty (one group) otherwise."""
        if not self.apart:
            return {}
        return MappingProxyType({r.job_id: r.sim.spec.tenant for r in self.active})

    def admit(self, now: float) -> None:
        while self.pending and self.pending[-1].sim.spec.arrival_s <= now + _EPS:
            r = self.pending.pop()
            self.active.append(r)
            self.by_id[r.job_id] = r
            self.version += 1

    def waiting_view(self) -> list[engine.Waiting]:
        """The active jobs for the engine, each at the width the last decision gave it."""
        return [engine.Waiting(r.job_id, r.width, r.sim.spec.tenant) for r in self.active]

    def set_widths(self, decision: Decision) -> None:
        """Each active job's width for this round: the decision's, else its requested count
        (an elastic job the decision does not run keeps its last width, for fills)."""
        for r in self.active:
            if r.job_id in decision.widths:
                r.width = decision.widths[r.job_id]
            elif r.job_id in decision.jobs or r.sim.spec.elastic is None:
                r.width = r.sim.spec.gpus

    def start(
        self, job_id: str, gpus: tuple[int, ...], now: float, lease_end: float, restarted: bool
    ) -> float:
        """Run ``job_id`` on ``gpus`` from ``now`` to at most ``lease_end``; when its stretch
        ends (the job finishes then if it is done)."""
        r = self.by_id[job_id]
        r.gpu_type = self.cluster.type_of(gpus[0]) if self.cluster.is_typed and gpus else ""
        lease = lease_end - now
        needed = r.seconds_to_finish(len(gpus))
        elapsed = min(lease, needed)
        useful = elapsed
        if restarted:
            r.restarts += 1
            useful = useful_seconds(
                elapsed, lease, self.settings.restart_overhead_s, self.settings.overhead_guard_s
            )
        r.advance(useful, now + elapsed - useful, len(gpus))
        r.attained += useful
        r.executed_last = useful
        r.gpus = gpus
        self._busy += useful * len(gpus)
        self.ledger.hold(r.sim.spec.tenant, now, now + elapsed, len(gpus))
        if r.done:
            r.finish = now + elapsed
            self.ledger.finish(job_id, now + elapsed)
            heapq.heappush(self._ends, (now + elapsed, self._seq, job_id))
            self._seq += 1
        return now + elapsed

    def leases(self, held: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """The GPUs held now: every stretch of the round whose job is still active."""
        return {j: g for j, g in held.items() if j in self.by_id}

    def events(self, now: float, lease_end: float) -> Iterator[float]:
        """Mid-round event times in order, after each has been applied (a finish frees the
        job's GPUs and teaches the prior; an arrival admits the job). The caller fills the
        GPUs then; a stretch it starts may add a finish event."""
        while True:
            t_end = self._ends[0][0] if self._ends else math.inf
            t_arr = self.pending[-1].sim.spec.arrival_s if self.pending else math.inf
            t = min(t_end, t_arr)
            if t >= lease_end - _EPS:
                return
            while self._ends and self._ends[0][0] <= t + _EPS:
                _, _, job_id = heapq.heappop(self._ends)
                done = self.by_id.get(job_id)
                self._retire([done] if done is not None else [])
            self.admit(t)
            yield t

    def _retire(self, done: list[_JobRun]) -> None:
        if not done:
            return
        if self.settings.learn_population:
            for r in sorted(done, key=lambda r: r.finish or 0.0):
                self.prior = self.prior.learn(r.finished())
                if self.apart:
                    tenant = r.sim.spec.tenant
                    self.priors[tenant] = self.priors.get(tenant, EMPTY_PRIOR).learn(r.finished())
        for r in done:
            del self.by_id[r.job_id]
        self.active = [r for r in self.active if r.job_id in self.by_id]
        self.finished += len(done)
        self.version += 1

    def take_busy(self) -> float:
        busy, self._busy = self._busy, 0.0
        return busy

    def finish_round(self, held: Mapping[str, tuple[int, ...]]) -> None:
        """Close the round: retire the jobs done by its end, keep who holds which GPUs."""
        self._ends.clear()
        self._retire([r for r in self.active if r.done])
        self.previous = {r.job_id: r.gpus for r in self.active if r.job_id in held and r.gpus}


def _revealed(active: list[_JobRun]) -> dict[str, RevealedTrajectory]:
    return {
        run.job_id: RevealedTrajectory(run.sim.trajectory, run.sim.epoch_seconds) for run in active
    }


def _check_decision(decision: Decision, active: Mapping[str, _JobRun], cluster: Cluster) -> None:
    """Check the policy kept the interface's promises (known jobs, once each, within the GPUs)."""
    seen: set[str] = set()
    width = 0
    for job_id in decision.jobs:
        if job_id not in active:
            raise PolicyContractError(f"decision names job {job_id!r}, which is not active")
        if job_id in seen:
            raise PolicyContractError(f"decision names job {job_id!r} twice")
        seen.add(job_id)
        spec = active[job_id].sim.spec
        gpus = decision.widths.get(job_id, spec.gpus)
        if gpus != spec.gpus and (spec.elastic is None or gpus not in spec.elastic.widths):
            raise PolicyContractError(
                f"decision runs job {job_id!r} on {gpus} GPUs, not a count it declared"
            )
        width += gpus
    if width > cluster.total_gpus:
        raise PolicyContractError(
            f"decision asks for {width} GPUs but the cluster has {cluster.total_gpus}"
        )
