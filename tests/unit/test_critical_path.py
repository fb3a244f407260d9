"""The planner's critical-path reservation: when a few long jobs bound the makespan, they run.

Shapes: jobs of 1 GPU, 60 s rounds, a 10-round window; remainders in seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from shockwave.market.planner import (
    PlanJob,
    PlannerParams,
    build_problem,
    critical_floor,
    critical_path_s,
    fit_floors,
    held_path_s,
    leading_jobs,
    plan,
)
from shockwave.policies.shockwave_market import shockwave as policy
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams
from shockwave.prediction.throughput_model import ThroughputModel
from shockwave_cli.commands.inputs import InputError
from shockwave_cli.commands.knobs import ShockwaveKnobs, apply_knobs
from tests.builders import plan_job, snapshot

ROUND = 60.0
T = 10


def long_job(job_id: str, soonest: float, latest: float, weight: float = 1.0) -> PlanJob:
    """A job with a long remainder whose market value is tiny (its deadline is far)."""
    base = plan_job(job_id, [0.01 * n / T for n in range(T + 1)], weight=weight)
    return replace(
        base,
        remaining=tuple(latest - ROUND * n for n in range(T + 1)),
        soonest_remaining_s=soonest,
        latest_remaining_s=latest,
    )


def short_job(job_id: str) -> PlanJob:
    """A job that a round would finish, worth a lot to the market."""
    return plan_job(job_id, [0.0, 1.0], weight=1e6)


def test_no_path_when_the_work_bounds_the_makespan() -> None:
    jobs = [long_job("a", 1000.0, 1200.0)] + [short_job(str(i)) for i in range(8)]
    # 8 x 60 + 1000 GPU-seconds over 1 GPU outlast the longest job: no critical path.
    assert critical_path_s(jobs, 1, 0.75) is None


def test_path_is_the_longest_soonest_remainder_scaled_by_the_margin() -> None:
    jobs = [long_job("a", 40_000.0, 50_000.0), long_job("b", 10_000.0, 12_000.0)]
    assert critical_path_s(jobs, 8, 0.75) == pytest.approx(30_000.0)
    assert critical_path_s(jobs, 8, 0.0) is None


def close_bounds() -> list[PlanJob]:
    """On 4 GPUs: the longest job's 40,000 s outlast the work bound W = 37,600 s, but not
    W / 0.75 (the bounds are close, as on the 120-job trace from 4,000 s to 16,000 s)."""
    longs = [long_job("a", 40_000.0, 40_000.0, weight=1e-6)]
    longs += [long_job(k, 36_000.0, 36_000.0, weight=1e-6) for k in "bcd"]
    return [*[short_job(str(i)) for i in range(40)], *longs]


def test_path_holds_while_the_longest_job_bounds_the_makespan() -> None:
    jobs = close_bounds()
    # gate 1: L > W is enough, and the path is W, not 0.75 L (no plan ends before W)
    assert critical_path_s(jobs, 4, 0.75, 1.0) == pytest.approx(37_600.0)
    # the gate before (theta_c): 0.75 L = 30,000 s < W, no path
    assert critical_path_s(jobs, 4, 0.75, 0.75) is None
    assert critical_path_s(jobs, 4, 0.75) is None
    # the longest job shorter than the work bound: no path whatever the gate
    assert critical_path_s(jobs, 3, 0.75, 1.0) is None


def test_longest_job_runs_every_round_while_the_bounds_are_close() -> None:
    params = PlannerParams(
        rounds=T, deadline_weight=0.0, makespan_weight=0.0, critical_path_gate=1.0
    )
    result = plan(close_bounds(), 4, params, ROUND)
    assert result.counts["a"] == T
    assert all("a" in column for column in result.rounds)
    # only the longest is reserved: the others fit after the window whatever they get
    assert result.counts["b"] < T
    before = plan(close_bounds(), 4, replace(params, critical_path_gate=0.75), ROUND)
    assert before.counts["a"] < T


def test_floors_that_fit_are_kept() -> None:
    floors = np.array([3, 2, 0], dtype=np.int64)
    kept = fit_floors(floors, np.ones(3), [5000.0, 4000.0, 100.0], 5.0, ROUND)
    assert kept.tolist() == [3, 2, 0]


def test_floors_over_capacity_keep_the_longest_remainders() -> None:
    floors = np.array([T, T, T], dtype=np.int64)
    kept = fit_floors(floors, np.ones(3), [5000.0, 4800.0, 3000.0], 12.0, ROUND)
    # rounds taken from the longest remainder before them down: 5000, 4940, 4880, 4820,
    # 4800 (b), 4760, 4740 (b), ... 4580: a keeps 8, b 4, c (shortest) none
    assert kept.tolist() == [8, 4, 0]
    assert int(kept.sum()) == 12
    # a wide job costs its GPUs per round
    wide = fit_floors(floors, np.array([4.0, 1.0, 1.0]), [5000.0, 4800.0, 3000.0], 12.0, ROUND)
    assert float((wide * np.array([4.0, 1.0, 1.0])).sum()) <= 12.0
    assert wide[0] >= 1 and wide[2] == 0


def test_longest_job_keeps_its_floor_when_the_floors_overflow() -> None:
    """Soonest remainders far below the latest ones (GNS jobs that may speed up): the path is
    short and every long job gets a floor; together they ask 50 GPU-rounds of 40."""
    longest = long_job("a", 1200.0, 1200.0, weight=1e-6)
    others = [long_job(k, 100.0, 1000.0, weight=1.0) for k in "bcde"]
    params = PlannerParams(rounds=T, deadline_weight=0.0, makespan_weight=0.0)
    problem = build_problem([longest, *others], 4, params, ROUND)
    assert problem.floors is not None
    assert problem.floors.tolist() == [T, 8, 8, 7, 7]
    result = plan([longest, *others], 4, params, ROUND)
    assert result.counts["a"] == T
    assert "a" in result.rounds[0]


@pytest.mark.parametrize(
    ("latest", "path", "floor"),
    [
        (10_000.0, None, 0),  # no path: nothing reserved
        (20_000.0, 30_000.0, 0),  # fits after the window whatever it gets
        (30_000.0 - 600.0 + 61.0, 30_000.0, 2),  # 61 s too long: two rounds of 60 s
        (50_000.0, 30_000.0, T),  # longer than the path: every round
    ],
)
def test_floor_keeps_the_latest_remainder_inside_the_path(
    latest: float, path: float | None, floor: int
) -> None:
    job = long_job("a", latest * 0.8, latest)
    assert critical_floor(job, path, T * ROUND, ROUND, T) == floor


def test_reserved_jobs_run_although_the_market_prefers_others() -> None:
    longs = [long_job("a", 40_000.0, 50_000.0), long_job("b", 31_000.0, 45_000.0)]
    shorts = [short_job(str(i)) for i in range(40)]
    params = PlannerParams(rounds=T, deadline_weight=0.0, makespan_weight=0.0)
    with_path = plan([*shorts, *longs], 4, params, ROUND)
    assert with_path.counts["a"] == T and with_path.counts["b"] == T
    assert {"a", "b"} <= set(with_path.rounds[0])
    without = plan([*shorts, *longs], 4, replace(params, critical_path_margin=0.0), ROUND)
    assert without.counts["a"] < T


def test_bound_stays_valid_under_floors() -> None:
    longs = [long_job("a", 40_000.0, 50_000.0)]
    shorts = [short_job(str(i)) for i in range(12)]
    params = PlannerParams(rounds=T, use_scip="never")
    result = plan([*shorts, *longs], 2, params, ROUND)
    problem = build_problem([*shorts, *longs], 2, params, ROUND)
    assert problem.floors is not None and int(problem.floors[-1]) == T
    assert result.counts["a"] == T
    assert result.bound >= result.objective - 1e-12
    counts = np.array([result.counts[j.job_id] for j in problem.jobs])
    assert problem.objective(counts) == pytest.approx(result.objective)


def test_margin_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match="critical_path_margin"):
        PlannerParams(critical_path_margin=1.5)
    for gate in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="critical_path_gate"):
            PlannerParams(critical_path_gate=gate)


def test_the_gate_is_a_knob_and_elastic_plans_keep_theta_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = ShockwaveParams()
    assert params.planner.critical_path_gate is None  # opt-in: theta_c by default
    given = apply_knobs(params, ShockwaveKnobs(critical_path_gate=0.75), None)
    assert given.planner.critical_path_gate == 0.75
    with pytest.raises(InputError, match="--critical-path-gate"):
        apply_knobs(params, ShockwaveKnobs(critical_path_gate=0.0), None)
    with pytest.raises(ValueError, match="elastic_critical_gate"):
        ShockwaveParams(elastic_critical_gate=2.0)

    seen: list[PlannerParams] = []

    def spy(jobs: object, gpus: int, planner: PlannerParams, *args: object) -> object:
        seen.append(planner)
        return None

    monkeypatch.setattr(policy, "plan_elastic", spy)
    snap = snapshot([], gpus=4)
    Shockwave.plan_elastic_jobs(snap, params, [], [])
    assert seen[-1].critical_path_gate is None  # None: theta_c, the gate before
    Shockwave.plan_elastic_jobs(snap, replace(params, elastic_critical_gate=1.0), [], [])
    assert seen[-1].critical_path_gate == 1.0


def ending_job(job_id: str, rounds: int, *, gpus: int = 1, running: bool = False) -> PlanJob:
    """A job that ``rounds`` rounds finish (its cap), inside the window."""
    base = plan_job(job_id, [n / rounds for n in range(rounds + 1)], gpus=gpus, running=running)
    left = tuple(ROUND * (rounds - n) for n in range(rounds + 1))
    return replace(base, remaining=left, soonest_remaining_s=left[0], latest_remaining_s=left[0])


def tail() -> tuple[list[PlanJob], list[float], list[float]]:
    """The last stretch on 4 GPUs: "a" (540 s, waiting, its fairness deadline far) sets the
    makespan; three running jobs past their deadlines (300 s each, one of them 2 GPUs wide)
    take the lane. Jobs, priorities (> 0: late), deadlines."""
    jobs = [
        ending_job("a", 9),
        ending_job("b", 5, running=True),
        ending_job("c", 5, running=True),
        ending_job("d", 5, gpus=2, running=True),
    ]
    return jobs, [-1.0, 1.0, 1.0, 1.0], [1e9, 0.0, 0.0, 0.0]


def test_the_job_that_sets_the_makespan_takes_round_zero_with_path_first() -> None:
    jobs, priority, deadlines = tail()
    params = PlannerParams(
        rounds=T, deadline_weight=0.0, makespan_weight=0.0, critical_path_gate=1.0
    )
    problem = build_problem(jobs, 4, params, ROUND)
    # W = (540 + 300 + 300 + 600) / 4 = 435 s; "a" outlasts it and leads the path
    assert leading_jobs(problem, params.critical_path_margin) == frozenset({0})
    before = plan(jobs, 4, params, ROUND, priority, deadlines)
    # its count (9 rounds, its cap) is short of the window, so the lane's jobs went first
    assert before.counts["a"] == 9
    assert "a" not in before.rounds[0]
    first = plan(jobs, 4, replace(params, path_first=True), ROUND, priority, deadlines)
    assert first.counts == before.counts
    assert "a" in first.rounds[0]
    assert all("a" in column for column in first.rounds[:9])


def test_only_floored_jobs_past_the_path_lead() -> None:
    jobs, _, _ = tail()
    params = PlannerParams(rounds=T, critical_path_gate=1.0)
    # every job has a floor, but only "a" outlasts W = 435 s; with the gate closed (0.75 L =
    # 405 s < W) nothing is floored and none leads
    assert leading_jobs(build_problem(jobs, 4, params, ROUND), 0.75) == frozenset({0})
    closed = replace(params, critical_path_gate=None)
    assert leading_jobs(build_problem(jobs, 4, closed, ROUND), 0.75) == frozenset()


def test_a_speed_spread_holds_the_path_tighter() -> None:
    params = ShockwaveParams()
    alike = [ThroughputModel({}, speed_variance=0.0)]
    assert policy._with_spread(params, alike) is params
    assert policy._with_spread(params, []) is params
    sigma = 0.1
    spread = [ThroughputModel({}, speed_variance=0.0), ThroughputModel({}, speed_variance=sigma**2)]
    held = policy._with_spread(params, spread).planner
    assert held.path_first
    assert held.critical_path_gate is None, "the gate against the work alone is kept"
    assert held.spread_gate == pytest.approx(0.75 * math.exp(1.645 * sigma))
    wide = policy._with_spread(params, [ThroughputModel({}, speed_variance=0.3**2)]).planner
    assert wide.spread_gate == 1.0  # at most: whenever the longest job bounds it
    off = replace(params, planner=replace(params.planner, critical_path_margin=0.0))
    assert policy._with_spread(off, spread) is off


def test_the_spread_gate_holds_the_path_only_against_the_work_still_to_arrive() -> None:
    # On 2 GPUs: W = (1000 + 900) / 2 = 950 s, L = 1000 s. The gate theta_c = 0.75 is shut
    # (750 < 950); the spread gate 1 holds (1000 > 950) while the projected arrivals leave
    # the longest job on the path, and lets go once they outweigh the gap (1000 < 950 + 100).
    jobs = [long_job("a", 1000.0, 1200.0), long_job("b", 900.0, 1000.0)]
    shut = PlannerParams(rounds=T)
    assert held_path_s(jobs, 2, shut) is None
    spread = replace(shut, spread_gate=1.0)
    assert held_path_s(jobs, 2, spread) == pytest.approx(950.0)
    assert build_problem(jobs, 2, spread, ROUND).floors is not None
    assert held_path_s(jobs, 2, replace(spread, arriving_s=40.0)) == pytest.approx(950.0)
    assert held_path_s(jobs, 2, replace(spread, arriving_s=100.0)) is None
    # the gate of the work alone still holds whatever arrives
    alone = replace(spread, critical_path_gate=1.0, arriving_s=100.0)
    assert held_path_s(jobs, 2, alone) == pytest.approx(950.0)
    with pytest.raises(ValueError, match="spread_gate"):
        PlannerParams(spread_gate=1.5)
