"""Admission control: at most as many requests in progress as the database pool has connections.

Why: FastAPI runs every sync dependency and sync route in a thread pool (40 threads), one hop
per function, and a request's session keeps its connection between hops (from the token lookup
until the route commits, or until the session closes). With more requests in progress than
pool connections (then 10 + 20 overflow), the threads fill with requests waiting for a connection
while the requests that hold the connections wait for a thread to run their next step: every
request then stalls until the pool's 30 s checkout timeout turns some of them into 500s. 256
agents polling at once did exactly that (docs/reliability.md, "Load"). Bounding the requests in
progress by the pool's size means a request that needs a connection always finds one, so no
thread ever blocks on the pool; the requests beyond the bound wait here, on the event loop,
where waiting costs no thread and no connection.

The bound counts every HTTP request (probes and scrapes too: /readyz and /metrics use the
database). Requests wait in four lines, each in arrival order: everyone else's (users,
operators, probes: :data:`FIRST`), and the machines' (paths under ``background_prefixes``: the
agents'), which wait in three. A freed slot goes to the first of everyone else's line when it
is not empty: a thousand agents polling at a round boundary queue behind each other, never in
front of a user listing their jobs (the agents' requests still get every slot the users leave,
and users are few). Among the agents' requests, those someone waits on (:data:`SECOND`: a
report that frees a job to resume elsewhere, a registration, a plain poll) go before the long
polls that report nothing (:data:`IDLE`, told apart by ``idle``: such a poll is held anyway
once read, so its turn costs nobody a wait), and both before the held long polls that woke to
read again (:func:`released`, :data:`LAST`): a round boundary wakes every held poll at once,
and the agents' other requests (a node acknowledging what it started, reporting, asking again)
are served before that wave, which nobody waits on but the node it answers. A lower line is
never starved: once its oldest waiter has waited :data:`LAST_PATIENCE_S`, the lower lines and
:data:`SECOND` take turns, so the agents someone waits on keep at least every other slot.

A second, smaller bound: at most ``threads`` of the admitted requests run their sync part (the
route, in FastAPI's thread pool) at once; the others wait for a thread on the event loop,
holding no connection (the session checks one out on its first statement). Python runs one
thread at a time: each thread more in a busy process adds GIL hand-offs, not throughput.
docs/reliability.md, "Load": on a 2-core machine the load test's p99 was 706 ms with 10
requests in progress and 10 threads, 166 ms with 10 in progress and 2 threads, and 97 ms with 4
in progress and 2 threads (api.app bounds the requests in progress by twice the threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

import anyio.to_thread
from sqlalchemy.engine import Engine
from sqlalchemy.pool import QueuePool
from sqlmodel import Session
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.request_body import read_body, replaying

DEFAULT_LIMIT = 30
"""The bound for pools whose size is not known (not a QueuePool)."""


FIRST, SECOND, IDLE, LAST = 0, 1, 2, 3
"""The lines of :class:`Slots`, served in this order: users and operators; the agents'
requests someone waits on; the agents' long polls that report nothing (held anyway once read);
the agents' held long polls waking to read again."""
LAST_PATIENCE_S = 2.0
"""How long the oldest waiter of a line below :data:`SECOND` waits at most before the lower
lines and :data:`SECOND` take turns: a process that the agents keep saturated still answers
its held polls and reads its idle ones, and the agents' urgent requests keep every other
slot."""


