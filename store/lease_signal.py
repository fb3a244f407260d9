"""Wake-up calls across threads and processes: "the leases may have changed", "the cluster
changed".

Why: an agent that waits for the next round (``POST /v1/agent/poll`` with ``wait_s``) should
get its new leases as soon as the round driver has committed them, not at its next poll; and
the driver should fill GPUs freed mid-round (a job finished, a job submitted, a node joined) as
soon as the API has committed the change, not at its next tick.

In one process (``shockwave up``: the API and the driver in threads) the driver calls
:meth:`LeaseSignal.notify` after each commit that issues or ends leases (a round boundary, a
mid-round fill) and each waiting poll, on the API's event loop, reads the leases again at once.

Across processes (the distributed deployment: API processes and ``shockwave driver``) the same
news travels over Postgres ``LISTEN``/``NOTIFY`` (docs/api.md, "Long polls", says why not Redis):

- a transaction that bumps the cluster's state version (:mod:`store.cluster_version`) sends
  :data:`CLUSTER` inside itself (:func:`announce`): Postgres delivers it when, and only if, the
  transaction commits, so the driver never wakes for data it cannot read yet;
- the driver sends :data:`LEASES` after each commit of leases (:func:`publish`);
- each process runs one :class:`Listener`: a thread on a connection of its own that hands each
  notification to a local callback (:meth:`LeaseSignal.notify` in an API process, a
  :class:`Wakeup` in the driver's).

The channels are per database schema (``NOTIFY`` is database-wide; the name is derived from
``current_schema()`` in SQL on both sides). Where there is no channel (SQLite, or the listener's
connection is down) nothing is lost but time: :attr:`LeaseSignal.live` is false, a waiting poll
then reads its leases again every ``poll_recheck_s`` (api.settings) and the driver wakes every
``tick_s``, as before.

A notification carries at most the nodes it concerns (:data:`LEASES` from a mid-round fill:
the nodes whose leases it issued, comma-separated; empty: every node, as for a round or nodes
lost): a waiter for another node sleeps on, so a fill costs a re-read per node it touched, not
one per node of the cluster. The waiter reads the database again and decides whether anything
concerns it. Shape of :class:`LeaseSignal`: a generation counter, incremented by each notify,
and the scopes of the last :data:`RECENT` notifications; a waiter passes the generation it read
before its last look at the database, so a notification for it that came in between wakes it
at once (no lost wake-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlmodel import Session

log = logging.getLogger(__name__)

LEASES = "leases"
"""The round driver committed leases (a round, a fill, nodes lost): held polls read again."""
CLUSTER = "cluster"
"""A change a plan depends on was committed (the state version moved): the driver fills."""
OVERLOAD = "overload"
"""An API process shed requests it could not get to in time (api.admission): the node
reaper counts no node's silence for a TTL after it (a server that cannot answer must not
declare the nodes it did not answer LOST)."""
KINDS = (LEASES, CLUSTER, OVERLOAD)
LISTEN_TIMEOUT_S = 0.05
"""How often the listener's thread looks up from its connection to see whether to stop: what
:meth:`Listener.stop` (an API process's shutdown) waits at most. At 0.5 s, the test suite's few
hundred Postgres app lifecycles took 110 s longer; an idle wake is one select() call."""
RECONNECT_S = 1.0
"""Pause before the listener tries its connection again after losing it."""


RECENT = 256
"""How many notifications' scopes a signal remembers: a waiter that fell further behind is
woken whatever the scopes were."""
NOTIFY_PAYLOAD_MAX = 7000
"""The longest node list a notification carries (Postgres allows 8000 bytes); longer: all."""

_Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Future[None], str | None]


def scope_of(nodes: str) -> frozenset[str] | None:
    """The nodes a notification's payload names; None (every node) for an empty one."""
    return frozenset(nodes.split(",")) if nodes else None


def payload_of(nodes: tuple[str, ...] | None) -> str:
    """The payload naming ``nodes`` (None, or too many to name: every node)."""
    text = ",".join(sorted(set(nodes))) if nodes else ""
    return text if len(text) <= NOTIFY_PAYLOAD_MAX else ""


class LeaseSignal:
    """Thread-safe notifier; :meth:`wait` is awaited on an event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._recent: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=RECENT)
        self._waiters: set[_Waiter] = set()
        self.live = False
        """Whether a :class:`Listener` feeds this signal from the other processes now (else
        only this process notifies, and waiters must also read again on a timer)."""

    @property
    def generation(self) -> int:
        """How many notifications so far; read it before looking at the database."""
        return self._generation

    def notify(self, nodes: str = "") -> None:
        """Wake the waiters for ``nodes`` (comma-separated; empty: every waiter), and those
        waiting for no node in particular (callable from any thread)."""
        scope = scope_of(nodes)
        with self._lock:
            self._generation += 1
            self._recent.append((self._generation, scope))
            waiters = {w for w in self._waiters if _concerned(scope, w[2])}
            self._waiters -= waiters
        for loop, future, _ in waiters:
            # a closed loop raises: nobody waits there any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, future)

    async def wait(self, generation: int, timeout_s: float, node: str | None = None) -> bool:
        """Until a notification later than ``generation`` that concerns ``node`` (None: any
        notification), or ``timeout_s`` seconds; whether one came."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (loop, future, node)
        with self._lock:
            if self._missed(generation, node):
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

    def everyone_since(self, generation: int) -> bool:
        """Whether a notification later than ``generation`` concerned every node (a round, or
        nodes lost: not a fill of a few); true when the remembered scopes do not reach back
        that far."""
        with self._lock:
            return self._any_since(generation, lambda scope: scope is None)

    def _missed(self, generation: int, node: str | None) -> bool:
        """Whether a notification later than ``generation`` concerned ``node`` (under the
        lock); true when the remembered scopes do not reach back that far."""
        return self._any_since(generation, lambda scope: _concerned(scope, node))

    def _any_since(
        self, generation: int, concerns: Callable[[frozenset[str] | None], bool]
    ) -> bool:
        """Whether a notification later than ``generation`` has a scope that ``concerns``
        (under the lock); true when the remembered scopes do not reach back that far."""
        if self._generation == generation:
            return False
        if not self._recent or self._recent[0][0] > generation + 1:
            return True
        return any(g > generation and concerns(scope) for g, scope in self._recent)


def _concerned(scope: frozenset[str] | None, node: str | None) -> bool:
    return scope is None or node is None or node in scope


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Wakeup:
    """A sleep that ends early when :meth:`set` is called (from any thread): the round
    driver's ``sleep``, woken when a change it should act on was committed."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def sleep(self, seconds: float) -> None:
        """Up to ``seconds``, or until :meth:`set` (then cleared)."""
        if self._event.wait(seconds):
            self._event.clear()


def _channel_sql(kind: str) -> str:
    """SQL for the channel of ``kind`` in the connection's schema (a name of 34 characters,
    under Postgres' 63, whatever the schema's length)."""
    if kind not in KINDS:
        raise ValueError(f"unknown channel {kind!r}: one of {', '.join(KINDS)}")
    return f"'shockwave_{kind}_' || left(md5(current_schema()), 12)"


def announce(session: Session, kind: str) -> None:
    """Send ``kind`` in ``session``'s transaction: delivered when it commits, dropped if it
    rolls back. Nothing on a database without channels (SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SELECT pg_notify({_channel_sql(kind)}, '')"))


def publish(engine: Engine, kind: str, payload: str = "") -> None:
    """Send ``kind`` now, with ``payload`` (:func:`payload_of`: the nodes concerned, empty for
    all), in a transaction of its own (after the caller's commit). Never raises: a
    notification that does not go out costs the listeners a recheck, no data."""
    if engine.dialect.name != "postgresql":
        return
    try:
        with engine.begin() as connection:
            connection.execute(
                text(f"SELECT pg_notify({_channel_sql(kind)}, :payload)"), {"payload": payload}
            )
    except SQLAlchemyError as error:
        log.warning("notification %s not sent (%s): listeners read again on a timer", kind, error)


class Listener:
    """Hands the notifications of ``callbacks``' channels to their callbacks (a payload, when
    one came, as the callback's one argument), from a thread on
    a Postgres connection of its own (not the pool's: it is held for as long as the process
    runs). ``on_live(bool)`` is called when the channel comes up or goes down; on both, every
    callback is called once too (news may have been missed while it was down). A lost
    connection is retried every :data:`RECONNECT_S` seconds."""

    def __init__(
        self,
        engine: Engine,
        callbacks: Mapping[str, Callable[..., None]],
        on_live: Callable[[bool], None] = lambda live: None,
    ) -> None:
        for kind in callbacks:
            _channel_sql(kind)  # refuses an unknown kind here, not in the thread
        self._engine = engine
        self._own = create_engine(engine.url, poolclass=NullPool)
        self._callbacks = dict(callbacks)
        self._on_live = on_live
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._up = threading.Event()

    @staticmethod
    def supported(engine: Engine) -> bool:
        return engine.dialect.name == "postgresql"

    @property
    def live(self) -> bool:
        """Whether the channel is up now."""
        return self._up.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shockwave-listener", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._own.dispose()

    def wait_live(self, timeout_s: float) -> bool:
        """Until the channel is up or ``timeout_s`` passed; whether it is up."""
        return self._up.wait(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                channels = self._channels()
                with self._own.connect() as connection:
                    self._listen(connection, channels)
            except (SQLAlchemyError, psycopg.Error, OSError) as error:
                if self.live:
                    log.warning("notification channel lost (%s); polling on timers", error)
                else:
                    log.debug("notification channel unavailable: %s", error)
            self._set_live(False)
            self._stop.wait(RECONNECT_S)

    def _channels(self) -> dict[str, str]:
        """Channel name -> kind, named in the schema of the engine's own connections."""
        with self._engine.connect() as connection:
            return {
                str(connection.execute(text(f"SELECT {_channel_sql(kind)}")).scalar_one()): kind
                for kind in self._callbacks
            }

    def _listen(self, connection: Connection, channels: Mapping[str, str]) -> None:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        for name in channels:
            connection.exec_driver_sql(f'LISTEN "{name}"')
        raw: Any = connection.connection.driver_connection
        self._set_live(True)
        while not self._stop.is_set():
            for note in raw.notifies(timeout=LISTEN_TIMEOUT_S):
                kind = channels.get(note.channel)
                if kind is not None and note.payload:
                    self._callbacks[kind](note.payload)
                elif kind is not None:
                    self._callbacks[kind]()

    def _set_live(self, live: bool) -> None:
        if live == self.live:
            return
        if live:
            self._up.set()
        else:
            self._up.clear()
        self._on_live(live)
        for callback in self._callbacks.values():
            callback()


class Throttled:
    """Publishes ``kind`` (:func:`publish`) at most once every ``every_s`` seconds, from a
    thread of its own (the caller, an event loop, never waits for the database). Calls in
    between are dropped: the listeners need the fact, not the count."""

    def __init__(self, engine: Engine, kind: str, every_s: float = 1.0) -> None:
        _channel_sql(kind)
        self._engine = engine
        self._kind = kind
        self._every_s = every_s
        self._lock = threading.Lock()
        self._last = -float("inf")

    def __call__(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._every_s:
                return
            self._last = now
        name = f"notify-{self._kind}"
        args = (self._engine, self._kind)
        threading.Thread(target=publish, args=args, name=name, daemon=True).start()
