"""Trace-driven, discrete-event simulator on a virtual clock.

It runs any registered policy on a :class:`~shockwave.workload.Workload` with the same
``decide(snapshot, params)`` call the service makes. Each job follows its true batch-size
trajectory; the policy sees only what a real scheduler would (its spec, observed epochs, the
regimes it has left behind, measured epoch times).

Round mechanics follow the reference Gavel/Shockwave simulator (SIMULATOR-NOTES.md section 1):

1. Admit every job whose arrival time has passed; jobs start only at round boundaries.
2. Build the snapshot and ask the policy for the round's jobs; place them on GPUs.
3. Each placed job runs ``e = min(round, time it needs to finish)`` seconds. A job that did not
   run in the previous round (a start or a resume), or that was moved to other GPUs, pays the
   checkpoint-restart overhead: its useful time is ``e - overhead`` when ``e`` exceeds
   ``round - overhead_guard`` (a short final stretch is not charged, as in the reference).
4. The round ends when its longest task ends: normally after ``round_seconds``, sooner only when
   every running job finishes early. GPUs freed mid-round stay idle until the boundary.

What the policy may learn from finished jobs: when a job finishes, its observed trajectory and
measured epoch times join the population prior (:mod:`shockwave.population`) that the next
snapshots carry, so a prediction only ever knows the jobs finished before it (no look-ahead).

Nothing here reads a clock: pass ``timer`` (e.g. ``time.perf_counter``) to measure how long the
policy takes per decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shockwave.model import Cluster, Regime
from shockwave.placement import place
from shockwave.policy import Decision, Policy, SolveSummary
from shockwave.population import EMPTY_PRIOR, FinishedJob, PopulationPrior
from shockwave.snapshot import ActiveJob, JobProgress, RevealedTrajectory, Snapshot
from shockwave.workload import SimJob, Workload

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
    setting of one prior for every job).
    """

    round_seconds: float = 120.0
    restart_overhead_s: float = 20.0
    overhead_guard_s: float = 5.0
    charge_on_move: bool = True
    max_rounds: int = 200_000
    reveal_trajectories: bool = False
    learn_population: bool = True

    def __post_init__(self) -> None:
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
    """One simulated round: when it ran, who held which GPUs, and the useful GPU-seconds."""

    index: int
    start_s: float
    end_s: float
    assignment: Mapping[str, tuple[int, ...]]
    busy_gpu_seconds: float
    active_jobs: int
    decision_seconds: float


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one job fared. ``mean_active_jobs``: active jobs per round over the job's life.
    ``scalings``: (time, new batch size) at each change of batch size while it trained."""

    job_id: str
    gpus: int
    arrival_s: float
    finish_s: float | None
    t_exclusive_s: float
    attained_s: float
    restarts: int
    mean_active_jobs: float
    scalings: tuple[tuple[float, int], ...] = ()

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class SimResult:
    """Everything a run produced; :mod:`shockwave.metrics` turns it into figures.

    ``final_state``: the policy state of the last decision (the policy's own type), None for a
    policy without state. ``solve``: the last decision's solve figures, for reports (None for
    a policy that solves nothing).
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

    @property
    def completed(self) -> int:
        return sum(1 for j in self.jobs if j.finish_s is not None)


