"""The long-term estimators on literal inputs: finish-time fairness, contention, makespan bound."""

from __future__ import annotations

import pytest

from shockwave.market.estimators import (
    contention_factor,
    finish_time_fairness,
    forecast_contention,
    lifetime_contention,
    makespan_lower_bound,
)


@pytest.mark.parametrize(
    ("age", "remaining", "total", "contention", "rho"),
    [
        pytest.param(0.0, 100.0, 100.0, 1.0, 1.0, id="fresh-job"),
        pytest.param(0.0, 100.0, 100.0, 4.0, 1.0, id="fresh-job-under-contention"),
        pytest.param(100.0, 100.0, 100.0, 1.0, 2.0, id="waited-its-whole-run"),
        pytest.param(100.0, 100.0, 100.0, 2.0, 1.5, id="waiting-counts-less-when-contended"),
        pytest.param(50.0, 50.0, 100.0, 1.0, 1.0, id="ran-alone-half-way"),
        pytest.param(50.0, 50.0, 100.0, 2.0, 0.75, id="ahead-of-its-fair-share"),
        pytest.param(100.0, 100.0, 100.0, 0.5, 2.0, id="contention-floored-at-1"),
        pytest.param(-10.0, 100.0, 100.0, 1.0, 1.0, id="negative-age-is-zero"),
        pytest.param(0.0, -5.0, 100.0, 1.0, 0.0, id="negative-remaining-is-zero"),
        pytest.param(30.0, 0.0, 0.0, 1.0, 1.0, id="no-predicted-time"),
    ],
)
def test_finish_time_fairness(
    age: float, remaining: float, total: float, contention: float, rho: float
) -> None:
    assert finish_time_fairness(age, remaining, total, contention) == pytest.approx(rho)


@pytest.mark.parametrize("age", [0.0, 10.0, 100.0, 1000.0])
def test_waiting_raises_rho(age: float) -> None:
    before = finish_time_fairness(age, 100.0, 200.0, 2.0)
    after = finish_time_fairness(age + 60.0, 100.0, 200.0, 2.0)
    assert after > before


@pytest.mark.parametrize(
    ("jobs", "gpus", "factor"),
    [
        pytest.param(8, 4, 2.0, id="two-jobs-per-gpu"),
        pytest.param(6, 4, 1.5, id="fractional"),
        pytest.param(4, 4, 1.0, id="one-per-gpu"),
        pytest.param(2, 4, 1.0, id="idle-gpus-floored"),
        pytest.param(0, 4, 1.0, id="no-jobs"),
    ],
)
def test_contention_factor(jobs: int, gpus: int, factor: float) -> None:
    assert contention_factor(jobs, gpus) == pytest.approx(factor)


@pytest.mark.parametrize(
    ("remaining", "gpus", "bound"),
    [
        pytest.param([], 4, 0.0, id="no-job"),
        pytest.param([10.0, 10.0, 10.0, 10.0], 2, 20.0, id="average-load"),
        pytest.param([10.0, 10.0], 4, 10.0, id="longest-job"),
        pytest.param([100.0, 1.0, 1.0], 4, 100.0, id="one-long-job"),
        pytest.param([30.0, 30.0, 30.0], 2, 45.0, id="load-above-longest"),
        pytest.param([-5.0, 8.0], 1, 8.0, id="negative-remaining-is-zero"),
    ],
)
def test_makespan_lower_bound(remaining: list[float], gpus: int, bound: float) -> None:
    assert makespan_lower_bound(remaining, gpus) == pytest.approx(bound)


def test_makespan_lower_bound_reads_any_iterable() -> None:
    assert makespan_lower_bound((r for r in [3.0, 5.0]), 1) == pytest.approx(8.0)


def test_lifetime_contention_counts_the_rounds_still_to_run_at_todays_contention() -> None:
    # 10 rounds at 3 so far, 10 still to run now that contention is 1: the job's N over its
    # life will be 2, not the 3 of its past alone
    assert lifetime_contention(30.0, 10, 1.0, 10.0) == 2.0
    assert lifetime_contention(30.0, 10, 3.0, 10.0) == 3.0  # unchanged contention: the mean
    assert lifetime_contention(30.0, 10, 1.0, 0.0) == 3.0  # nothing left to run: the past
    assert lifetime_contention(0.0, 0, 0.5, 0.0) == 1.0  # floored at 1


def test_forecast_contention_lets_the_jobs_present_share_the_cluster_until_each_ends() -> None:
    # 3 jobs on 2 GPUs, rounds of 100 s, no past: each runs at 2/3 until the 100 s job ends
    # (150 s at 1.5 jobs per GPU), the two left at full speed for 100 s (1.0), the last
    # alone for 100 s (0.5)
    forecast = forecast_contention([(0.0, 0)] * 3, [200.0, 100.0, 300.0], 2, 100.0)
    assert forecast == pytest.approx([325.0 / 250.0, 1.5, 375.0 / 350.0])


def test_forecast_contention_weighs_the_past_by_its_rounds() -> None:
    # 10 rounds at 3 so far, then alone on 1 GPU for 10 rounds: (30 + 10) / 20
    assert forecast_contention([(30.0, 10)], [1_000.0], 1, 100.0) == [2.0]
    # a job with nothing left keeps the mean of its past; fewer jobs than GPUs floor at 1
    assert forecast_contention([(30.0, 10), (0.0, 0)], [0.0, 500.0], 8, 100.0) == [3.0, 1.0]


def test_forecast_contention_needs_a_past_per_job() -> None:
    with pytest.raises(ValueError, match="one entry per job"):
        forecast_contention([(0.0, 0)], [1.0, 2.0], 1, 100.0)
