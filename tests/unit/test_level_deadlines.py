"""The packing deadlines of Shockwave's late jobs: earliest deadline first at the worst
predicted finish-time fairness among them, not at their fairness deadlines."""

from __future__ import annotations

from shockwave.policies.shockwave_market.shockwave import JobOutlook, _level_deadlines
from shockwave.prediction.predictor import Prediction


def look(deadline_s: float, total_s: float, rho: float) -> JobOutlook:
    """An outlook with a fairness deadline ``deadline_s`` from now, a fair share (N = 1) of
    ``total_s`` and a predicted finish-time fairness ``rho``."""
    nothing = Prediction((), 0, 0.0, 0)
    return JobOutlook(nothing, total_s, total_s, rho, 1.0, deadline_s, total_s, 0.0, 0.0, 0.0)


def test_a_short_late_job_goes_before_a_long_one_that_fell_due_earlier() -> None:
    # A job of 27 hours due 6 hours ago (rho 1.2) and a job of 11 minutes due 2 minutes ago
    # (rho 1.5), one job not late; S = 1.5.
    looks = [look(-21_600.0, 95_000.0, 1.2), look(-120.0, 673.0, 1.5), look(3_000.0, 4_000.0, 0.5)]
    plain = _level_deadlines(looks, False)
    assert plain == [-21_600.0, -120.0, 3_000.0]
    leveled = _level_deadlines(looks, True)
    # At S = 1.5 the long job must finish within -21,600 + 0.5 x 95,000 = 25,900 s, the short
    # one within -120 + 0.5 x 673 = 216.5 s: the short one first, both still ahead of the job
    # that is not late, whose deadline does not move.
    assert leveled[1] < leveled[0] < 0 <= leveled[2]
    assert leveled[2] == 3_000.0
    assert leveled[0] - leveled[1] == 25_900.0 - 216.5


def test_one_late_job_or_none_keeps_the_fairness_deadlines() -> None:
    looks = [look(-500.0, 1_000.0, 3.0), look(200.0, 100_000.0, 0.9)]
    assert _level_deadlines(looks, True) == [-500.0, 200.0]
    assert _level_deadlines([look(10.0, 60.0, 0.5)], True) == [10.0]
    assert _level_deadlines([], True) == []


def test_late_jobs_whose_level_deadlines_are_all_behind_stay_in_order() -> None:
    # S = 2: the level deadlines are -100 + 1,000 and -50 + 100 (both ahead of now), shifted
    # below 0 together so that no late job falls behind one that is not late.
    looks = [look(-100.0, 1_000.0, 2.0), look(-50.0, 100.0, 1.1), look(1.0, 10.0, 0.1)]
    leveled = _level_deadlines(looks, True)
    assert leveled[1] < leveled[0] < 0 < leveled[2] == 1.0