class _JobRun:
    """Mutable true state of one job inside a run (never shown to the policy as such)."""

    __slots__ = (
        "active_rounds",
        "active_sum",
        "attained",
        "executed_last",
        "finish",
        "gpus",
        "measured",
        "regime_done",
        "regime_index",
        "restarts",
        "scalings",
        "sim",
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
        self.active_sum = 0.0
        self.active_rounds = 0
        self.restarts = 0
        self.scalings: list[tuple[float, int]] = []

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
        before = sum(r.epochs for r in self.sim.trajectory[: self.regime_index])
        return float(min(self.sim.spec.epochs, before + self.regime_done))

    def seconds_to_finish(self) -> float:
        total = 0.0
        for i in range(self.regime_index, len(self.sim.trajectory)):
            regime = self.sim.trajectory[i]
            left = regime.epochs - (self.regime_done if i == self.regime_index else 0.0)
            total += left * self.sim.epoch_seconds[regime.batch_size]
        return total

    def advance(self, seconds: float, start_s: float = 0.0) -> None:
        """Train for ``seconds`` of useful time from ``start_s``, crossing regime boundaries as
        the truth says; each crossing to a new batch size is noted in ``scalings``."""
        now = start_s
        while seconds > _EPS and not self.done:
            regime = self.sim.trajectory[self.regime_index]
            per_epoch = self.sim.epoch_seconds[regime.batch_size]
            self.measured[regime.batch_size] = per_epoch
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
        progress = JobProgress(
            batch_size=self.regime.batch_size,
            epochs_done=self.epochs_done(),
            observed_regimes=self.sim.trajectory[: self.regime_index],
            measured_epoch_seconds=self.measured,
            attained_s=self.attained,
            executed_last_round_s=self.executed_last,
            gpus=self.gpus,
        )
        return ActiveJob(spec=self.sim.spec, progress=progress)


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
    """
    settings = settings or SimSettings()
    for job in workload.jobs:
        job.spec.check_fits(cluster)
    runs = [_JobRun(job) for job in workload.jobs]
    pending = sorted(runs, key=lambda r: r.sim.spec.arrival_s)
    pending.reverse()
    active: list[_JobRun] = []
    previous: dict[str, tuple[int, ...]] = {}
    rounds: list[RoundRecord] = []
    state: object | None = None
    prior: PopulationPrior = EMPTY_PRIOR
    solve: SolveSummary | None = None
    finished = 0
    now = pending[-1].sim.spec.arrival_s if pending else 0.0
    makespan = now

    for index in range(settings.max_rounds):
        while pending and pending[-1].sim.spec.arrival_s <= now + _EPS:
            active.append(pending.pop())
        if not active:
            if not pending:
                break
            now = pending[-1].sim.spec.arrival_s
            continue
        snapshot = Snapshot(
            now=now,
            round_index=index,
            round_seconds=settings.round_seconds,
            cluster=cluster,
            jobs=tuple(run.view() for run in active),
            policy_state=state,
            revealed=_revealed(active) if settings.reveal_trajectories else {},
            population=prior,
        )
        started = timer() if timer else 0.0
        decision = policy.decide(snapshot, params)
        spent = (timer() - started) if timer else 0.0
        state, solve = decision.state, decision.solve
        by_id = {run.job_id: run for run in active}
        chosen = _checked_jobs(decision, by_id, cluster)
        placement = place(cluster, [(j, by_id[j].sim.spec.gpus) for j in chosen], previous)

        end = now
        busy = 0.0
        for job_id, gpus in placement.assignment.items():
            run = by_id[job_id]
            restarted = job_id not in previous or (
                settings.charge_on_move and job_id in placement.moved
            )
            needed = run.seconds_to_finish()
            elapsed = min(settings.round_seconds, needed)
            useful = elapsed
            if restarted:
                run.restarts += 1
                if elapsed > settings.round_seconds - settings.overhead_guard_s:
                    useful = max(0.0, elapsed - settings.restart_overhead_s)
            run.advance(useful, now + elapsed - useful)
            run.attained += useful
            run.executed_last = useful
            run.gpus = gpus
            busy += useful * run.sim.spec.gpus
            if run.done:
                run.finish = now + elapsed
            end = max(end, now + elapsed)
        for run in active:
            if run.job_id not in placement.assignment:
                run.executed_last = 0.0
                run.gpus = ()
            run.active_sum += len(active)
            run.active_rounds += 1
        if not placement.assignment:
            end = now + settings.round_seconds
            if pending:
                end = min(end, max(now + _EPS, pending[-1].sim.spec.arrival_s))
        rounds.append(
            RoundRecord(
                index=index,
                start_s=now,
                end_s=end,
                assignment=MappingProxyType(dict(placement.assignment)),
                busy_gpu_seconds=busy,
                active_jobs=len(active),
                decision_seconds=spent,
            )
        )
        still = [run for run in active if not run.done]
        if settings.learn_population:
            for run in sorted((r for r in active if r.done), key=lambda r: r.finish or 0.0):
                prior = prior.learn(run.finished())
        finished += len(active) - len(still)
        active = still
        previous = {run.job_id: run.gpus for run in active if run.gpus}
        makespan = end
        now = end
        if on_round:
            on_round(now, finished, len(runs))

    outcomes = tuple(
        JobOutcome(
            job_id=run.job_id,
            gpus=run.sim.spec.gpus,
            arrival_s=run.sim.spec.arrival_s,
            finish_s=run.finish,
            t_exclusive_s=run.sim.t_exclusive_s,
            attained_s=run.attained,
            restarts=run.restarts,
            mean_active_jobs=run.active_sum / run.active_rounds if run.active_rounds else 0.0,
            scalings=tuple(run.scalings),
        )
        for run in runs
    )
    return SimResult(
        policy=policy.name,
        workload=workload.name,
        cluster=cluster,
        settings=settings,
        makespan_s=makespan,
        lower_bound_s=workload.makespan_lower_bound(cluster.total_gpus),
        jobs=outcomes,
        rounds=tuple(rounds),
        final_state=state,
        solve=solve,
    )


def _revealed(active: list[_JobRun]) -> dict[str, RevealedTrajectory]:
    return {
        run.job_id: RevealedTrajectory(run.sim.trajectory, run.sim.epoch_seconds) for run in active
    }


def _checked_jobs(decision: Decision, active: Mapping[str, _JobRun], cluster: Cluster) -> list[str]:
    """The decision's jobs, after checking the policy kept the interface's promises."""
    seen: set[str] = set()
    width = 0
    for job_id in decision.jobs:
        if job_id not in active:
            raise PolicyContractError(f"decision names job {job_id!r}, which is not active")
        if job_id in seen:
            raise PolicyContractError(f"decision names job {job_id!r} twice")
        seen.add(job_id)
        width += active[job_id].sim.spec.gpus
    if width > cluster.total_gpus:
        raise PolicyContractError(
            f"decision asks for {width} GPUs but the cluster has {cluster.total_gpus}"
        )
    return list(decision.jobs)