class Slots:
    """A counting semaphore with lines of waiters: a slot given back goes to the oldest waiter
    of the :data:`FIRST` line, else of :data:`SECOND`, else of :data:`IDLE`, else of
    :data:`LAST`, else back to the pool; except that once the oldest waiter of :data:`IDLE` or
    :data:`LAST` has waited :data:`LAST_PATIENCE_S`, every other slot that :data:`FIRST` leaves
    goes to the longest-waiting of those two lines instead of :data:`SECOND`. Belongs to the
    event loop it is used on."""

    def __init__(self, limit: int) -> None:
        self.free = max(1, limit)
        self._lines: tuple[deque[tuple[float, asyncio.Future[None]]], ...] = (
            deque(),
            deque(),
            deque(),
            deque(),
        )
        self._lower_served = False
        """Whether the last slot handed below :data:`FIRST` went to a patient lower line
        (the next goes to :data:`SECOND`, if it has a waiter)."""

    async def acquire(self, line_index: int = SECOND) -> None:
        if self.free > 0:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line = self._lines[line_index]
        entry = (time.monotonic(), waiter)
        line.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot while being cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    line.remove(entry)
            raise

    def release(self) -> None:
        first, second, idle, last = self._lines
        order = [first, second, idle, last]
        patient = self._patient()
        if patient is not None and not (self._lower_served and second):
            order = [first, patient, second, idle, last]
        for line in order:
            while line:
                _, waiter = line.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    if line is not first:
                        self._lower_served = line is patient
                    return
        self.free += 1

    def _patient(self) -> deque[tuple[float, asyncio.Future[None]]] | None:
        """The line below :data:`SECOND` whose oldest waiter has waited longest, once that is
        more than :data:`LAST_PATIENCE_S`; None when neither has waited so long."""
        _, _, idle, last = self._lines
        waiting = [line for line in (idle, last) if line]
        if not waiting:
            return None
        oldest = min(waiting, key=lambda line: line[0][0])
        return oldest if time.monotonic() - oldest[0][0] > LAST_PATIENCE_S else None

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines)


class _Slot:
    """One request's place among those in progress; given back at most once per take.
    ``line``: the line it waits in (:class:`Slots`)."""

    def __init__(self, slots: Slots, line: int = FIRST) -> None:
        self._slots = slots
        self.line = line
        self.held = False

    async def take(self, line: int | None = None) -> None:
        await self._slots.acquire(self.line if line is None else line)
        self.held = True

    def give(self) -> None:
        if self.held:
            self.held = False
            self._slots.release()


_SLOT: ContextVar[_Slot | None] = ContextVar("admission_slot", default=None)


@asynccontextmanager
async def released() -> AsyncIterator[None]:
    """Give the current request's slot back for the duration, and wait for one again after,
    in the :data:`LAST` line: a request that waits for news (a long poll, ``POST
    /v1/agent/poll`` with ``wait_s``) holds no connection and no thread meanwhile, and must not
    keep others out, nor, when news wakes every held poll at once, get ahead of the requests
    that arrived meanwhile. A no-op outside :class:`InFlightLimit`."""
    slot = _SLOT.get()
    if slot is None or not slot.held:
        yield
        return
    slot.give()
    try:
        yield
    finally:
        await slot.take(LAST)


async def close_session(session: Session) -> None:
    """Close ``session``: one holding a connection rolls back and returns it to the pool, in a
    thread that does not count against the request threads' bound (``threads``): a route that
    failed inside its transaction (a 409 under a job's row lock) leaves its locks to this close,
    and the requests waiting on those locks may be holding every request thread. Waiting for
    one of them to close would wait forever (the distributed replay hung so). A session with no
    transaction closes here, on the loop."""
    if not session.in_transaction():
        session.close()
        return
    await anyio.to_thread.run_sync(session.close, limiter=anyio.CapacityLimiter(1))


def pool_capacity(engine: Engine) -> int:
    """How many connections ``engine``'s pool hands out at most (size + overflow)."""
    pool = engine.pool
    if isinstance(pool, QueuePool):
        overflow = int(getattr(pool, "_max_overflow", 0))
        return pool.size() + max(0, overflow)
    return DEFAULT_LIMIT


