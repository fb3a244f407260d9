"""Admission by what a request carries: among the agents' requests, those someone waits on (a
report, a registration, a plain poll) are admitted before the long polls that report nothing,
which are held anyway once read; a line below is never starved, and nothing an agent sends
gets it ahead of a user."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from api import admission
from api.admission import InFlightLimit, released
from api.agent import reports_nothing

POLL = "/v1/agent/poll"
IDLE_POLL = json.dumps({"wait_s": 10, "running": ["a"], "events": [{"seq": 1}]}).encode()
REPORT_POLL = json.dumps({"wait_s": 10, "reports": [{"attempt_id": "a"}]}).encode()


def _scope(path: str = POLL) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}


async def _call(app: Any, scope: dict[str, Any], body: bytes = b"") -> bytes:
    """Send one request with ``body``; what the app read of it."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _recording(order: list[str], gate: asyncio.Event) -> Any:
    """A route that notes each request (its path, and ``idle`` or ``report`` for a poll's
    body), waits for ``gate``, and answers with the body it read; under ``/held`` it first
    gives its slot back until ``gate`` (a long poll's hold), then notes itself."""

    async def route(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        body = message.get("body", b"")
        if scope["path"].endswith("/held"):
            async with released():
                await gate.wait()
            order.append("held")
        else:
            order.append({IDLE_POLL: "idle", REPORT_POLL: "report"}.get(body, scope["path"]))
            await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return route


def _app(order: list[str], gate: asyncio.Event) -> InFlightLimit:
    return InFlightLimit(
        _recording(order, gate),
        limit=1,
        background_prefixes=("/v1/agent/",),
        idle={POLL: reports_nothing},
    )


async def _queued(app: InFlightLimit, count: int) -> None:
    """Until ``count`` requests wait for a slot of ``app``."""
    while app._slots is None or app._slots.waiting < count:
        await asyncio.sleep(0.001)


def _serve(arrivals: list[tuple[str, bytes]], pause_s: float = 0.0) -> list[str]:
    """The order in which ``arrivals`` (path, body; each queued after the one before, while a
    first agent's request holds the only slot) are admitted; ``pause_s`` after the first
    half of them queued."""
    order: list[str] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        app = _app(order, gate)
        calls = [asyncio.create_task(_call(app, _scope("/v1/agent/busy")))]
        await asyncio.sleep(0.01)
        half = len(arrivals) // 2
        for index, (path, body) in enumerate(arrivals):
            if index == half and pause_s:
                await asyncio.sleep(pause_s)
            calls.append(asyncio.create_task(_call(app, _scope(path), body)))
            await _queued(app, index + 1)
        gate.set()
        await asyncio.gather(*calls)

    asyncio.run(scenario())
    return order


def test_an_agents_report_is_admitted_before_the_long_polls_that_queued_earlier() -> None:
    order = _serve([(POLL, IDLE_POLL), (POLL, IDLE_POLL), (POLL, REPORT_POLL)])
    assert order == ["/v1/agent/busy", "report", "idle", "idle"]


def test_other_agent_requests_and_plain_polls_are_admitted_before_idle_long_polls() -> None:
    plain = json.dumps({"running": ["a"]}).encode()
    order = _serve([(POLL, IDLE_POLL), ("/v1/agent/register", b"{}"), (POLL, plain)])
    assert order == ["/v1/agent/busy", "/v1/agent/register", "/v1/agent/poll", "idle"]


def test_a_user_is_admitted_before_every_agent_whatever_it_carries() -> None:
    order = _serve([(POLL, REPORT_POLL), (POLL, IDLE_POLL), ("/v1/jobs", b"")])
    assert order == ["/v1/agent/busy", "/v1/jobs", "report", "idle"]


def test_idle_long_polls_take_turns_with_the_urgent_ones_once_they_waited_their_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "LAST_PATIENCE_S", 0.05)
    arrivals = [(POLL, IDLE_POLL), (POLL, IDLE_POLL), (POLL, REPORT_POLL), (POLL, REPORT_POLL)]
    order = _serve(arrivals, pause_s=0.1)
    assert order == ["/v1/agent/busy", "idle", "report", "idle", "report"]


