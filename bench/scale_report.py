"""Per-round figures of a ``bench/scale.py`` run, from the database, the logs and the watchers.

A round ``r >= 1`` is **due** when round ``r - 1`` ends (``rounds.ends_at`` of ``r - 1``); round
0 starts at once and has no due time. Its **lateness** is the time from its due time to the
moment its leases were committed and visible, as seen by a watcher that polls the cluster row
every 20 ms (so it includes the driver's wake-up delay and the whole materialization, with up to
20 ms of resolution). A round is **late** when

- that lateness exceeds ``late_after_s``, or
- it ran without a plan (``greedy``), or on a plan older than the one the driver asked for
  during the round before (its state version is below the version asked for): the solver
  service had from the request to the boundary to deliver and did not. The driver asks
  half-way through a round, or earlier when its plans' measured round trips need more
  (:mod:`solver_service.plan_timing`); its log line says when.

A round made from a ``previous_plan`` whose version is at least the one asked for is on time:
the cluster changed again after the request (a batch-size change, a job that finished) and
the plan for that change was not stored before the boundary (lazy re-planning asks for none),
so the boundary used that plan's column, as designed (a late plan never holds up a round).
The table counts these, and ``missed`` says how many changes the plan used had not seen.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from store.tables import PlanRow, RoundRow

DRIVER_LINE = re.compile(
    r"round (?P<index>\d+) \((?P<source>\w+)\): (?P<jobs>\d+) jobs, leases (?P<issued>\d+) issued, "
    r"(?P<extended>\d+) extended, (?P<revoked>\d+) revoked; began (?P<began>[-\d.]+) s after "
    r"due, materialized in (?P<took>[\d.]+) s"
)
ASKED_LINE = re.compile(
    r"round (?P<current>\d+): plan for round (?P<next>\d+) asked at version (?P<v>\d+)"
)
PLAN_LINE = re.compile(
    r"plan (?P<cluster>\S+)@(?P<version>\d+) round (?P<base>\d+): (?P<jobs>\d+) jobs now, "
    r"(?P<rounds>\d+) rounds, .* in (?P<solve>[\d.]+) s \(snapshot (?P<snapshot>[\d.]+) s, "
    r"store (?P<store>[\d.]+) s\)"
)


@dataclass(frozen=True, slots=True)
class PlanLog:
    """What the worker logged for one stored plan: (version, base round) -> its timings."""

    solve_s: float
    snapshot_s: float
    store_s: float


@dataclass(frozen=True, slots=True)
class RoundFigures:
    """One round. Times in seconds; ``None`` where a figure does not apply (round 0 has no
    due time; a greedy round has no plan). ``late_reasons`` is empty for an on-time round."""

    index: int
    source: str
    lateness_s: float | None
    began_after_due_s: float | None
    materialize_s: float | None
    agents_saw_s: float | None
    plan_id: int | None
    plan_version: int | None
    asked_version: int | None
    missed: int | None
    solve_s: float | None
    snapshot_s: float | None
    store_s: float | None
    plan_age_s: float | None
    issued: int
    extended: int
    revoked: int
    jobs: int
    gpus_used: int
    active_jobs: int | None
    late_reasons: tuple[str, ...]


def parse_plan_log(text: str) -> dict[tuple[int, int], PlanLog]:
    """(state version, base round) -> timings, for every plan the worker's log reports."""
    found: dict[tuple[int, int], PlanLog] = {}
    for match in PLAN_LINE.finditer(text):
        key = (int(match["version"]), int(match["base"]))
        found[key] = PlanLog(float(match["solve"]), float(match["snapshot"]), float(match["store"]))
    return found


def parse_driver_log(text: str) -> dict[int, float]:
    """Round index -> seconds the driver took to materialize it."""
    return {int(m["index"]): float(m["took"]) for m in DRIVER_LINE.finditer(text)}


def parse_asked(text: str) -> dict[int, int]:
    """Round index -> the state version its plan was asked for at, during the round before."""
    return {int(m["next"]): int(m["v"]) for m in ASKED_LINE.finditer(text)}


def round_figures(
    rounds: Sequence[RoundRow],
    plans: Mapping[int, PlanRow],
    plan_log: Mapping[tuple[int, int], PlanLog],
    materialized: Mapping[int, float],
    asked: Mapping[int, int],
    visible_at: Mapping[int, float],
    version_at: Mapping[int, int],
    agents_saw: Mapping[int, Mapping[str, float]],
    active_at: Mapping[int, int],
    gpus_of: Mapping[str, int],
    late_after_s: float,
) -> list[RoundFigures]:
    """The figures of every round in ``rounds`` (ordered by index)."""
    ends = {r.index: r.ends_at for r in rounds}
    figures = []
    for row in rounds:
        due = ends.get(row.index - 1)
        plan = plans.get(row.plan_id) if row.plan_id is not None else None
        logged = plan_log.get((plan.state_version, plan.base_round)) if plan else None
        seen = visible_at.get(row.index)
        lateness = _after(due, seen)
        saw = agents_saw.get(row.index, {})
        reasons: list[str] = []
        if lateness is not None and lateness > late_after_s:
            reasons.append(f"visible {lateness:.2f} s after due")
        if due is not None and seen is None:
            reasons.append("never seen by the watcher")
        version = plan.state_version if plan else None
        wanted = asked.get(row.index)
        if due is not None and version is None:
            reasons.append(f"no plan ({row.source})")
        elif due is not None and wanted is not None and version is not None and version < wanted:
            reasons.append(f"plan at version {version} < {wanted} asked")
        seen_version = version_at.get(row.index)
        figures.append(
            RoundFigures(
                index=row.index,
                source=row.source,
                lateness_s=lateness,
                began_after_due_s=_after(due, row.started_at.timestamp()),
                materialize_s=materialized.get(row.index),
                agents_saw_s=_after(due, max(saw.values())) if saw else None,
                plan_id=row.plan_id,
                plan_version=version,
                asked_version=wanted,
                missed=None if version is None or seen_version is None else seen_version - version,
                solve_s=plan.solve_seconds if plan else None,
                snapshot_s=logged.snapshot_s if logged else None,
                store_s=logged.store_s if logged else None,
                plan_age_s=row.plan_age_s,
                issued=row.leases_issued,
                extended=row.leases_extended,
                revoked=row.leases_revoked,
                jobs=len(row.jobs),
                gpus_used=sum(gpus_of.get(j, 0) for j in row.jobs),
                active_jobs=active_at.get(row.index),
                late_reasons=tuple(reasons),
            )
        )
    return figures


def _after(due: datetime | None, at: float | None) -> float | None:
    if due is None or at is None:
        return None
    return at - due.timestamp()


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


LOST_LINE = re.compile(r"nodes lost: (?P<nodes>[^;]+);")


def parse_lost(driver_log: str) -> int:
    """How many times the driver marked a node LOST (its ``nodes lost: a, b; ...`` lines)."""
    return sum(len(m.group("nodes").split(", ")) for m in LOST_LINE.finditer(driver_log))
