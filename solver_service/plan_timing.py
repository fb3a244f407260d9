"""When the round driver asks for the next round's plan: early enough for the plans it measured.

A round's plan request is answered when a plan made at the version asked, or a later one, is
stored (:mod:`solver_service.planning` tags a plan with the version its snapshot read). The
driver asks half-way through the round, or earlier where the plans take longer: ``lead_s``
before the round's end, with

    lead_s = min(round, max(round / 2, boundary_lead + TRIP_FACTOR * trip))

where ``round`` is the round's span from its start (a boundary lead begins it that early) to its
end, and ``trip`` is the longest of the last :data:`TRIPS_KEPT` round trips, each from the
request to the ``created_at`` of the plan the next boundary used (stamped as its store begins,
with the cluster row held) when that plan answers it, or to the boundary when none did (a lower
bound: the plan came later, or never). So a service whose snapshot, solve and store take a
quarter of a round or more asks that much earlier, and one whose plans take a second asks half-
way. A driver that has measured nothing yet (it has just started or taken office) asks at the
round's start: the first plan may come from a worker that has read no job's spec yet (a cold
snapshot takes several times a warm one). The round's start is the earliest: a plan asked before
the boundary would not see the round's own leases.

Times are the driver's clock and the plan's ``created_at`` (the worker's clock): the same
wall clock on one machine, and clocks kept in step by NTP across machines (a skew adds to the
trip or takes from it, and the factor covers a skew far below a second). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections import deque

TRIP_FACTOR = 2.0
"""How many measured round trips ahead of the boundary a plan is asked for: the margin for a
plan slower than the last few (a busier machine, a round with more changes to read)."""
TRIPS_KEPT = 3
"""How many rounds' trips the lead follows (the longest of them): one slow round moves the
request earlier for this many rounds."""


@dataclasses.dataclass(frozen=True, slots=True)
class PlanAsk:
    """A plan request: for round ``round_index``, at state version ``version``, at time ``at``."""

    round_index: int
    version: int
    at: float


class PlanTiming:
    """The driver's plan requests and their measured round trips (module docstring)."""

    def __init__(self) -> None:
        self._trips: deque[float] = deque(maxlen=TRIPS_KEPT)
        self.asked: PlanAsk | None = None

    @property
    def trip_s(self) -> float | None:
        """The longest recent round trip, None before one was measured."""
        return max(self._trips, default=None)

    def lead_s(self, round_s: float, boundary_lead_s: float = 0.0) -> float:
        """Seconds before a round's end to ask for the next round's plan (the whole round
        before a round trip is measured)."""
        trip = self.trip_s
        if trip is None:
            return round_s
        return min(round_s, max(round_s / 2, boundary_lead_s + TRIP_FACTOR * trip))

    def ask_at(self, started: float, ends: float, boundary_lead_s: float = 0.0) -> float:
        """When to ask for the plan of the round after the one from ``started`` to ``ends``."""
        return max(started, ends - self.lead_s(ends - started, boundary_lead_s))

    def ask(self, round_index: int, version: int, at: float) -> None:
        """Record the request for round ``round_index``'s plan at ``version``, made at ``at``."""
        self.asked = PlanAsk(round_index, version, at)

    def settle(
        self, round_index: int, plan_version: int | None, plan_created: float | None, at: float
    ) -> tuple[float, bool] | None:
        """At the boundary of round ``round_index``, begun at ``at``, which used the plan made
        at ``plan_version`` and created at ``plan_created`` (None, None: no plan): the round
        trip of that round's request, kept for the lead, and whether the plan answered it (a
        plan older than the version asked did not); None when the round was not asked for."""
        asked = self.asked
        if asked is None or asked.round_index != round_index:
            return None
        self.asked = None
        answered = plan_version is not None and plan_version >= asked.version
        end = plan_created if answered and plan_created is not None else at
        trip = max(0.0, end - asked.at)
        self._trips.append(trip)
        return trip, answered
