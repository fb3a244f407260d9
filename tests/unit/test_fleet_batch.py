"""A simulated node batches its jobs' events into its polls: one progress event per attempt
waits at a time (the latest epoch), scaling events keep their place and order."""

from __future__ import annotations

from shockwave_fleet.fleet import Node


def progress(attempt: str, seq: int, epoch: int) -> dict[str, object]:
    return {"attempt_id": attempt, "seq": seq, "kind": "progress", "epoch": epoch}


def test_a_newer_progress_event_replaces_the_one_waiting_for_its_attempt() -> None:
    node = Node("token")
    node.queue_event(progress("a", 1, 1))
    node.queue_event(progress("b", 1, 1))
    node.queue_event(progress("a", 2, 2))
    assert [(e["attempt_id"], e["epoch"]) for e in node.events] == [("a", 2), ("b", 1)]


def test_a_scaling_event_is_never_replaced_nor_jumped() -> None:
    node = Node("token")
    node.queue_event(progress("a", 1, 1))
    scaling = {"attempt_id": "a", "seq": 2, "kind": "scaling", "epoch": 1, "batch_size": 64}
    node.queue_event(scaling)
    node.queue_event(progress("a", 3, 2))
    node.queue_event(progress("a", 4, 3))
    assert [(e["kind"], e["seq"]) for e in node.events] == [
        ("progress", 1),
        ("scaling", 2),
        ("progress", 4),
    ]
