"""A job's stints on GPUs and the useful time they give: the one restore rule.

A *stint* is a stretch a job holds GPUs without a break: it starts (a start, a resume or a move
onto other GPUs) and may go on through later rounds. Each start costs the checkpoint restore
(``overhead_s``, the reference's 20 s), except for a short stretch: a start that runs no more
than its first lease less ``guard_s`` (the reference's 5 s) is not charged
(:func:`useful_seconds`). The simulator charges its stints with this rule; a shell that keeps a
lease history counts a job's received service from it with the same rule
(:func:`received_seconds`), so that the service's Gavel ranks jobs by the service they held,
not by their noisy progress reports (:mod:`shockwave.policies.gavel_family.time_fraction`).

Times are seconds on the shell's clock (simulated seconds, or Unix seconds in the service).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def useful_seconds(elapsed: float, lease: float, overhead_s: float, guard_s: float) -> float:
    """Useful seconds of a start that held its GPUs ``elapsed`` seconds of a ``lease``-second
    first lease: less the restore when it ran more than ``lease - guard_s``."""
    if elapsed > lease - guard_s:
        return max(0.0, elapsed - overhead_s)
    return elapsed


@dataclass(frozen=True, slots=True)
class Stint:
    """One stint: its time counts from ``began_s`` (a round's boundary, or the moment a fill
    started it), its first lease ended at ``first_end_s`` (extensions carry it on), and it
    ends at ``end_s`` (when it stopped, or the end of its live lease)."""

    began_s: float
    first_end_s: float
    end_s: float


def received_seconds(stints: Iterable[Stint], overhead_s: float, guard_s: float) -> float:
    """The useful seconds ``stints`` gave: each start charged by :func:`useful_seconds` over
    its first lease, the rest of the stint (its extensions) in full."""
    total = 0.0
    for stint in stints:
        first_end = min(stint.end_s, stint.first_end_s)
        first = max(0.0, first_end - stint.began_s)
        lease = max(0.0, stint.first_end_s - stint.began_s)
        total += useful_seconds(first, lease, overhead_s, guard_s)
        total += max(0.0, stint.end_s - first_end)
    return total
