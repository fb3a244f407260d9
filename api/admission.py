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
database). A request waits in arrival order.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.engine import Engine
from sqlalchemy.pool import QueuePool
from starlette.types import ASGIApp, Receive, Scope, Send

DEFAULT_LIMIT = 30
"""The bound for pools whose size is not known (not a QueuePool)."""


def pool_capacity(engine: Engine) -> int:
    """How many connections ``engine``'s pool hands out at most (size + overflow)."""
    pool = engine.pool
    if isinstance(pool, QueuePool):
        overflow = int(getattr(pool, "_max_overflow", 0))
        return pool.size() + max(0, overflow)
    return DEFAULT_LIMIT


class InFlightLimit:
    """Pure ASGI middleware: at most ``limit`` HTTP requests in progress at once.

    The semaphore belongs to the event loop it was made on (an ASGI test client may run each
    request on a loop of its own); a new loop gets a new one."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = max(1, limit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async with self._semaphore():
            await self.app(scope, receive, send)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._loop, self._slots = loop, asyncio.Semaphore(self.limit)
        return self._slots
