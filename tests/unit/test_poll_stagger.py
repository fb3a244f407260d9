"""A round out ahead of its due time wakes every held poll at once; each node reads it in its
turn, spread over the first half of the time left, the same turn every round."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from api.agent import STAGGER_SHARE, STAGGER_WINDOW_S, stagger_s

NOW = datetime(2099, 1, 1, tzinfo=UTC)


def test_the_nodes_turns_spread_over_the_first_half_of_the_time_left() -> None:
    due = NOW + timedelta(seconds=4.0)
    turns = [stagger_s(f"node-{i:04d}", due, NOW) for i in range(1024)]
    assert all(0.0 <= t < STAGGER_SHARE * 4.0 for t in turns)
    assert max(turns) > 0.95 * STAGGER_SHARE * 4.0 and min(turns) < 0.05 * STAGGER_SHARE * 4.0
    quarters = [sum(1 for t in turns if q * 0.5 <= t < (q + 1) * 0.5) for q in range(4)]
    assert all(200 < n < 312 for n in quarters), quarters
    assert stagger_s("node-0007", due, NOW) == turns[7], "the same turn every time"


def test_a_round_late_or_far_off_is_read_at_once() -> None:
    assert stagger_s("node-1", NOW, NOW) == 0.0
    assert stagger_s("node-1", NOW - timedelta(seconds=1), NOW) == 0.0
    far = NOW + timedelta(seconds=STAGGER_WINDOW_S + 1)
    assert stagger_s("node-1", far, NOW) == 0.0
    assert stagger_s("node-1", None, NOW) == 0.0
