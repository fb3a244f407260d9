"""An overloaded API process sheds the requests that waited too long for their turn (503,
Retry-After) instead of serving requests whose clients have given up; requests stamped with
their arrival carry it to the routes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from api import admission
from api.admission import ARRIVED_AT, ArrivalStamp, InFlightLimit, arrived_at, released


def _scope(path: str = "/v1/agent/poll") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}


async def _call(app: Any, scope: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body) if body else None


async def _slow(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.sleep(0.3)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_a_request_that_waited_past_the_queue_timeout_is_shed_with_a_503() -> None:
    app = InFlightLimit(_slow, limit=1, queue_timeout_s=0.1)

    async def scenario() -> list[tuple[int, dict[str, str], Any]]:
        return list(await asyncio.gather(_call(app, _scope()), _call(app, _scope())))

    (first, second) = asyncio.run(scenario())
    assert first[0] == 200
    status, headers, body = second
    assert (status, headers.get("retry-after")) == (503, "1")
    assert body["title"] == "Overloaded" and body["instance"] == "/v1/agent/poll"


def test_without_a_queue_timeout_every_request_waits_its_turn() -> None:
    app = InFlightLimit(_slow, limit=1)

    async def scenario() -> list[int]:
        answers = await asyncio.gather(_call(app, _scope()), _call(app, _scope()))
        return [status for status, _, _ in answers]

    assert asyncio.run(scenario()) == [200, 200]


def test_the_arrival_stamp_is_taken_before_the_request_waits() -> None:
    seen: list[float] = []

    async def route(scope: Any, receive: Any, send: Any) -> None:
        seen.append(arrived_at(scope).timestamp())
        await _slow(scope, receive, send)

    app = ArrivalStamp(InFlightLimit(route, limit=1))

    async def scenario() -> None:
        await asyncio.gather(_call(app, _scope()), _call(app, _scope()))

    began = time.time()
    asyncio.run(scenario())
    assert len(seen) == 2
    assert all(began - 0.01 <= at <= began + 0.1 for at in seen), (began, seen)
    assert ARRIVED_AT == "arrived_at"


def _gated(order: list[str], gate: asyncio.Event) -> Any:
    """A route that notes each request's path, then waits for ``gate``."""

    async def route(scope: Any, receive: Any, send: Any) -> None:
        order.append(scope["path"])
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return route


async def _queued(app: InFlightLimit, count: int) -> None:
    """Until ``count`` requests wait for a slot of ``app``."""
    while app._slots is None or app._slots.waiting < count:
        await asyncio.sleep(0.001)


def test_a_user_waiting_is_admitted_before_the_agents_that_queued_earlier() -> None:
    order: list[str] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        app = InFlightLimit(_gated(order, gate), limit=1, background_prefixes=("/v1/agent/",))
        calls = [asyncio.create_task(_call(app, _scope())) for _ in range(4)]
        await _queued(app, 3)  # one agent holds the slot, three wait in line
        calls.append(asyncio.create_task(_call(app, _scope("/v1/jobs"))))
        await _queued(app, 4)
        gate.set()
        await asyncio.gather(*calls)

    asyncio.run(scenario())
    assert order == ["/v1/agent/poll", "/v1/jobs", *["/v1/agent/poll"] * 3]


def test_a_waiter_cancelled_while_queued_gives_its_turn_to_the_next() -> None:
    order: list[str] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        app = InFlightLimit(_gated(order, gate), limit=1, background_prefixes=("/v1/agent/",))
        first = asyncio.create_task(_call(app, _scope()))
        await _queued(app, 0)
        gone = asyncio.create_task(_call(app, _scope("/v1/jobs")))
        last = asyncio.create_task(_call(app, _scope("/v1/agent/last")))
        await _queued(app, 2)
        gone.cancel()
        gate.set()
        await asyncio.gather(first, last)
        assert gone.cancelled()
        assert app._slots is not None and (app._slots.free, app._slots.waiting) == (1, 0)

    asyncio.run(scenario())
    assert order == ["/v1/agent/poll", "/v1/agent/last"]


def _holding(order: list[str], news: asyncio.Event, gate: asyncio.Event) -> Any:
    """A route that, under ``/held``, gives its slot back until ``news`` (a long poll's hold),
    then notes its path; any other path notes itself and waits for ``gate``."""

    async def route(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"].endswith("/held"):
            async with released():
                await news.wait()
            order.append(scope["path"])
        else:
            order.append(scope["path"])
            await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return route


def _wake_a_held_poll_behind_an_agents_request(patience_s: float) -> list[str]:
    """The order in which a woken held poll and an agent's request queued after it (both
    waiting while another agent's request holds the only slot) are served."""
    order: list[str] = []

    async def scenario() -> None:
        news, gate = asyncio.Event(), asyncio.Event()
        app = InFlightLimit(
            _holding(order, news, gate), limit=1, background_prefixes=("/v1/agent/",)
        )
        held = asyncio.create_task(_call(app, _scope("/v1/agent/held")))
        await asyncio.sleep(0.01)  # it holds no slot while it waits for news
        busy = asyncio.create_task(_call(app, _scope("/v1/agent/busy")))
        await asyncio.sleep(0.01)
        news.set()
        await _queued(app, 1)  # the held poll woke and waits for a slot
        await asyncio.sleep(patience_s)
        ack = asyncio.create_task(_call(app, _scope("/v1/agent/ack")))
        await _queued(app, 2)
        gate.set()
        await asyncio.gather(held, busy, ack)

    asyncio.run(scenario())
    return order


def test_a_woken_held_poll_is_served_after_the_agents_requests_that_wait() -> None:
    order = _wake_a_held_poll_behind_an_agents_request(0.0)
    assert order == ["/v1/agent/busy", "/v1/agent/ack", "/v1/agent/held"]


def test_a_woken_held_poll_goes_first_once_it_has_waited_its_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "LAST_PATIENCE_S", 0.05)
    order = _wake_a_held_poll_behind_an_agents_request(0.1)
    assert order == ["/v1/agent/busy", "/v1/agent/held", "/v1/agent/ack"]