class InFlightLimit:
    """Pure ASGI middleware: at most ``limit`` HTTP requests in progress at once, and (when
    ``threads`` is given) at most ``threads`` threads running their sync parts. Paths in
    ``exempt`` (long-lived streams, whose reads take the thread pool briefly; static pages)
    and paths under ``exempt_prefixes`` (static files) take no slot: they use no database
    connection, and a client that requests a large file and never reads it must not hold a
    slot while the server waits to send it. A request that waited more than
    ``queue_timeout_s`` for its slot is answered 503 at once, and ``on_shed`` called (the app
    announces the overload: the node reaper then holds off). ``idle``: for a path of the
    machines' (``background_prefixes``), whether a request's body says it carries nothing
    anyone waits on (an agent's long poll that reports nothing): it waits in the :data:`IDLE`
    line. Only paths in ``idle`` have their body looked at here (it is read whole already,
    :class:`api.app.BodyLimitMiddleware`, and handed on as it came:
    :mod:`api.request_body`); a client gone before its body came is not answered.

    The semaphore and the thread limiter belong to the event loop they were made on (an ASGI
    test client may run each request on a loop of its own); a new loop gets new ones."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        threads: int | None = None,
        exempt: tuple[str, ...] = (),
        exempt_prefixes: tuple[str, ...] = (),
        queue_timeout_s: float | None = None,
        on_shed: Callable[[], None] = lambda: None,
        background_prefixes: tuple[str, ...] = (),
        idle: Mapping[str, Callable[[bytes], bool]] | None = None,
    ) -> None:
        self.app = app
        self.background_prefixes = background_prefixes
        self.idle = dict(idle or {})
        self.exempt = exempt
        self.exempt_prefixes = exempt_prefixes
        self.queue_timeout_s = queue_timeout_s
        self.on_shed = on_shed
        self.limit = max(1, limit)
        self.threads = None if threads is None else max(1, threads)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: Slots | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.exempt or path.startswith(self.exempt_prefixes):
            await self.app(scope, receive, send)
            return
        background = bool(self.background_prefixes) and path.startswith(self.background_prefixes)
        line = SECOND if background else FIRST
        says_nothing = self.idle.get(path) if background else None
        if says_nothing is not None:
            body = await read_body(receive)
            if body is None:  # the client went away: nothing to answer
                return
            receive = replaying(body, receive)
            if says_nothing(body):
                line = IDLE
        slot = _Slot(self._semaphore(), line)
        queued = time.monotonic()
        await slot.take()
        waited = time.monotonic() - queued
        if self.queue_timeout_s is not None and waited > self.queue_timeout_s:
            slot.give()
            self.on_shed()
            await _shed(scope, receive, send, waited)
            return
        token = _SLOT.set(slot)
        try:
            await self.app(scope, receive, send)
        finally:
            _SLOT.reset(token)
            slot.give()

    def _semaphore(self) -> Slots:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._loop, self._slots = loop, Slots(self.limit)
            if self.threads is not None:
                anyio.to_thread.current_default_thread_limiter().total_tokens = self.threads
        return self._slots


ARRIVED_AT = "arrived_at"
"""The key of a request's arrival time (seconds since the epoch) in its scope's state."""


class ArrivalStamp:
    """Pure ASGI middleware, outermost: stamps each HTTP request with when it reached the
    process (``scope["state"]["arrived_at"]``), before it waits for admission or a thread. An
    agent's contact counts from then (:func:`arrived_at`): a node's liveness is judged by
    when it spoke, not by how long the server took to listen."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVED_AT] = time.time()
        await self.app(scope, receive, send)


def arrived_at(scope: Scope) -> datetime:
    """When the request of ``scope`` reached the process (now, outside :class:`ArrivalStamp`)."""
    stamp = scope.get("state", {}).get(ARRIVED_AT)
    return datetime.fromtimestamp(stamp if stamp is not None else time.time(), UTC)


async def _shed(scope: Scope, receive: Receive, send: Send, waited: float) -> None:
    """Answer a request that waited longer than ``queue_timeout_s`` for a slot: a 503 problem
    with Retry-After, at the cost of a few hundred microseconds and no connection or thread.
    Its client has most likely given up, and serving it would only make every request behind
    it older (an overloaded server then works on dead requests while their clients' retries
    queue up behind them)."""
    body = {
        "type": "https://shockwave.dev/problems/overloaded",
        "title": "Overloaded",
        "status": 503,
        "detail": f"the request waited {waited:.1f} s for the server; try again",
        "instance": scope.get("path", ""),
    }
    response = JSONResponse(
        body, status_code=503, media_type="application/problem+json", headers={"Retry-After": "1"}
    )
    await response(scope, receive, send)
