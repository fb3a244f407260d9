"""The schedule solver: generalized Nash social welfare over a T-round planning window.

For N jobs on M GPUs the paper (section 6.1, appendix "Shockwave design details") maximizes

    (1 / (N M)) sum_j w_j log UTIL_j(X_j)  -  (lambda / Z0) H(X)

over binary X[j, t], t = 1..T, with per-round capacity sum_j g_j X[j, t] <= M. UTIL_j is the
job's progress fraction after the window, w_j = B_j rho_hat_j^k its market weight, H the makespan
lower bound of the work left after the window and Z0 the total predicted remaining time.

Structure we exploit: rounds are identical, so a job's utility and remaining time depend only on
how many rounds n_j it gets, not which (regimes included: they run in order whatever rounds are
chosen). The problem becomes one over counts, separable per job:

    maximize  sum_j phi_j(n_j)   s.t.  sum_j g_j n_j <= M T,   0 <= n_j <= cap_j,

    phi_j(n) = w_j log(u_j(n) + eps) / (N M)
               - (lambda / Z0) (g_j r_j(n) / M + (r_j(n) - (theta H_0 - T D))^+)
               - (mu / Z0) g_j (Pbar / P_j) late_j(n)

Where and why this departs from the paper (measured in docs/policy.md):

- H's max term becomes a sum of per-job excesses over the current bound H_0 (scaled by the
  margin theta) less the window: it upper-bounds how far a plan pushes the makespan bound past
  H_0, stays separable and convex, and protects every job on the critical path rather than only
  the longest one (with the max, the second-longest job gets no push until it is the longest).
- The deadline term (weight mu): late_j(n) is how far job j would finish past its fairness
  deadline (arrival + N_avg P_hat, where rho_hat = 1) if it got n rounds, finishing inside the
  window when n covers its remaining work, else after it. Counts alone cannot tell a job that
  finishes now from one that finishes in an hour; this term can, and it carries the FTF
  estimator's own deadline. It is relative (Pbar / P_j: a minute late matters more to a short
  job) and GPU-weighted (so wide jobs compete per GPU on equal terms).

- The critical-path reservation (margin theta_c, gate g, :func:`critical_path_s`): when the
  longest job's soonest remainder L (times g) outlasts the work bound W, the makespan is a path
  through a few long jobs, max(W, theta_c L), and each job whose latest remainder would not
  fit after the window gets a floor n_j >= ceil((R_latest - (path - T D)) / D). The market
  cannot do this itself: those jobs' fairness deadlines are far, and the deadline term of many
  late short jobs outbids the soft term above. Floors that together ask for more GPU-rounds
  than the window has are cut where the remainders are shortest (:func:`fit_floors`). With
  ``path_slack`` delta, a job's floor keeps its latest remainder inside the later of the path
  and its own deadline, arrival + (1 + delta) x its soonest run time (:func:`own_deadline_s`):
  it is reserved once waiting longer would cost the makespan more than delta of its run time.

We solve the count problem by a greedy on marginal gain per GPU-round over each phi_j's upper
concave envelope. The fractional greedy on the envelopes solves the relaxation exactly, so it
bounds the optimum and certifies the integer plan's gap. When the certified gap is above the
target, :mod:`shockwave.market.planner_scip` solves the exact MIP with SCIP, warm-started from the
greedy plan. Counts are then packed into rounds (:func:`pack_rounds`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


class SolveStatus(StrEnum):
    """How the plan was found. ``optimal``: certified within the relative gap on the achievable
    gain. ``gap_limit``/``time_limit``: SCIP stopped there with its best plan. ``greedy``: the
    greedy plan, not certified (SCIP was off or failed). ``empty``: nothing to plan."""

    OPTIMAL = "optimal"
    GAP_LIMIT = "gap_limit"
    TIME_LIMIT = "time_limit"
    GREEDY = "greedy"
    EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class PlanJob:
    """One job as the planner sees it.

    ``utility[n]``: UTIL_j after n scheduled rounds (n = 0..cap), i.e. the progress fraction
    F_j / E_j plus what n rounds add. ``remaining[n]``: predicted run time left after n rounds.
    ``weight``: w_j = B_j rho_hat^k. ``running``: holds GPUs now (packed first, keeps its GPUs).
    ``overdue[n]``: seconds the job would finish past its fairness deadline after n rounds
    (empty: no deadline). ``fair_share_s``: its fair completion time N_avg P_hat, which scales
    lateness to a relative figure. ``critical_remaining_s``: a cautious remaining time (no
    speed-up counted on) for judging whether the job is on the critical path. ``probe``: the
    job's speed is unknown (it has measured nothing, and jobs of its shape differ): it gets a
    floor of one round and takes round 0 ahead of the rest of the packing
    (:func:`pack_rounds`), so that what it measures replaces the guess before the market and
    the critical path rely on it. ``run_time_s``: the soonest the job runs from start to end
    alone (None: unknown), and ``age_s`` the seconds since it arrived: with
    :attr:`PlannerParams.path_slack` they set how long it may still wait on the makespan's
    path (:func:`own_deadline_s`).
    """

    job_id: str
    gpus: int
    weight: float
    utility: tuple[float, ...]
    remaining: tuple[float, ...]
    running: bool = False
    overdue: tuple[float, ...] = ()
    fair_share_s: float = 1.0
    critical_remaining_s: float = 0.0
    soonest_remaining_s: float | None = None
    latest_remaining_s: float | None = None
    probe: bool = False
    run_time_s: float | None = None
    age_s: float = 0.0

    @property
    def remaining_range(self) -> tuple[float, float]:
        """(least, most) run time the job may have left; its prediction where not given."""
        low = self.remaining[0] if self.soonest_remaining_s is None else self.soonest_remaining_s
        high = self.remaining[0] if self.latest_remaining_s is None else self.latest_remaining_s
        return min(low, self.remaining[0]), max(high, self.remaining[0])

    @property
    def cap(self) -> int:
        return len(self.utility) - 1


@dataclass(frozen=True, slots=True)
class PlannerParams:
    """Knobs of one solve.

    ``rounds``: T, the planning window. ``makespan_weight``: lambda. ``utility_floor``: eps in
    log(UTIL + eps), so a job with no progress yet has a finite welfare. ``horizon_margin``:
    theta, the share of the current makespan bound past which a job's remainder counts as late.
    ``deadline_weight``: mu, the weight of finishing past the fairness deadline.
    ``critical_path_margin``: theta_c of the critical-path reservation (:func:`critical_path_s`;
    0 turns it off). ``critical_path_gate``: g, the share of the longest soonest remainder that
    must outlast the work bound for the reservation to hold (1: whenever the longest job bounds
    the makespan: 2.4% shorter makespans, 1.8-2.8% longer average JCT on the reference traces;
    None, the default: theta_c; docs/policy.md, "Critical-path reservation").
    ``short_lane``: a job past its fairness deadline that is not running and whose count
    finishes it within one round takes round 0 ahead of the jobs planned for the whole window
    (:func:`pack_rounds`; docs/policy.md, "Short jobs in bursts").
    ``finishing_lane``: with no more jobs than GPUs, a job past its fairness deadline whose
    count finishes it inside the window is packed ahead of the jobs planned for the whole
    window that are not on the makespan's path (:func:`path_jobs`), by deadline with them
    (:func:`pack_rounds`; docs/policy.md, "Jobs that finish inside the window").
    ``arriving_s``: the work projected to arrive while the longest job runs, in seconds of the
    whole cluster (GPU-seconds over the GPUs; the policy projects it from the arrivals it has
    seen, :func:`shockwave.policies.shockwave_market.shockwave.arriving_work_s`; 0: none).
    ``wide_path_share``: a job wider than this share of the GPUs keeps its critical-path floor
    only while the gate also holds against the work bound plus ``arriving_s`` (the wide path,
    :func:`critical_path_s`); 1, or ``arriving_s`` 0, keeps the rule before
    (docs/policy.md, "Critical-path reservation").
    ``path_slack``: delta, the share of its own run time a job on the makespan's path may lose
    to waiting: its critical-path floor keeps its latest remainder inside the later of the
    path and its own deadline, arrival + (1 + delta) x its soonest run time
    (:func:`own_deadline_s`); 0: the path alone (docs/policy.md, "Critical-path reservation").
    ``path_first``: the jobs that outlast the makespan's path go first in the packing, and a
    job on the path whose count runs it to its end packs with the full-window jobs
    (:func:`leading_jobs`, :func:`pack_rounds`); the policy turns it on where jobs of one
    shape run at different speeds (docs/policy.md, "Critical-path reservation"). Off: the
    packing before.
    ``spread_gate``: g', a wider gate that also holds the path while g' L > W + ``arriving_s``
    (:func:`held_path_s`), and the gate of the wide path; the policy sets it where jobs of
    one shape run at different speeds. None: ``critical_path_gate`` alone.
    ``like_ratio``: like jobs take their rounds in turn: jobs of one width whose run times
    are within this ratio of the shortest of them (none with a floor), where they ask more
    GPUs than the cluster has (:func:`like_groups`), keep their counts up to their path
    floors (:func:`path_floors`), and the rest of the rounds the market gave them go to the
    most advanced first, then the longest waiting, each up to its cap (:func:`in_turn`); 0:
    off (docs/policy.md, "Like jobs in turn").
    ``relative_gap``: target gap on the achievable gain (objective minus the empty plan's).
    ``time_limit_s``: SCIP's limit. ``use_scip``: "auto" (when the greedy cannot certify the gap),
    "always" or "never".
    """

    rounds: int = 30
    makespan_weight: float = 1000.0
    utility_floor: float = 1e-3
    relative_gap: float = 1e-3
    time_limit_s: float = 15.0
    use_scip: str = "auto"
    horizon_margin: float = 1.0
    deadline_weight: float = 10.0
    critical_path_margin: float = 0.75
    critical_path_gate: float | None = None
    short_lane: bool = True
    finishing_lane: bool = True
    arriving_s: float = 0.0
    wide_path_share: float = 0.25
    path_slack: float = 0.05
    path_first: bool = False
    spread_gate: float | None = None
    like_ratio: float = 1.5

    def __post_init__(self) -> None:
        if self.rounds <= 0:
            raise ValueError("rounds must be > 0")
        if self.use_scip not in ("auto", "always", "never"):
            raise ValueError(f"use_scip must be auto, always or never, got {self.use_scip!r}")
        margin = self.critical_path_margin
        if not (math.isfinite(margin) and 0 <= margin <= 1):
            raise ValueError(f"critical_path_margin must be in [0, 1] (0: off), got {margin!r}")
        gate = self.critical_path_gate
        if gate is not None and not (math.isfinite(gate) and 0 < gate <= 1):
            raise ValueError(f"critical_path_gate must be in (0, 1] or None, got {gate!r}")
        wider = self.spread_gate
        if wider is not None and not (math.isfinite(wider) and 0 < wider <= 1):
            raise ValueError(f"spread_gate must be in (0, 1] or None, got {wider!r}")
        like = self.like_ratio
        if not (math.isfinite(like) and (like == 0 or like >= 1)):
            raise ValueError(f"like_ratio must be 0 (off) or a finite number >= 1, got {like!r}")
        share = self.wide_path_share
        if not (math.isfinite(share) and 0 < share <= 1):
            raise ValueError(f"wide_path_share must be in (0, 1], got {share!r}")
        for name in (
            "makespan_weight",
            "deadline_weight",
            "horizon_margin",
            "relative_gap",
            "arriving_s",
            "path_slack",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.utility_floor) and self.utility_floor > 0):
            raise ValueError(f"utility_floor must be > 0, got {self.utility_floor!r}")
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {self.time_limit_s!r}")


@dataclass(frozen=True, slots=True)
class Plan:
    """A solved plan. ``rounds[t]``: the job ids scheduled in round t (t = 0 is next).

    ``objective``: the true objective of ``counts``; ``bound``: a proven upper bound;
    ``empty_objective``: the objective when nothing is scheduled (a constant no decision
    changes); ``gain_gap``: (bound - objective) / (bound - empty_objective); ``gap``: the plain
    relative gap (bound - objective) / |objective|. ``unpacked``: rounds the packing could not
    place: the count model bounds capacity over the window, not per round, so a few counts may
    not be realisable (docs/policy.md); only round 0 runs before the next re-plan. Where like
    jobs take their rounds in turn (:attr:`PlannerParams.like_ratio`, :func:`in_turn`),
    ``counts`` and ``objective`` are those of the rounds as dealt, ``bound`` and ``status``
    the market's solve's.
    """

    counts: dict[str, int]
    rounds: tuple[tuple[str, ...], ...]
    objective: float
    bound: float
    empty_objective: float
    status: SolveStatus
    solver: str = "greedy"
    unpacked: int = 0
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def gain_gap(self) -> float:
        gain = self.bound - self.empty_objective
        return max(0.0, self.bound - self.objective) / gain if gain > 1e-15 else 0.0

    @property
    def gap(self) -> float:
        return max(0.0, self.bound - self.objective) / max(abs(self.objective), 1e-12)


@dataclass(frozen=True, slots=True)
class Problem:
    """The count problem in arrays: ``value[j, n]`` = phi_j(n), ``rem[j, n]`` = r_j(n)."""

    jobs: tuple[PlanJob, ...]
    total_gpus: int
    rounds: int
    coupling: float
    value: FloatArray
    rem: FloatArray
    caps: npt.NDArray[np.int64]
    gpus: FloatArray
    floors: npt.NDArray[np.int64] | None = None

    @property
    def capacity(self) -> int:
        return self.total_gpus * self.rounds

    def objective(self, counts: npt.NDArray[np.int64]) -> float:
        return float(self.value[np.arange(len(self.jobs)), counts].sum())


def build_problem(
    jobs: Sequence[PlanJob], total_gpus: int, params: PlannerParams, round_seconds: float
) -> Problem:
    """Tabulate phi_j and r_j for n = 0..T (n above a job's cap repeats its last value).

    Shapes: ``value`` and ``rem`` are N x (T + 1) arrays, ``caps`` the per-job round limits,
    ``floors`` the critical-path floors cut to the window's capacity (:func:`fit_floors`).
    """
    t = params.rounds
    count = len(jobs)
    terms = ObjectiveTerms.of(jobs, total_gpus, params, round_seconds)
    if count:
        value, rem, caps, floors = terms.rows(jobs)
    else:
        value, rem = np.zeros((0, t + 1)), np.zeros((0, t + 1))
        caps, floors = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    gpus = np.array([j.gpus for j in jobs], dtype=float)
    latest = [j.remaining_range[1] for j in jobs]
    floors = fit_floors(floors, gpus, latest, total_gpus * t, round_seconds)
    return Problem(tuple(jobs), total_gpus, t, terms.coupling, value, rem, caps, gpus, floors)


@dataclass(frozen=True, slots=True)
class ObjectiveTerms:
    """The window-wide constants of phi_j (Z0, 1/(N M), the makespan slack, the mean fair
    share, the critical path), computed once from the jobs of a solve, so that a job's row can
    be tabulated alone (:meth:`row`); :mod:`shockwave.market.elastic` tabulates one row per
    width."""

    params: PlannerParams
    total_gpus: int
    round_seconds: float
    z0: float
    scale: float
    slack: float
    mean_fair: float
    path: float | None
    wide_path: float | None = None
    wide_gpus: float = math.inf

    @property
    def coupling(self) -> float:
        return self.params.makespan_weight / self.z0

    @classmethod
    def of(
        cls, jobs: Sequence[PlanJob], total_gpus: int, params: PlannerParams, round_seconds: float
    ) -> ObjectiveTerms:
        horizon = max(
            sum(j.remaining[0] * j.gpus for j in jobs) / total_gpus,
            max((j.critical_remaining_s for j in jobs), default=0.0),
        )
        return cls(
            params=params,
            total_gpus=total_gpus,
            round_seconds=round_seconds,
            z0=sum(j.remaining[0] for j in jobs) or 1.0,
            scale=1.0 / (max(len(jobs), 1) * total_gpus),
            slack=params.horizon_margin * horizon - params.rounds * round_seconds,
            mean_fair=float(np.mean([j.fair_share_s for j in jobs])) if jobs else 1.0,
            path=held_path_s(jobs, total_gpus, params),
            wide_path=critical_path_s(
                jobs,
                total_gpus,
                params.critical_path_margin,
                params.spread_gate or params.critical_path_gate,
                params.arriving_s,
            ),
            wide_gpus=params.wide_path_share * total_gpus,
        )

    def path_of(self, job: PlanJob) -> float | None:
        """The path that sets ``job``'s critical-path floor: :attr:`wide_path` for a job wider
        than ``wide_path_share`` of the GPUs, else :attr:`path`."""
        return self.wide_path if job.gpus > self.wide_gpus else self.path

    def row(self, job: PlanJob) -> tuple[FloatArray, FloatArray, int, int]:
        """(phi_j(n), r_j(n)) for n = 0..T, the job's cap and its critical-path floor."""
        params, t = self.params, self.params.rounds
        cap = min(job.cap, t)
        util = np.array(job.utility[: cap + 1], dtype=float)
        left = np.array(job.remaining[: cap + 1], dtype=float)
        util = np.pad(util, (0, t - cap), mode="edge")
        left = np.pad(left, (0, t - cap), mode="edge")
        value = job.weight * self.scale * np.log(util + params.utility_floor)
        extra = max(0.0, job.critical_remaining_s - job.remaining[0])
        late = np.maximum(0.0, np.where(left > 0, left + extra, 0.0) - self.slack)
        late_by = np.array(job.overdue[: cap + 1] or [0.0] * (cap + 1), dtype=float)
        overdue = np.pad(late_by, (0, t - cap), mode="edge") * self.mean_fair / job.fair_share_s
        penalty = params.makespan_weight * (left * job.gpus / self.total_gpus + late)
        penalty += params.deadline_weight * job.gpus * overdue
        value -= penalty / self.z0
        window_s = t * self.round_seconds
        floor = critical_floor(
            job, self.path_of(job), window_s, self.round_seconds, cap, params.path_slack
        )
        return value, left, cap, max(floor, min(cap, int(job.probe)))

    def rows(
        self, jobs: Sequence[PlanJob]
    ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """:meth:`row` for many jobs at once: (value, left) as len(jobs) x (T + 1) arrays,
        caps and floors (the elastic planner's thousands of rows)."""
        params, t = self.params, self.params.rounds
        caps = np.array([min(j.cap, t) for j in jobs], dtype=np.int64)
        util_rows, left_rows, late_rows = [], [], []
        for job, cap in zip(jobs, caps.tolist(), strict=True):
            pad = t - cap
            util_rows.append([*job.utility[: cap + 1], *[job.utility[cap]] * pad])
            left_rows.append([*job.remaining[: cap + 1], *[job.remaining[cap]] * pad])
            late = job.overdue or (0.0,) * (cap + 1)
            late_rows.append([*late[: cap + 1], *[late[cap]] * pad])
        util = np.array(util_rows, dtype=float)
        left = np.array(left_rows, dtype=float)
        late_by = np.array(late_rows, dtype=float)
        weight = np.array([j.weight for j in jobs])
        gpus = np.array([j.gpus for j in jobs], dtype=float)
        fair = np.array([j.fair_share_s for j in jobs])
        extra = np.maximum(0.0, np.array([j.critical_remaining_s - j.remaining[0] for j in jobs]))
        value = (weight * self.scale)[:, None] * np.log(util + params.utility_floor)
        late = np.maximum(0.0, np.where(left > 0, left + extra[:, None], 0.0) - self.slack)
        # the operations in :meth:`row`'s order, so that both give the same floats
        overdue = late_by * self.mean_fair / fair[:, None]
        penalty = params.makespan_weight * (left * gpus[:, None] / self.total_gpus + late)
        penalty += (params.deadline_weight * gpus)[:, None] * overdue
        value -= penalty / self.z0
        window_s = t * self.round_seconds
        floors = np.array(
            [
                max(
                    critical_floor(
                        j,
                        self.path_of(j),
                        window_s,
                        self.round_seconds,
                        c,
                        params.path_slack,
                    ),
                    min(c, int(j.probe)),
                )
                for j, c in zip(jobs, caps.tolist(), strict=True)
            ],
            dtype=np.int64,
        )
        return value, left, caps, floors


def critical_path_s(
    jobs: Sequence[PlanJob],
    total_gpus: int,
    margin: float,
    gate: float | None = None,
    arriving_s: float = 0.0,
) -> float | None:
    """The finish the longest jobs must keep, or None when they do not bound the makespan.

    The soonest the work left can end is max(W, L): W the GPU-seconds at every job's fastest
    epoch time over the GPUs, L the longest such remainder of a single job. When L exceeds W
    the makespan is a critical path through a few long jobs, and every round they wait
    pushes it out one for one; the market cannot see that (their fairness deadlines are far).
    ``margin`` (theta_c) scales L down for the spread of remainder estimates, so that jobs
    whose estimates merely look shorter than the longest one are kept on the path too; the
    path never falls below W, since no plan ends before W (a path under it would reserve
    rounds for finishes nothing can reach). ``gate`` (g; None: theta_c): the path holds while
    g L > W. With g = theta_c (the rule before) it held only while L > W / theta_c, so where
    the two bounds were close (the 120-job trace from 4,000 s to 16,000 s: L 1.0 to 1.07 W)
    the longest job had only the soft term, lost rounds to the market, and its block went to
    the end of a plan that a re-plan or a late one then followed (docs/policy.md,
    "Critical-path reservation").

    ``arriving_s`` (A, seconds of the whole cluster): work projected to arrive while the
    longest job runs; the gate then holds only while g L > W + A. The path is the same
    max(W, theta_c L): A only says whether the longest job is likely to stay the makespan's
    path once the stream of arrivals has added its work. The planner applies this wide path
    to gangs wider than ``wide_path_share`` of the GPUs (:meth:`ObjectiveTerms.path_of`):
    reserving such a gang for the whole window holds that share of the cluster from every
    other job, which buys nothing when later arrivals set the makespan.
    """
    if margin <= 0 or not jobs:
        return None
    work, longest = soonest_bounds(jobs, total_gpus)
    if not (margin if gate is None else gate) * longest > work + arriving_s:
        return None
    return max(work, margin * longest)


def held_path_s(jobs: Sequence[PlanJob], total_gpus: int, params: PlannerParams) -> float | None:
    """The path the critical-path floors keep (:func:`critical_path_s`), or None: held while
    g L > W (``critical_path_gate``), and, with a ``spread_gate`` g', also while
    g' L > W + A (``arriving_s``).

    Why the wider gate only against the arrivals too: where jobs of one shape run at different
    speeds, a job whose estimate looks a little shorter than the work bound may still set the
    makespan, so the gate widens; but while the work still to arrive (A) outweighs the gap,
    the arrivals, not that job, set the end, and holding the path then only makes the short
    jobs wait (average JCT 0.6% to 4.3% longer on the 120-job trace with variation, the same
    makespans within 1.10x of the bound)."""
    margin = params.critical_path_margin
    path = critical_path_s(jobs, total_gpus, margin, params.critical_path_gate)
    if path is None and params.spread_gate is not None:
        return critical_path_s(jobs, total_gpus, margin, params.spread_gate, params.arriving_s)
    return path


def soonest_bounds(jobs: Sequence[PlanJob], total_gpus: int) -> tuple[float, float]:
    """(W, L): the GPU-seconds of every job's soonest remainder over the GPUs, and the
    longest soonest remainder (0 for no job); no plan ends before max(W, L)."""
    soonest = [j.remaining_range[0] for j in jobs]
    return work_bound_s([j.gpus for j in jobs], soonest, total_gpus), max(soonest, default=0.0)


def work_bound_s(gpus: Sequence[int], soonest_s: Sequence[float], total_gpus: int) -> float:
    """W: the GPU-seconds of the jobs' soonest remainders (``soonest_s``, on ``gpus`` each, one
    entry per job) over the cluster's ``total_gpus``; no schedule of them ends sooner."""
    return sum(g * s for g, s in zip(gpus, soonest_s, strict=True)) / total_gpus


def path_finish_s(jobs: Sequence[PlanJob], total_gpus: int, margin: float) -> float:
    """max(W, theta_c L) (:func:`soonest_bounds`; theta_c = ``margin``): the finish the
    makespan's path keeps, whether or not the reservation's gate holds."""
    work, longest = soonest_bounds(jobs, total_gpus)
    return max(work, margin * longest)


def chain_blocked(gpus: Sequence[int], soonest_s: Sequence[float], total_gpus: int) -> list[bool]:
    """Which jobs the chain of wide gangs holds on the makespan's path, one flag per job.

    Gangs wider than half the GPUs cannot run beside one another: they run one after another,
    a chain whose soonest end is C, the sum of their soonest remainders. A job that cannot run
    beside any of them either (its GPUs plus the narrowest gang's exceed the cluster's) cannot
    run while the chain does, so it ends no sooner than its own remainder plus C: a bound the
    work bound W and the longest remainder L both miss (W spreads its GPU-seconds over the whole
    cluster, L counts it alone). A job is flagged when that bound exceeds W: then every round
    in which neither it nor a gang of the chain runs pushes the makespan out by a round
    (``shockwave_market.shockwave``, ``chain_lane``). Shapes: ``gpus`` and ``soonest_s`` (each
    job's soonest remainder, seconds) one entry per job; the gangs themselves are not flagged.
    """
    chain = [s for g, s in zip(gpus, soonest_s, strict=True) if chain_gang(g, total_gpus)]
    if not chain or total_gpus <= 0:
        return [False] * len(gpus)
    narrowest = min(g for g in gpus if chain_gang(g, total_gpus))
    work = work_bound_s(gpus, soonest_s, total_gpus)
    length = sum(chain)
    return [
        not chain_gang(g, total_gpus) and g + narrowest > total_gpus and s + length > work
        for g, s in zip(gpus, soonest_s, strict=True)
    ]


def chain_gang(gpus: int, total_gpus: int) -> bool:
    """Whether a gang of ``gpus`` is one of the chain (:func:`chain_blocked`): wider than half
    the GPUs, so no two such gangs run at once."""
    return gpus > total_gpus / 2


def path_jobs(
    problem: Problem, margin: float, round_seconds: float, slack: float = 0.0
) -> frozenset[int]:
    """Indices of the jobs on the makespan's path, which the finishing lane never passes
    (:func:`pack_rounds`): those with a critical-path floor, and those whose latest remainder
    would not fit after the window inside max(W, theta_c L) (:func:`critical_floor` on that
    path, whether or not the reservation's gate holds; a job with ``slack`` left before its own
    deadline, :func:`own_deadline_s`, is not on it yet). A round such a job loses to the
    lane can push the makespan out by a round; any other full-window job has that round's
    slack before the work or the longest job bounds the end."""
    return on_path(problem, path_floors(problem, margin, round_seconds, slack))


def on_path(problem: Problem, held: npt.NDArray[np.int64]) -> frozenset[int]:
    """:func:`path_jobs` from the jobs' ``held`` rounds (:func:`path_floors`, computed once
    where the plan needs them for like jobs too)."""
    floors = problem.floors
    return frozenset(
        i for i in range(len(problem.jobs)) if (floors is not None and floors[i] > 0) or held[i] > 0
    )


def path_floors(
    problem: Problem, margin: float, round_seconds: float, slack: float = 0.0
) -> npt.NDArray[np.int64]:
    """Each job's rounds of the window that keep its latest remainder inside the makespan's
    path, max(W, theta_c L) (:func:`path_finish_s`), or its own deadline with ``slack`` if
    later (:func:`critical_floor`), whether or not the reservation's gate holds; one entry
    per job of ``problem.jobs``. A job with such rounds is on the path (:func:`path_jobs`)."""
    path_s = path_finish_s(problem.jobs, problem.total_gpus, margin)
    window_s = problem.rounds * round_seconds
    return np.array(
        [
            critical_floor(job, path_s, window_s, round_seconds, problem.rounds, slack)
            for job in problem.jobs
        ],
        dtype=np.int64,
    )


def leading_jobs(problem: Problem, margin: float) -> frozenset[int]:
    """Indices of the jobs that lead the makespan's path: held by a critical-path floor (not
    only a probe's round) and with a latest remainder past max(W, theta_c L), the path's
    finish. Each round such a job waits pushes the makespan out by a round whatever the
    others do, so the packing gives them round 0 before any job that still has slack
    (:attr:`PlannerParams.path_first`)."""
    floors = problem.floors
    if floors is None:
        return frozenset()
    path_s = path_finish_s(problem.jobs, problem.total_gpus, margin)
    return frozenset(
        i
        for i, job in enumerate(problem.jobs)
        if int(floors[i]) > int(job.probe) and job.remaining_range[1] > path_s
    )


def critical_floor(
    job: PlanJob,
    path_s: float | None,
    window_s: float,
    round_seconds: float,
    cap: int,
    slack: float = 0.0,
) -> int:
    """Rounds of the window that keep the job's latest remainder inside its horizon, the later
    of ``path_s`` and its own deadline (:func:`own_deadline_s` with ``slack``): its remainder
    after n rounds must fit the time left after the window, R - n D <= horizon - T D."""
    if path_s is None:
        return 0
    horizon = max(path_s, own_deadline_s(job, slack))
    excess = job.remaining_range[1] - (horizon - window_s)
    if excess <= 0:
        return 0
    return min(cap, math.ceil(excess / round_seconds))


def own_deadline_s(job: PlanJob, slack: float) -> float:
    """Seconds from now to the job's own deadline on the makespan's path: arrival plus
    (1 + ``slack``) times its soonest run time, (1 + delta) T - age; -inf where ``slack`` is 0
    or the run time unknown (the path alone then sets the floor).

    Why: the path, max(W, theta_c L) from now, moves with every plan, so the longest job and
    every job near it get the whole window in every plan from the moment they are on it, all
    of them at once; a job that ends by arrival + (1 + delta) T keeps the makespan within
    (1 + delta) of its lower bound, max over jobs of arrival + T, on that job's account. Up to
    then a reserved round buys no makespan, while on a full cluster it is a round taken from
    the jobs waiting behind it (six 4-GPU jobs of 7.7 days on 88 GPUs, each reserved from its
    arrival, held 24 GPUs while the week's other jobs queued). The deadline is fixed, so the
    slack is spent once: a job that waited while it was not on the path has less of it left.
    """
    if slack <= 0 or job.run_time_s is None:
        return -math.inf
    return (1.0 + slack) * job.run_time_s - job.age_s


def fit_floors(
    floors: npt.NDArray[np.int64],
    gpus: FloatArray,
    latest_s: Sequence[float],
    capacity: float,
    round_seconds: float,
) -> npt.NDArray[np.int64]:
    """``floors`` cut to the window's ``capacity`` in GPU-rounds (unchanged where they fit).

    Each floor is a job's rounds n = 0..floor-1, the n-th worth its remainder before it,
    ``latest_s[j] - n D``; the rounds are kept from the longest such remainder down while they
    fit (ties by job order). So the cut floors leave the least possible longest remainder
    after the window, and the longest job keeps its rounds. Why: when the floors overflow, the
    greedy took them by market gain per GPU and SCIP found the bounds infeasible, so the
    longest job, worth least to the market, lost its rounds first (the 120-job trace at
    16,440 s: floor 30, planned 28, parked for eight rounds).
    """
    if float((floors * gpus).sum()) <= capacity:
        return floors
    items = sorted(
        (-(latest_s[j] - n * round_seconds), j, n)
        for j in range(len(floors))
        for n in range(int(floors[j]))
    )
    kept = np.zeros_like(floors)
    used = 0.0
    for _, j, n in items:
        if kept[j] == n and used + gpus[j] <= capacity:
            kept[j] += 1
            used += gpus[j]
    return kept


def concave_slopes(values: FloatArray, cap: int) -> FloatArray:
    """Per-increment slopes of the upper concave envelope of values[0..cap] (length T)."""
    t = len(values) - 1
    slopes = [0.0] * t
    v = values.tolist()  # Python floats: the same double arithmetic, without numpy scalars
    hull = [0]
    for n in range(1, cap + 1):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (v[b] - v[a]) * (n - a) <= (v[n] - v[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(n)
    for a, b in itertools.pairwise(hull):
        slopes[a:b] = [(v[b] - v[a]) / (b - a)] * (b - a)
    return np.array(slopes)


def concave_slopes_all(values: FloatArray, caps: npt.NDArray[np.int64]) -> FloatArray:
    """:func:`concave_slopes` of every row of ``values`` (N x (T + 1)) up to its cap, as an
    N x T array, the same floats. A row whose every point is on its envelope (each middle
    point strictly above the chord of its neighbours, the test :func:`concave_slopes` pops by)
    has its plain differences as slopes: those rows, most of a plan's, are done in one array
    operation; the others one by one."""
    count, width = values.shape
    t = width - 1
    n = np.arange(width)
    inside = n[None, :] <= caps[:, None]
    # the hull test at (a, b, n) = (n - 2, n - 1, n), in concave_slopes' arithmetic
    with np.errstate(invalid="ignore"):
        above = (values[:, 1:-1] - values[:, :-2]) * 2 > values[:, 2:] - values[:, :-2]
    kept = above | ~inside[:, 2:]
    finite = np.isfinite(values).all(axis=1)
    strict = kept.all(axis=1) & finite
    slopes = np.where(inside[:, 1:], values[:, 1:] - values[:, :-1], 0.0)
    # rows every point of which from n = 1 on is on the envelope, all but the first test
    # passed (a job that is not running: its first round pays the restart)
    late = np.flatnonzero(kept[:, 1:].all(axis=1) & finite & ~strict)
    if late.size:
        _first_chord(values, caps, slopes, late)
    for i in np.flatnonzero(~strict & ~np.isin(np.arange(count), late)).tolist():
        slopes[i] = concave_slopes(values[i], int(caps[i]))
    return slopes if t > 0 else np.zeros((count, 0))


def _first_chord(
    values: FloatArray, caps: npt.NDArray[np.int64], slopes: FloatArray, rows: npt.NDArray[np.intp]
) -> None:
    """:func:`concave_slopes` of ``rows`` (their slopes written into ``slopes``), rows whose
    points from n = 1 on keep every hull test but whose first test fails. There
    :func:`concave_slopes`' hull is [0, 1] and then, while it is [0, n - 1], point n - 1 is
    popped where (v[n-1] - v[0]) n <= (v[n] - v[0]) (n - 1); from the first n that keeps its
    point (k = n - 1), every point is kept (each later test is a consecutive one, passed). So
    the envelope is the chord from 0 to k, then the plain differences: the same floats."""
    v = values[rows]
    width = v.shape[1]
    cap = caps[rows]
    n = np.arange(2, width)
    with np.errstate(invalid="ignore"):
        pops = (v[:, 1:-1] - v[:, :1]) * n <= (v[:, 2:] - v[:, :1]) * (n - 1)
    pops &= n[None, :] <= cap[:, None]
    # k: 1 and one more for each pop in a row from n = 2
    k = 1 + np.cumprod(pops, axis=1).sum(axis=1)
    chord = (v[np.arange(len(rows)), k] - v[:, 0]) / k
    head = np.arange(width - 1)[None, :] < k[:, None]
    slopes[rows] = np.where(head, chord[:, None], slopes[rows])


def _is_concave(values: FloatArray, cap: int) -> bool:
    diffs = np.diff(values[: cap + 1])
    return bool(np.all(diffs[1:] <= diffs[:-1] + 1e-15)) if cap >= 2 else True


def greedy_counts(
    problem: Problem, slopes: FloatArray, forced: npt.NDArray[np.int64] | None = None
) -> tuple[npt.NDArray[np.int64], float]:
    """Greedy by envelope gain per GPU-round; returns (counts, fractional relaxation bound).

    ``forced[j]`` increments of job j are taken first, whatever their gain (the problem's
    ``floors`` when not given). The bound is the relaxation's value under those floors: with
    concave envelopes, taking the forced increments and then the rest by ratio solves the
    relaxed problem with n_j >= forced_j exactly.
    """
    count, t = slopes.shape
    if forced is None:
        forced = problem.floors if problem.floors is not None else np.zeros(count, np.int64)
    n_idx = np.broadcast_to(np.arange(t), (count, t))
    allowed = n_idx < problem.caps[:, None]
    ratio = slopes / problem.gpus[:, None]
    must = allowed & (n_idx < forced[:, None])
    allowed &= (ratio > 0) | must
    flat_jobs, flat_n = np.nonzero(allowed)
    flat_ratio = ratio[allowed]
    flat_must = must[allowed]
    order = np.lexsort((flat_n, -flat_ratio, ~flat_must))
    cost = problem.gpus[flat_jobs[order]]
    used = np.cumsum(cost)
    capacity = problem.capacity
    cut = int(np.searchsorted(used, capacity, side="right"))
    counts = np.zeros(count, dtype=np.int64)
    taken = order[:cut]
    np.add.at(counts, flat_jobs[taken], 1)
    left = capacity - (float(used[cut - 1]) if cut else 0.0)
    base = float(problem.value[:, 0].sum())
    bound = base + float((flat_ratio[taken] * cost[:cut]).sum())
    if cut < len(order) and not flat_must[order[cut]]:
        bound += max(0.0, float(flat_ratio[order[cut]])) * left
    for k in order[cut : cut + 4096]:
        if left < 1:
            break
        job = int(flat_jobs[k])
        if flat_n[k] == counts[job] and problem.gpus[job] <= left:
            counts[job] += 1
            left -= problem.gpus[job]
    return counts, bound


def solve_counts(problem: Problem) -> tuple[npt.NDArray[np.int64], float, float]:
    """Greedy counts on the concave envelopes; returns (counts, objective, upper bound)."""
    slopes = concave_slopes_all(problem.value, problem.caps)
    counts, bound = greedy_counts(problem, slopes)
    value = problem.objective(counts)
    return counts, value, max(bound, value)


def pack_rounds(
    problem: Problem,
    counts: npt.NDArray[np.int64],
    priority: Sequence[float],
    deadlines: Sequence[float] | None = None,
    wait_for_ends: bool = False,
    patient: Sequence[bool] | None = None,
    short_lane: bool = False,
    path: frozenset[int] | None = None,
    lead: frozenset[int] | None = None,
) -> tuple[tuple[tuple[str, ...], ...], int]:
    """Turn counts into rounds; only round 0 runs before the next re-plan, so order matters.

    Packing order: jobs planned for every round of the window first (they must be in round 0
    anyway), then running jobs and jobs past their deadline (``priority`` > 0: negative laxity),
    then the rest, each group by ``priority`` (most urgent first); with ``deadlines`` (each job's
    fairness deadline), the running and late jobs go by earliest deadline instead (least laxity
    thrashes: a waiting job's laxity falls a round each round, overtakes the running job's, and
    the two swap back and forth, paying a restart each time). Each job takes a contiguous
    block from the earliest round where one fits (a running job keeps running, a resumed one
    pays one restart), else the earliest rounds with room. Keeping running jobs ahead of waiting
    ones that are not yet late avoids needless preemption. Returns the rounds and the number of
    job-rounds that found no room.

    One exception: a job past its deadline that its count finishes inside the window
    but that the packing left out of every round goes first, and the window is packed again.
    The deadline term valued it as finishing after its first n rounds; behind the full-window
    jobs, a gang wider than the GPUs they leave in each round was dropped from every plan,
    re-plan after re-plan, while its count said it was done (a 4-GPU job with 4 s of work left
    waited 7 hours on 16 GPUs). Only a job stranded whole reorders: one that lost part of its
    rounds still runs, and moving it ahead of the full-window jobs preempts the long jobs
    that set the makespan (the 120-job trace's worst FTF went from 0.85 to 0.91 that way).

    With ``short_lane``, a planned job that is not running, that one round finishes
    (r_j(1) = 0) and whose fairness deadline falls before that round ends, and that the packing
    left out of round 0, goes first too: the same reason at the scale of one round. Every
    round it waits adds a round of lateness to a run time under one round, where the
    full-window job it displaces loses one round of many (and pays one restart); without it,
    short arrivals on a full cluster were packed behind the full-window jobs, into a later
    column of the window, and waited rounds past their deadlines (a 12-second job 4 rounds).

    With ``patient`` (one flag per job) and ``deadlines``, a patient job that is not running
    passes a running one in the order only where both objectives gain by it: its deadline is
    earlier (the lateness order) and its remaining GPU-seconds are fewer (Smith's rule, the
    order of least total completion time); see :func:`_pareto_order`. A job not patient passes
    by deadline alone, as without ``patient``.

    With ``path`` (the finishing lane: indices of the jobs on the makespan's path,
    :func:`path_jobs`), a job past its deadline that its count finishes inside the window
    is packed with the jobs planned for the whole window that are not in ``path``, each by
    deadline, after those that are: the deadline term valued its finish at n rounds from now,
    which only a block from round 0 delivers, while a full-window job it displaces loses a
    few rounds of many and finishes later by as much, a small part of its own run time
    (docs/policy.md, "Jobs that finish inside the window"). None: off.

    With ``lead`` (:attr:`PlannerParams.path_first`; the jobs that lead the makespan's path,
    :func:`leading_jobs`), those jobs go first within their group; and a job in
    ``path`` whose count is its cap (it runs every round until it ends) packs with the
    full-window jobs: its count, not the window, is all it needs, and behind the late jobs
    of the lane a job that ends inside the window lost round 0 re-plan after re-plan while
    it set the makespan. None: off.
    """
    finishing_late = {
        i
        for i in range(len(problem.jobs))
        if priority[i] > 0 and counts[i] > 0 and problem.rem[i, int(counts[i])] <= 0
    }
    quick = {
        i for i in range(len(problem.jobs)) if short_lane and _short_and_due(problem, counts, i)
    }
    first = {i for i, job in enumerate(problem.jobs) if job.probe and counts[i] > 0}
    later: set[int] = set()
    kept: tuple[list[list[str]], list[int]] | None = None
    displaced: set[int] = set()
    index = {job.job_id: i for i, job in enumerate(problem.jobs)} if wait_for_ends else {}
    lane = finishing_late if path is not None else set()
    path = path or frozenset()
    while True:
        members, placed = _pack(
            problem, counts, priority, first, deadlines, later, patient, lane, path, lead
        )
        stranded = {i for i in finishing_late - first if placed[i] == 0}
        if members:
            ready = set(members[0])
            stranded |= {i for i in quick - first if problem.jobs[i].job_id not in ready}
        if stranded:
            first |= stranded
            continue
        if not wait_for_ends:
            break
        left_out = _displaced(problem, counts, members)
        if kept is not None and not (
            left_out < displaced and _start_on_ends(problem, index, members, later)
        ):
            # deferring won no running job its GPUs back, or a deferred job would not start
            # on the GPUs that free up inside round 0: undo it
            members, placed = kept
            break
        displaced = left_out
        deferred = _deferrable(problem, index, members, displaced, first | later)
        if not deferred:
            break
        kept = (members, placed)
        later |= set(deferred)
    lost = int(sum(int(counts[i]) - placed[i] for i in range(len(problem.jobs))))
    return tuple(tuple(m) for m in members), lost


def _short_and_due(problem: Problem, counts: npt.NDArray[np.int64], i: int) -> bool:
    """Whether job ``i`` is in the short-job lane (:func:`pack_rounds`): planned, not running,
    done within one round (r_j(1) = 0) and due before that round ends (overdue after it)."""
    job = problem.jobs[i]
    if job.running or counts[i] <= 0 or problem.rem[i, 1] > 0:
        return False
    return len(job.overdue) > 1 and job.overdue[1] > 0


def _pack(
    problem: Problem,
    counts: npt.NDArray[np.int64],
    priority: Sequence[float],
    first: set[int],
    deadlines: Sequence[float] | None = None,
    later: set[int] | None = None,
    patient: Sequence[bool] | None = None,
    lane: set[int] | None = None,
    path: frozenset[int] = frozenset(),
    lead: frozenset[int] | None = None,
) -> tuple[list[list[str]], list[int]]:
    """One packing pass (see :func:`pack_rounds`), jobs in ``first`` ahead of the rest and
    those in ``later`` after it; the finishing ``lane`` with the full-window jobs not in
    ``path``; the jobs of ``lead`` first in their group; returns the rounds' members and the
    rounds each job got."""
    t = problem.rounds
    free = [problem.total_gpus] * t
    members: list[list[str]] = [[] for _ in range(t)]
    placed = [0] * len(problem.jobs)

    def urgency(i: int) -> float:
        urgent = problem.jobs[i].running or priority[i] > 0
        return deadlines[i] if deadlines is not None and urgent else -priority[i]

    later = later or set()
    lane = lane or set()

    leading = lead or frozenset()

    def tier(i: int) -> int:
        """0: full window (on the path, or any while the lane is empty); 1: the lane and
        the other full-window jobs; 2: the rest. With ``lead``, a job of ``path`` that runs
        until it ends counts as full window."""
        n = int(counts[i])
        whole = n >= problem.rounds or (lead is not None and i in path and n >= problem.caps[i])
        if whole:
            return 0 if not lane or i in path else 1
        return 1 if i in lane else 2

    def group(i: int) -> tuple[bool, bool, int, bool, bool]:
        urgent = problem.jobs[i].running or priority[i] > 0
        return (i not in first, i in later, tier(i), i not in leading, not urgent)

    order = sorted(range(len(problem.jobs)), key=lambda i: (*group(i), urgency(i), i))
    if patient is not None and deadlines is not None:
        order = _pareto_order(problem, order, group, deadlines, patient)
    for i in order:
        n = int(counts[i])
        if n <= 0:
            continue
        job = problem.jobs[i]
        chosen: Sequence[int] | None = _earliest_block(free, job.gpus, n)
        if chosen is None:
            roomiest = sorted((r for r in range(t) if free[r] >= job.gpus), key=lambda r: -free[r])
            chosen = roomiest[:n]
        for r in chosen:
            free[r] -= job.gpus
            members[r].append(job.job_id)
        placed[i] = len(chosen)
    return members, placed


def _earliest_block(free: Sequence[int], gpus: int, n: int) -> range | None:
    """The earliest ``n`` consecutive rounds that each have ``gpus`` free GPUs, or None."""
    run = 0
    for r, left in enumerate(free):
        run = run + 1 if left >= gpus else 0
        if run == n:
            return range(r - n + 1, r + 1)
    return None


def _pareto_order(
    problem: Problem,
    order: Sequence[int],
    group: Callable[[int], tuple[bool, bool, int, bool, bool]],
    deadlines: Sequence[float],
    patient: Sequence[bool],
) -> list[int]:
    """``order`` with each group of running and late jobs (the same ``group`` key, in
    earliest-deadline order; not the stranded jobs packed first) merged again so that a job not
    running passes a running one only where it is due earlier *and* has fewer remaining
    GPU-seconds (GPUs x r_j(0)). The jobs that lead the makespan's path (``group``'s fourth
    key False) keep their order.

    Why: taking round 0 from a running job costs it a restart, and is worth it only where it
    helps. Earliest deadline first is the order of least maximum lateness (the fairness
    order); Smith's rule, fewest remaining GPU-seconds first, the order of least total
    completion time (average JCT). Where the two disagree, the swap trades one objective for
    the other and pays a restart on top, so the running job keeps its GPUs. A late wide job is
    not starved by it: running jobs end, and it stays ahead of every waiting job due later.
    Running jobs keep their order among themselves, and so do the others.
    """
    merged: list[int] = []
    for key, members in itertools.groupby(order, key=group):
        block = list(members)
        if key[4] or not key[0] or not key[3]:
            merged.extend(block)
            continue
        running = [i for i in block if problem.jobs[i].running]
        waiting = [i for i in block if not problem.jobs[i].running]
        r = w = 0
        while r < len(running) or w < len(waiting):
            if w < len(waiting) and (
                r == len(running) or _passes(problem, deadlines, patient, waiting[w], running[r])
            ):
                merged.append(waiting[w])
                w += 1
            else:
                merged.append(running[r])
                r += 1
    return merged


def _passes(
    problem: Problem,
    deadlines: Sequence[float],
    patient: Sequence[bool],
    waiting: int,
    running: int,
) -> bool:
    """Whether the job ``waiting`` (not running) goes before ``running`` for round 0: its
    deadline is the earlier and, if it is ``patient``, its remaining GPU-seconds the fewer."""
    if deadlines[waiting] >= deadlines[running]:
        return False
    if not patient[waiting]:
        return True
    jobs = problem.jobs
    size_w = jobs[waiting].gpus * float(problem.rem[waiting, 0])
    size_r = jobs[running].gpus * float(problem.rem[running, 0])
    return size_w < size_r


def _displaced(
    problem: Problem, counts: npt.NDArray[np.int64], members: list[list[str]]
) -> set[int]:
    """Running jobs with rounds in the window that the packing left out of round 0."""
    now = set(members[0]) if members else set()
    return {
        i
        for i, job in enumerate(problem.jobs)
        if job.running and counts[i] > 0 and job.job_id not in now
    }


def _ending_gpus(problem: Problem, round0: Sequence[int]) -> int:
    """GPUs of the jobs of round 0 (indices ``round0``) that end inside it."""
    return sum(problem.jobs[i].gpus for i in round0 if problem.rem[i, 1] <= 0)


def _start_on_ends(
    problem: Problem, index: Mapping[str, int], members: list[list[str]], later: set[int]
) -> bool:
    """Whether each job of ``later`` is in round 1 and, with the jobs that start at round 1
    ahead of it in that column (the mid-round fill's order), fits the GPUs of the jobs that
    end inside round 0. ``index``: job id -> index in ``problem.jobs``."""
    if len(members) < 2:
        return False
    ending = _ending_gpus(problem, [index[j] for j in members[0]])
    waiting = {problem.jobs[i].job_id for i in later}
    if not waiting <= set(members[1]):
        return False
    starting = 0
    for job_id in members[1]:
        if job_id in members[0]:
            continue
        starting += problem.jobs[index[job_id]].gpus
        waiting.discard(job_id)
        if not waiting:
            break
    return starting <= ending


def _deferrable(
    problem: Problem,
    index: Mapping[str, int],
    members: list[list[str]],
    displaced: set[int],
    moved: set[int],
) -> list[int]:
    """Jobs of round 0 not running (the last packed first, none of ``moved``) that can wait
    for the GPUs of the round-0 jobs ending inside it, until they free the displaced jobs'
    GPUs; none when no running job was displaced or no job ends in round 0. ``index`` as in
    :func:`_start_on_ends`."""
    if not displaced or not members:
        return []
    round0 = [index[j] for j in members[0]]
    ending = _ending_gpus(problem, round0)
    need = sum(problem.jobs[i].gpus for i in displaced)
    chosen: list[int] = []
    freed = 0
    for i in reversed(round0):
        if freed >= need:
            break
        job = problem.jobs[i]
        if job.running or i in moved or freed + job.gpus > ending:
            continue
        chosen.append(i)
        freed += job.gpus
    return chosen


def like_groups(problem: Problem, ratio: float) -> list[list[int]]:
    """Groups of like jobs (indices into ``problem.jobs``) whose rounds :func:`in_turn` deals
    out again: jobs of one width with a known run time and no floor (not held by the
    reservation, not a probe), cut where a run time exceeds ``ratio`` times the shortest of
    its group; only the groups that ask more GPUs than the cluster has are kept (their
    members cannot all run at once).

    Why only those: a group that fits the cluster could run all at once, so where the market
    holds its members back it is for the other jobs, and which of them waits is the
    market's fairness to weigh; dealing its rounds there only reorders a few jobs (groups of
    two to twelve 1-GPU jobs on 32 GPUs, the 120-job trace: average JCT 7,763 s against
    7,710 s, worst FTF 0.83 against 0.79)."""
    floors = problem.floors
    by_width: dict[int, list[tuple[float, int]]] = {}
    for i, job in enumerate(problem.jobs):
        held = floors is not None and int(floors[i]) > 0
        if job.run_time_s is None or held or job.probe:
            continue
        by_width.setdefault(job.gpus, []).append((job.run_time_s, i))
    groups: list[list[int]] = []
    for width, members in sorted(by_width.items()):
        members.sort()
        cut: list[list[int]] = []
        group: list[int] = []
        shortest = 0.0
        for run_time, i in members:
            if group and run_time > ratio * shortest:
                cut.append(group)
                group = []
            if not group:
                shortest = run_time
            group.append(i)
        cut.append(group)
        groups.extend(g for g in cut if len(g) * width > problem.total_gpus)
    return groups


def in_turn(
    problem: Problem,
    counts: npt.NDArray[np.int64],
    groups: Sequence[Sequence[int]],
    path: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.int64]:
    """``counts`` with each group of like jobs (``groups``, :func:`like_groups`) taking the
    rounds the market gave it in turn: each member keeps as much of its count as its ``path`` floor
    asks (:func:`path_floors`, one entry per job; None: none), and the rest of the group's
    total goes to the most advanced first (the largest share of its epochs done), then the
    longest waiting, a running one before a waiting one at a tie, then the jobs' order; each
    up to its cap. The group's total, and every other job's count, stay the market's.

    Why: the market's log utility values a round most for the job with the least progress, so
    jobs alike in width and length get the rounds in equal shares and advance in step: on a
    cluster that cannot run them all, each is preempted again and again and all of them end
    together, late, where running some of them to their end first ends those sooner and the
    others no later (the group's GPU-rounds are the same; so are the other jobs' counts). Of
    2,078 one-GPU jobs of 5.25 hours on an ITP week on 88 GPUs, each ran from its first round
    to its end over 2.2 times its run time. Only like jobs: between a short job and a long one
    the order starves one of them, which the fairness of the market weighs. Not by the least
    predicted remainder: jobs that have not started differ there only by their predictions,
    and the jobs predicted long waited while later arrivals passed them.

    Why the path floors: the least advanced members are dealt last, and where the group's
    work is most of what is left (a cluster's last jobs), the one whose remainder is
    longest is among them; dealt its rounds last it ends after the others, each round it
    lost a round of makespan (a 2-GPU job of a day among 2-GPU jobs on 16 GPUs, dealt none
    of the rounds the market and the path gave it: the makespan 1.4% longer than without
    the rule). A round of the floor keeps its latest remainder inside the path; the rounds
    past it buy no makespan and go in turn. Only as much as the market gave it: in a busy
    week the path is the work present, so many members have floors at once (half of a
    group of a hundred one-GPU jobs on 88 GPUs), and floors taken first out of the group's
    rounds would put them back in step."""
    if not groups:
        return counts
    dealt = counts.copy()
    jobs = problem.jobs
    for group in groups:
        left = int(sum(int(counts[i]) for i in group))
        for i in group:
            dealt[i] = min(int(counts[i]), int(path[i])) if path is not None else 0
            left -= int(dealt[i])
        order = sorted(
            group, key=lambda i: (-jobs[i].utility[0], -jobs[i].age_s, not jobs[i].running, i)
        )
        for i in order:
            take = min(int(problem.caps[i]) - int(dealt[i]), left)
            dealt[i] += take
            left -= take
    return dealt


def plan(
    jobs: Sequence[PlanJob],
    total_gpus: int,
    params: PlannerParams,
    round_seconds: float,
    priority: Sequence[float] | None = None,
    deadlines: Sequence[float] | None = None,
    wait_for_ends: bool = False,
    patient: Sequence[bool] | None = None,
) -> Plan:
    """Solve the window for ``jobs`` and pack it into rounds (never raises on a hard instance);
    ``priority``, ``deadlines``, ``wait_for_ends`` and ``patient``: the packing order
    (:func:`pack_rounds`)."""
    if not jobs:
        empty: tuple[tuple[str, ...], ...] = tuple(() for _ in range(params.rounds))
        return Plan({}, empty, 0.0, 0.0, 0.0, SolveStatus.EMPTY)
    problem = build_problem(jobs, total_gpus, params, round_seconds)
    empty_value = problem.objective(np.zeros(len(jobs), dtype=np.int64))
    counts, value, bound = solve_counts(problem)
    status = SolveStatus.GREEDY
    solver = "greedy"
    gain = bound - empty_value
    certified = gain <= 1e-15 or (bound - value) <= params.relative_gap * gain
    if certified and params.use_scip != "always":
        status = SolveStatus.OPTIMAL
    elif params.use_scip != "never":
        from shockwave.market.planner_scip import solve_with_scip

        result = solve_with_scip(problem, params, counts)
        if result is not None and result.value >= value - 1e-12:
            counts, value, solver = result.counts, result.value, "scip"
            bound = min(bound, max(result.bound, value))
            status = result.status
        elif result is not None:
            bound = min(bound, max(result.bound, value))
            status = result.status if result.status is not SolveStatus.OPTIMAL else status
        gain = bound - empty_value
        if gain <= 1e-15 or (bound - value) <= params.relative_gap * gain:
            status = SolveStatus.OPTIMAL
    like = like_groups(problem, params.like_ratio) if params.like_ratio > 0 else []
    lane = params.finishing_lane and len(jobs) <= total_gpus
    held = None
    if like or lane:
        held = path_floors(problem, params.critical_path_margin, round_seconds, params.path_slack)
    if like:
        counts = in_turn(problem, counts, like, held)
        value = problem.objective(counts)
    weights = list(priority) if priority is not None else [j.weight for j in jobs]
    path = on_path(problem, held) if lane and held is not None else None
    lead = leading_jobs(problem, params.critical_path_margin) if params.path_first else None
    rounds, lost = pack_rounds(
        problem,
        counts,
        weights,
        deadlines,
        wait_for_ends,
        patient,
        params.short_lane,
        path,
        lead,
    )
    return Plan(
        counts={j.job_id: int(c) for j, c in zip(jobs, counts, strict=True)},
        rounds=rounds,
        objective=value,
        bound=bound,
        empty_objective=empty_value,
        status=status,
        solver=solver,
        unpacked=lost,
    )


def is_concave_job(problem: Problem, index: int) -> bool:
    """Whether phi_j is concave over its integer points (secant cuts then model it exactly)."""
    return _is_concave(problem.value[index], int(problem.caps[index]))


def log_utility_points(job: PlanJob, floor: float) -> list[float]:
    """log(max(UTIL, floor)) at n = 0..cap, for tests and explanations."""
    return [math.log(max(u, floor)) for u in job.utility]
