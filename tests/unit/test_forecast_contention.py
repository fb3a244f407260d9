"""Fairness by each job's contention over its whole life (``forecast_contention``).

Shape: a long job that saw 3 jobs per GPU for 10 rounds, and three short jobs that arrived
beside it on 2 GPUs. Sharing the cluster equally, the short jobs end after 2,000 s and the long
job runs the last 2,000 s alone, so its life's contention is (30 + 40 + 10) / 50 = 1.6 rounds,
not the 3 of its past: its fair share and its deadline come from 1.6.
"""

from __future__ import annotations

from typing import Any

import pytest

from shockwave.domain.snapshot import ActiveJob
from shockwave.policies.shockwave_market.shockwave import (
    Shockwave,
    ShockwaveParams,
    rates_by_job,
)
from shockwave_cli.commands.knobs import ShockwaveKnobs, apply_knobs
from tests.builders import active_job, snapshot

SUMS = {"long": 30.0}
ROUNDS = {"long": 10}


def jobs() -> list[ActiveJob]:
    """The long job of 3,000 s and three short ones of 1,000 s (100 s epochs)."""
    return [
        active_job("long", epochs=30),
        *(active_job(f"short{i}", epochs=10, arrival=900.0) for i in range(3)),
    ]


def test_lifetime_contention_forecasts_the_rounds_each_job_has_left() -> None:
    active = jobs()
    shot = snapshot(active, gpus=2, now=1_000.0, round_seconds=100.0)
    params = ShockwaveParams(forecast_contention=True)
    lifetime = Shockwave().lifetime_contention(
        shot, params, SUMS, ROUNDS, rates_by_job(shot, params.throughput)
    )
    # the short jobs: 2,000 s at 2 jobs per GPU and no past
    assert lifetime == pytest.approx({"long": 1.6, "short0": 2.0, "short1": 2.0, "short2": 2.0})


def test_the_outlook_sets_the_fair_share_from_the_lifetime_contention() -> None:
    active = jobs()
    shot = snapshot(active, gpus=2, now=1_000.0, round_seconds=100.0)
    policy, params = Shockwave(), ShockwaveParams()
    past = policy.outlook(shot, active[0], params, SUMS, ROUNDS)
    whole = policy.outlook(shot, active[0], params, SUMS, ROUNDS, lifetime=1.6)
    assert past.total_s == pytest.approx(3_000.0)
    assert past.fair_share_s == pytest.approx(3.0 * 3_000.0)
    assert whole.fair_share_s == pytest.approx(1.6 * 3_000.0)
    # deadline = arrival + N P - now; rho = (age + R N) / (P N)
    assert whole.deadline_s == pytest.approx(1.6 * 3_000.0 - 1_000.0)
    assert whole.rho == pytest.approx((1_000.0 + 3_000.0 * 1.6) / (3_000.0 * 1.6))
    assert whole.rho > past.rho


class _Counting(Shockwave):
    """The policy, counting the forecasts it makes."""

    def __init__(self) -> None:
        self.forecasts = 0

    def lifetime_contention(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        self.forecasts += 1
        return super().lifetime_contention(*args, **kwargs)


def test_decide_forecasts_only_when_asked() -> None:
    shot = snapshot(jobs(), gpus=2, now=1_000.0, round_seconds=100.0)
    policy = _Counting()
    policy.decide(shot, ShockwaveParams())
    assert policy.forecasts == 0
    policy.decide(shot, ShockwaveParams(forecast_contention=True))
    assert policy.forecasts == 1


def test_forecast_contention_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="forecast_contention must be a bool"):
        ShockwaveParams(forecast_contention="yes")  # type: ignore[arg-type]


def test_the_flag_turns_the_forecast_on() -> None:
    params = ShockwaveParams()
    assert not params.forecast_contention  # the mean of the past by default
    given = apply_knobs(params, ShockwaveKnobs(forecast_contention=True), None)
    assert given.forecast_contention
    assert ShockwaveKnobs(forecast_contention=True).given() == ["--forecast-contention"]
