"""When a round ends (solver_service.leases.round_end): the cadence is kept through small
lateness, a full round from now after half a round or more, and for the first round."""

from __future__ import annotations

import pytest

from solver_service.leases import round_end


@pytest.mark.parametrize(
    ("now", "due", "ends"),
    [
        (100.0, 100.0, 220.0),  # on time
        (100.3, 100.0, 220.0),  # a little late: the cadence holds
        (99.9995, 100.0, 220.0),  # within the step tolerance before its due time
        (159.9, 100.0, 220.0),  # still under half a round late
        (160.0, 100.0, 280.0),  # half a round or more late: a full round from now
        (5000.0, 100.0, 5120.0),  # after an outage
        (100.0, None, 220.0),  # the first round
    ],
)
def test_the_round_keeps_its_cadence_unless_half_a_round_or_more_late(
    now: float, due: float | None, ends: float
) -> None:
    assert round_end(now, due, 120.0) == pytest.approx(ends)


@pytest.mark.parametrize(
    ("now", "ends"),
    [
        (99.97, 220.0),  # within the lead before its due time: the cadence holds
        (100.2, 220.0),  # late, as without a lead
        (99.9, 219.9),  # earlier than the lead: a full round from now
    ],
)
def test_a_boundary_begun_within_the_lead_keeps_the_cadence(now: float, ends: float) -> None:
    assert round_end(now, 100.0, 120.0, lead=0.05) == pytest.approx(ends)
