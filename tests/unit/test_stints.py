"""The restore rule and a job's received service counted from its stints."""

from __future__ import annotations

import pytest

from shockwave.domain.stints import Stint, received_seconds, useful_seconds

RESTORE, GUARD = 20.0, 5.0


@pytest.mark.parametrize(
    ("elapsed", "lease", "useful"),
    [
        pytest.param(120.0, 120.0, 100.0, id="full-round-pays-the-restore"),
        pytest.param(116.0, 120.0, 96.0, id="within-the-guard-of-the-end-pays"),
        pytest.param(115.0, 120.0, 115.0, id="a-short-stretch-is-spared"),
        pytest.param(10.0, 10.0, 0.0, id="a-lease-shorter-than-the-restore-gives-nothing"),
    ],
)
def test_useful_seconds_of_a_start(elapsed: float, lease: float, useful: float) -> None:
    assert useful_seconds(elapsed, lease, RESTORE, GUARD) == pytest.approx(useful)


def test_a_stint_pays_one_restore_however_many_rounds_it_is_extended() -> None:
    three_rounds = Stint(began_s=0.0, first_end_s=120.0, end_s=360.0)
    assert received_seconds([three_rounds], RESTORE, GUARD) == pytest.approx(340.0)


def test_an_extended_stint_that_stops_early_still_paid_its_restore() -> None:
    """Stopped 10 s into its third round: under the guard of that round, but the restore was
    paid in its first, which it held in full."""
    stint = Stint(began_s=0.0, first_end_s=120.0, end_s=250.0)
    assert received_seconds([stint], RESTORE, GUARD) == pytest.approx(230.0)


def test_a_fill_started_mid_round_is_charged_over_its_own_lease() -> None:
    fill = Stint(began_s=80.0, first_end_s=120.0, end_s=120.0)  # a 40 s lease held in full
    short = Stint(began_s=300.0, first_end_s=360.0, end_s=310.0)  # 10 s of a 60 s lease
    assert received_seconds([fill, short], RESTORE, GUARD) == pytest.approx(20.0 + 10.0)


def test_no_stints_no_service() -> None:
    assert received_seconds([], RESTORE, GUARD) == 0.0
