"""A wake-up call for long polls: "the leases may have changed", from any thread to any loop.

Why: an agent that waits for the next round (``POST /v1/agent/poll`` with ``wait_s``) should
get its new leases as soon as the round driver has committed them, not at its next poll. In
one process (``shockwave up``: the API and the driver in threads) the driver calls
:meth:`LeaseSignal.notify` after each commit that issues or ends leases (a round boundary, a
mid-round fill) and each waiting poll, on the API's event loop, reads the leases again at once.
Where the driver runs in another process nobody notifies: a waiting poll then reads again
every ``poll_recheck_s`` (api.settings), which bounds how late it learns the news.

A notification carries nothing: the waiter reads the database again and decides whether
anything concerns its node. Shape: a generation counter, incremented by each notify; a waiter
passes the generation it read before its last look at the database, so a notification that
came in between wakes it at once (no lost wake-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LeaseSignal:
    """Thread-safe notifier; :meth:`wait` is awaited on an event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    @property
    def generation(self) -> int:
        """How many notifications so far; read it before looking at the database."""
        return self._generation

    def notify(self) -> None:
        """Wake every waiter (callable from any thread)."""
        with self._lock:
            self._generation += 1
            waiters, self._waiters = self._waiters, set()
        for loop, future in waiters:
            # a closed loop raises: nobody waits there any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, future)

    async def wait(self, generation: int, timeout_s: float) -> bool:
        """Until a notification later than ``generation`` or ``timeout_s`` seconds; whether
        one came."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (loop, future)
        with self._lock:
            if self._generation != generation:
                return True
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(future, timeout=max(0.0, timeout_s))
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(waiter)
        return True


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