def test_without_patience_passed_the_urgent_line_goes_first_whatever_its_size() -> None:
    arrivals = [(POLL, IDLE_POLL), (POLL, IDLE_POLL), (POLL, REPORT_POLL), (POLL, REPORT_POLL)]
    order = _serve(arrivals)
    assert order == ["/v1/agent/busy", "report", "report", "idle", "idle"]


def test_an_idle_long_poll_is_admitted_before_a_woken_held_polls_read() -> None:
    order: list[str] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        app = _app(order, gate)
        held = asyncio.create_task(_call(app, _scope("/v1/agent/held")))
        await asyncio.sleep(0.01)  # it holds no slot while it waits
        busy = asyncio.create_task(_call(app, _scope("/v1/agent/busy")))
        await asyncio.sleep(0.01)
        idle = asyncio.create_task(_call(app, _scope(), IDLE_POLL))
        await _queued(app, 1)
        gate.set()  # the held poll wakes and queues to read again, behind the idle one
        await asyncio.gather(held, busy, idle)

    asyncio.run(scenario())
    assert order == ["/v1/agent/busy", "idle", "held"]


def test_the_route_reads_the_body_that_admission_looked_at() -> None:
    async def scenario() -> list[bytes]:
        gate = asyncio.Event()
        gate.set()
        app = _app([], gate)
        return [await _call(app, _scope(), body) for body in (IDLE_POLL, REPORT_POLL, b"")]

    assert asyncio.run(scenario()) == [IDLE_POLL, REPORT_POLL, b""]


def test_a_body_in_parts_reaches_the_route_whole() -> None:
    async def scenario() -> bytes:
        gate = asyncio.Event()
        gate.set()
        app = _app([], gate)
        parts = [IDLE_POLL[:10], IDLE_POLL[10:]]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        await app(_scope(), receive, send)
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    assert asyncio.run(scenario()) == IDLE_POLL


@pytest.mark.parametrize(
    ("body", "idle"),
    [
        ({"wait_s": 10}, True),
        ({"wait_s": 0.5, "running": ["a"], "events": [{"seq": 1}], "logs": {"a": "x"}}, True),
        ({"wait_s": 10, "reports": [{"attempt_id": "a", "state": "checkpointed"}]}, False),
        ({"wait_s": 0}, False),
        ({"wait_s": 31}, False),
        ({"running": ["a"]}, False),
        ({"wait_s": True}, False),
        ({"wait_s": "10"}, False),
        ([1, 2], False),
    ],
)
def test_a_long_poll_that_reports_nothing_is_told_apart_by_its_body(
    body: object, idle: bool
) -> None:
    assert reports_nothing(json.dumps(body).encode()) is idle


def test_a_body_that_is_not_json_is_not_an_idle_long_poll() -> None:
    assert reports_nothing(b"{not json") is False
    assert reports_nothing(b"") is False
    assert reports_nothing(b'{"wait_s": NaN}') is False


def test_an_idle_long_poll_past_the_queue_timeout_is_shed_and_announced_like_any_other() -> None:
    announced: list[int] = []

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"].endswith("/busy"):
            await asyncio.sleep(0.2)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = InFlightLimit(
        slow,
        limit=1,
        queue_timeout_s=0.05,
        on_shed=lambda: announced.append(1),
        background_prefixes=("/v1/agent/",),
        idle={POLL: reports_nothing},
    )

    async def status(path: str, body: bytes) -> int:
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(_scope(path), receive, send)
        return statuses[0]

    async def scenario() -> list[int]:
        busy = asyncio.create_task(status("/v1/agent/busy", b""))
        await asyncio.sleep(0.01)
        idle = asyncio.create_task(status(POLL, IDLE_POLL))
        return [await busy, await idle]

    assert asyncio.run(scenario()) == [200, 503]
    assert announced == [1]
