"""When the round driver asks for the next plan (solver_service.plan_timing): at the round's
start until a round trip is measured, then half-way or earlier by twice the longest recent
trip, never before the round's start; a plan older than the version asked does not answer the
request."""

from __future__ import annotations

import pytest

from solver_service.plan_timing import TRIPS_KEPT, PlanTiming


def timed(*trips: tuple[float, bool]) -> PlanTiming:
    """A timing that settled one request per ``(trip, answered)``, 30 s rounds at version 5."""
    timing = PlanTiming()
    for r, (trip, answered) in enumerate(trips, start=1):
        timing.ask(r, 5, 100.0)
        if answered:
            timing.settle(r, 5, 100.0 + trip, 130.0)
        else:
            timing.settle(r, 4, 90.0, 100.0 + trip)
    return timing


@pytest.mark.parametrize(
    ("trips", "lead", "boundary_lead", "ask_at"),
    [
        ((), 30.0, 0.0, 100.0),  # nothing measured: at the round's start
        (((1.0, True),), 15.0, 0.0, 115.0),  # a fast plan: still half-way
        (((1.0, True),), 15.0, 5.0, 115.0),  # the boundary's own lead counts too
        (((6.0, True),), 17.0, 5.0, 113.0),  # 5 + 2 x 6
        (((10.0, True),), 20.0, 0.0, 110.0),
        (((20.0, True),), 30.0, 0.0, 100.0),  # never before the round's start
        (((9.0, True), (1.0, True), (1.0, True)), 18.0, 0.0, 112.0),  # the longest recent
        (((9.0, False),), 18.0, 0.0, 112.0),  # unanswered: the time it had, a lower bound
    ],
)
def test_the_request_is_early_enough_for_the_recent_round_trips(
    trips: tuple[tuple[float, bool], ...], lead: float, boundary_lead: float, ask_at: float
) -> None:
    timing = timed(*trips)
    assert timing.lead_s(30.0, boundary_lead) == pytest.approx(lead)
    assert timing.ask_at(100.0, 130.0, boundary_lead) == pytest.approx(ask_at)


def test_a_slow_round_moves_the_request_earlier_for_the_trips_kept_only() -> None:
    timing = timed((12.0, True), *[(1.0, True)] * (TRIPS_KEPT - 1))
    assert timing.lead_s(30.0) == pytest.approx(24.0)
    timing = timed((12.0, True), *[(1.0, True)] * TRIPS_KEPT)
    assert timing.lead_s(30.0) == pytest.approx(15.0)


@pytest.mark.parametrize(
    ("plan_version", "created", "settled"),
    [
        (7, 104.0, (4.0, True)),  # the version asked
        (9, 106.0, (6.0, True)),  # a later one answers too
        (6, 101.0, (25.0, False)),  # older than asked: the trip runs to the boundary
        (None, None, (25.0, False)),  # no plan at all
        (7, 95.0, (0.0, True)),  # stored before the request (nothing changed since)
    ],
)
def test_only_a_plan_at_the_version_asked_or_later_answers(
    plan_version: int | None, created: float | None, settled: tuple[float, bool]
) -> None:
    timing = PlanTiming()
    timing.ask(3, 7, 100.0)
    assert timing.settle(3, plan_version, created, 125.0) == pytest.approx(settled)
    assert timing.trip_s == pytest.approx(settled[0])
    assert timing.asked is None


def test_a_boundary_of_a_round_not_asked_for_measures_nothing() -> None:
    timing = PlanTiming()
    assert timing.settle(1, 3, 100.0, 130.0) is None
    timing.ask(2, 3, 100.0)
    assert timing.settle(1, 3, 101.0, 130.0) is None
    assert timing.trip_s is None
    assert timing.asked is not None
