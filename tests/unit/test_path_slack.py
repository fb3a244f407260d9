"""The critical-path reservation's own deadlines (``path_slack``, delta): a job on the makespan's
path is reserved once its latest remainder would no longer end by arrival + (1 + delta) x its
soonest run time, not from the moment it is on the path.

Shapes: jobs of 1 GPU, 60 s rounds, a 10-round window (600 s); remainders in seconds.
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
    own_deadline_s,
    path_jobs,
    plan,
)
from shockwave.policies.shockwave_market import shockwave as policy_module
from shockwave.policies.shockwave_market.shockwave import JobOutlook
from shockwave.prediction.predictor import Prediction
from tests.builders import plan_job

ROUND = 60.0
T = 10
WINDOW = T * ROUND


def path_job(job_id: str, left: float, run_time: float | None, age: float) -> PlanJob:
    """A long job whose market value is tiny (its fairness deadline is far): ``left`` seconds
    to run (soonest and latest alike), ``run_time`` its soonest run time from start, ``age``
    seconds since it arrived."""
    base = plan_job(job_id, [0.01 * n / T for n in range(T + 1)], weight=1e-6)
    return replace(
        base,
        remaining=tuple(left - ROUND * n for n in range(T + 1)),
        soonest_remaining_s=left,
        latest_remaining_s=left,
        run_time_s=run_time,
        age_s=age,
    )


def short_job(job_id: str) -> PlanJob:
    """A job that a round would finish, worth a lot to the market."""
    return plan_job(job_id, [0.0, 1.0], weight=1e6)


def test_own_deadline_is_arrival_plus_the_run_time_and_its_slack() -> None:
    job = path_job("a", 40_000.0, 50_000.0, 10_000.0)
    # arrived 10,000 s ago, 50,000 s alone: its own deadline at 1.05 x 50,000 s from arrival
    assert own_deadline_s(job, 0.05) == pytest.approx(52_500.0 - 10_000.0)
    assert own_deadline_s(job, 0.0) == -math.inf  # off: the path alone
    assert own_deadline_s(replace(job, run_time_s=None), 0.05) == -math.inf


@pytest.mark.parametrize(
    ("age", "slack", "floor"),
    [
        # no slack: a remainder longer than the path runs every round
        pytest.param(0.0, 0.0, T, id="off"),
        # 2,000 s of slack left (1.05 x 40,000 s from arrival): more than a window, no floor
        pytest.param(0.0, 0.05, 0, id="slack-left"),
        # 1,700 s waited: 300 s left, under the window's 600 s, five rounds of it reserved
        pytest.param(1_700.0, 0.05, 5, id="slack-running-out"),
        # waited past its own deadline: every round
        pytest.param(3_000.0, 0.05, T, id="slack-spent"),
    ],
)
def test_floor_waits_for_the_jobs_own_deadline(age: float, slack: float, floor: int) -> None:
    job = path_job("a", 40_000.0, 40_000.0, age)
    # the path (30,000 s) is shorter than the remainder: the job is on it
    assert critical_floor(job, 30_000.0, WINDOW, ROUND, T, slack) == floor


def test_slack_never_raises_a_floor() -> None:
    # own deadline sooner than the path (a job that waited long before it was on the path):
    # the path still sets its floor
    job = path_job("a", 29_500.0, 20_000.0, 15_000.0)
    assert own_deadline_s(job, 0.05) < 30_000.0
    assert critical_floor(job, 30_000.0, WINDOW, ROUND, T, 0.05) == critical_floor(
        job, 30_000.0, WINDOW, ROUND, T, 0.0
    )
    assert critical_floor(job, None, WINDOW, ROUND, T, 0.05) == 0  # no path, no floor


def test_a_path_job_with_slack_gives_round_0_to_waiting_jobs() -> None:
    """Two long jobs on the path of a full 4-GPU cluster (W = 20,600 s, 0.75 L = 30,000 s),
    40 short jobs waiting: with slack left the long jobs wait and the short ones run; once it
    is spent, the long ones run every round."""
    shorts = [short_job(str(i)) for i in range(40)]
    params = PlannerParams(rounds=T, deadline_weight=0.0, makespan_weight=0.0, path_slack=0.0)
    fresh = [path_job(k, 40_000.0, 40_000.0, 0.0) for k in "ab"]
    before = plan([*shorts, *fresh], 4, params, ROUND)
    assert {"a", "b"} <= set(before.rounds[0])
    slack = replace(params, path_slack=0.05)
    waiting = plan([*shorts, *fresh], 4, slack, ROUND)
    assert set(waiting.rounds[0]) <= {s.job_id for s in shorts}
    assert len(waiting.rounds[0]) == 4
    spent = [path_job(k, 40_000.0, 40_000.0, 2_000.0) for k in "ab"]
    late = plan([*shorts, *spent], 4, slack, ROUND)
    assert {"a", "b"} <= set(late.rounds[0])
    assert late.counts["a"] == T and late.counts["b"] == T


def test_a_job_with_slack_is_not_on_the_path_for_the_finishing_lane() -> None:
    jobs = [path_job("a", 40_000.0, 40_000.0, 0.0), short_job("s")]
    before = build_problem(jobs, 4, PlannerParams(rounds=T, path_slack=0.0), ROUND)
    assert 0 in path_jobs(before, 0.75, ROUND)
    problem = build_problem(jobs, 4, PlannerParams(rounds=T, path_slack=0.05), ROUND)
    assert 0 not in path_jobs(problem, 0.75, ROUND, 0.05)


def test_the_slack_is_on_by_default() -> None:
    assert PlannerParams().path_slack == 0.05


def test_slack_outside_its_range_is_refused() -> None:
    for slack in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="path_slack"):
            PlannerParams(path_slack=slack)


def test_the_policy_gives_the_planner_each_jobs_soonest_run_time_and_age() -> None:
    # 20,000 s run of a predicted 50,000 s; 30,000 s left as predicted, 24,000 s at the
    # fastest epoch time of its trajectory: alone it would run 20,000 + 24,000 s from start
    look = JobOutlook(
        prediction=Prediction(regimes=(), current=0, epochs_done=0.0, total_epochs=0),
        remaining_s=30_000.0,
        total_s=50_000.0,
        rho=1.0,
        error_factor=1.0,
        deadline_s=40_000.0,
        fair_share_s=50_000.0,
        cautious_remaining_s=30_000.0,
        soonest_remaining_s=24_000.0,
        latest_remaining_s=36_000.0,
        age_s=25_000.0,
    )
    tables = ((0.4, 0.5), (30_000.0, 29_880.0), np.array([WINDOW + 30_000.0, WINDOW + 29_880.0]))
    job = policy_module._planned("a", 1, look, 1.0, tables, False, WINDOW)
    assert job.run_time_s == pytest.approx(44_000.0)
    assert job.age_s == 25_000.0
    # own deadline 1.05 x 44,000 - 25,000 s from now, short of its latest remainder: no slack
    assert own_deadline_s(job, 0.05) == pytest.approx(21_200.0)
