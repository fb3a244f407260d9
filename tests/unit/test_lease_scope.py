"""A lease notification wakes the held polls of the nodes it names (all, when it names none),
and a waiter that looked at the database before a notification for it is woken at once."""

from __future__ import annotations

import asyncio

from store.lease_signal import RECENT, LeaseSignal, payload_of, scope_of


def test_a_notification_naming_nodes_wakes_only_their_waiters() -> None:
    async def scenario() -> list[bool]:
        signal = LeaseSignal()
        seen = signal.generation
        waits = [
            asyncio.create_task(signal.wait(seen, 0.3, node)) for node in ("node-a", "node-b", None)
        ]
        await asyncio.sleep(0.01)
        signal.notify("node-b,node-c")
        return list(await asyncio.gather(*waits))

    assert asyncio.run(scenario()) == [False, True, True]


def test_a_notification_naming_no_node_wakes_every_waiter() -> None:
    async def scenario() -> list[bool]:
        signal = LeaseSignal()
        seen = signal.generation
        waits = [asyncio.create_task(signal.wait(seen, 0.3, n)) for n in ("a", "b")]
        await asyncio.sleep(0.01)
        signal.notify()
        return list(await asyncio.gather(*waits))

    assert asyncio.run(scenario()) == [True, True]


def test_a_notification_missed_between_looks_counts_only_for_its_nodes() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        signal = LeaseSignal()
        seen = signal.generation
        signal.notify("b")
        other = await signal.wait(seen, 0.05, "a")
        mine = await signal.wait(seen, 5.0, "b")
        for _ in range(RECENT + 1):
            signal.notify("b")
        forgotten = await signal.wait(seen, 5.0, "a")
        return other, mine, forgotten

    assert asyncio.run(scenario()) == (False, True, True)


def test_payloads_name_the_nodes_or_everyone() -> None:
    assert payload_of(("n2", "n1", "n2")) == "n1,n2"
    assert scope_of(payload_of(("n2", "n1"))) == frozenset({"n1", "n2"})
    assert payload_of(None) == payload_of(()) == ""
    assert scope_of("") is None
    assert payload_of(tuple(f"node-{i:05d}" for i in range(1000))) == ""


def test_whether_a_notification_since_a_look_concerned_every_node() -> None:
    signal = LeaseSignal()
    seen = signal.generation
    assert not signal.everyone_since(seen), "nothing since"
    signal.notify("node-a")
    assert not signal.everyone_since(seen), "a fill of one node"
    signal.notify()
    assert signal.everyone_since(seen)
    assert not signal.everyone_since(signal.generation)
    for _ in range(RECENT + 1):
        signal.notify("node-a")
    assert signal.everyone_since(seen), "too far behind to tell: taken for every node"
