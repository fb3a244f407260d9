"""Simulated node agents and training programs, on one asyncio loop: the fleet that
``shockwave replay`` (:mod:`shockwave_cli.runtime.replay`) and ``bench/scale.py`` run against the
service.

Each node is one coroutine speaking the agent protocol of ``agent/loop.py``: every ``poll_s``
one ``POST /v1/agent/poll`` carrying the reports owed (``checkpointed`` for an attempt no
longer leased or listed in ``stop``, ``exited 0`` for one whose job is done), the attempts it
runs, a heartbeat every ``heartbeat_s``, and asking for job tokens for new leases; when it
started something or owed reports, a second poll at once acknowledges the new attempts (no
heartbeat; with long polls the next long poll acknowledges them and carries those reports, and
only a job's exit is reported in a poll of its own, at once). Extensions need no report: an
attempt listed in ``running`` is RUNNING. A node that knows the round's end (``round_ends_at``)
polls again just after it (``boundary_lag_s``), as an agent whose lease ends then would, so a
new round's leases start without a poll interval's delay; while a poll answer still names the
round that has ended (the driver is materializing the next one), it polls again every
``boundary_retry_s`` for at most one poll interval: the real agent polls every second
(``AgentConfig.poll_interval_s``), which at 120x is 8 ms of wall time, and the fleet keeps that
pace only where it decides when a new round's leases start.

Instead of a process, each attempt "trains" at the job's true pace from the reference
trajectory, in a coroutine of the node's own (a training process does not wait for its
agent): every ``epoch_seconds[batch size]`` of leased wall time it posts a progress event with
the job token of its attempt (as the SDK would), a scaling event when the trajectory enters a
new regime, and, once the job's epochs are done, leaves ``exited 0`` for the agent to report.
A started attempt first spends ``restart_s`` restoring its checkpoint (nothing is trained; with
``restore_guard_s``, the simulator's rule, not for a short final stretch), and
no attempt trains more than ``lease_slack_s`` past its lease's ``ends_at`` while no word has
come: what a real program loses on a restart and what it may use of a lease. The slack is the
real agent's (``AgentConfig.lease_slack_s``, scaled): a program does not stop at ``ends_at``;
its agent stops it when the revoke reaches the node, or when the slack has passed with no
word. So an attempt revoked at a boundary trains until the revoke reaches its node (at most
the slack), as a real one does. With ``restore_guard_s`` (the simulator's rule) the slack is 0
and an attempt is the simulator's: delivered at its lease's ``began_at`` however late the poll
brings it, and trained to its lease's end however early a boundary's revoke reaches it
(:meth:`Fleet.training_from`, :meth:`Fleet._settle`). An extension that comes late
continues the same attempt and is credited the time since its old end (the real agent would
have stopped an attempt whose extension came after the slack: the replay is the more lenient
there). When a job's last epoch ends (``TrainingJob.finished_at``, wall time) is computed from
the leased time, not from when the coroutine noticed.

The whole fleet shares one pool of keep-alive connections (shockwave_fleet/wire.py), so 64 nodes
cost one thread of the process. :class:`FleetLog` keeps what the agents saw: when each round first
appeared in a poll answer (per node), request latencies by kind and errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shockwave.domain.backoff import Backoff
from shockwave.domain.lifecycle import reports_per_poll
from shockwave.domain.model import Regime
from shockwave.workloads.workload import SimJob
from shockwave_fleet import wire

REQUEST_TIMEOUT_S = 10.0
REGISTER_SPACING_S = 0.01
"""The nodes start (register) spread over a poll interval, or this much apart when there are
more: a thousand agents that start together are a burst a real fleet's starts are not."""
EVENT_TRIES = 8
BUSY_RETRY_S = 0.5
"""How long a node waits before sending reports again that were answered 503 (their job was
busy: the round driver writing a boundary) or not answered."""
BUSY = 503
"""A poll's answer to a report or event on a job the server could not lock at once
(``defer_busy``): nothing was recorded, it is sent again in a later poll."""


@dataclass
class TrainingJob:
    """A submitted job as its training program sees it: its true trajectory and pace."""

    id: str
    samples_per_epoch: int
    regimes: tuple[Regime, ...]
    epoch_seconds: Mapping[int, float]
    epochs_done: int = 0
    partial_s: float = 0.0
    seq: int = 0
    token: str | None = None
    finished: bool = False
    fenced: bool = False
    trained_until: float = 0.0
    """Wall time up to which leased time has been counted (a job on two nodes trains once)."""
    finished_at: float | None = None
    """Wall time (s since the epoch) at which the last epoch ended."""
    restarts: int = 0
    spans: list[tuple[float, float]] = field(default_factory=list)
    """Wall-time spans of leased training (restores excluded), merged when contiguous."""
    accepted: list[int] = field(default_factory=list)
    """The ``seq`` of every event the API accepted (2xx), in the order posted."""
    undelivered: int = 0
    posted_epoch: int = 0
    """The last epoch whose progress event was posted."""
    posted_at: float = 0.0
    scalings: list[tuple[int, int]] = field(default_factory=list)
    """Batch-size changes not posted yet: (epoch from which, batch size)."""
    """Events given up on after ``EVENT_TRIES`` failed posts (none refused with a 409)."""

    @property
    def epochs(self) -> int:
        return sum(r.epochs for r in self.regimes)

    def seconds_left(self) -> float:
        """Wall seconds of training until the last epoch ends (what is counted so far in
        ``partial_s`` deducted)."""
        left, seen = -self.partial_s, 0
        for regime in self.regimes:
            todo = seen + regime.epochs - max(seen, self.epochs_done)
            seen += regime.epochs
            if todo > 0:
                left += todo * self.epoch_seconds[regime.batch_size]
        return max(0.0, left)

    def batch_size_at(self, epoch: int) -> int:
        """The batch size of the trajectory's regime that holds 0-based ``epoch``."""
        seen = 0
        for regime in self.regimes:
            seen += regime.epochs
            if epoch < seen:
                return regime.batch_size
        return self.regimes[-1].batch_size


@dataclass
class FleetLog:
    """What the agents saw. ``round_seen``: round index -> node -> wall time (s since the
    epoch) of the first poll answer naming that round as current. ``latency``: request kind ->
    seconds of each answered request. ``errors``: (kind, status or exception) -> count."""

    round_seen: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    refused_last: bool = False
    started: dict[str, float] = field(default_factory=dict)
    """Attempt id -> wall time (s since the epoch) at which its node started it."""
    round_ends: float | None = None
    """The current round's end (wall time) as the latest poll answer named it."""
    long_polls: Counter[str] = field(default_factory=Counter)
    """Answered long polls by why they were answered (:func:`answered_for`)."""

    def saw(self, node: str, poll: Mapping[str, Any]) -> None:
        """Note a poll answer: when ``node`` first saw its round, and the round's end."""
        self.round_seen[poll["current_round"]].setdefault(node, time.time())
        ends = poll.get("round_ends_at")
        if ends:
            self.round_ends = wall_seconds(ends)

    def nodes_at(self, round_index: int) -> dict[str, float]:
        """Node -> when it first saw round ``round_index`` or a later one as current."""
        seen: dict[str, float] = {}
        for index, nodes in self.round_seen.items():
            if index >= round_index:
                for node, at in nodes.items():
                    seen[node] = min(at, seen.get(node, at))
        return seen


@dataclass
class Attempt:
    """One started lease: ``ends_at`` as the server wrote it, ``ends_t`` the same in wall
    seconds, ``started_t`` when training may begin (after the restart's restore)."""

    attempt_id: str
    job_id: str
    ends_at: str
    started_t: float
    ends_t: float = math.inf
    revoked: bool = False
    """Told to stop before its lease's end, and training on to it (the simulator's rule:
    :meth:`Fleet._settle`)."""


class Bell:
    """A node's wake-up call (a report is owed): ``set``, ``clear`` and ``is_set`` as an
    :class:`asyncio.Event`'s, and rung into the naps that wait on it (:meth:`Fleet._nap`)
    without a task a wait: a thousand nodes' reporters wait on theirs all the time."""

    def __init__(self) -> None:
        self._set = False
        self.nappers: set[asyncio.Future[None]] = set()

    def set(self) -> None:
        self._set = True
        for future in self.nappers:
            _wake(future)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


@dataclass
class Node:
    """One agent's state: its token, the attempts it runs, those that ended here (never
    started again), and the reports it owes, in order."""

    token: str
    name: str | None = None
    """The node's id when an admin acts for it (sent in each poll), else None."""
    attempts: dict[str, Attempt] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    training: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the node's jobs are advanced (by its trainer or before a poll's changes)."""
    wake: Bell = field(default_factory=Bell)
    """Set when a report is owed: the node polls at once (an agent notices a process exit)."""
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a poll carries the outbox (reports leave in order, once)."""
    seen_round: int | None = None
    """The round the node's last poll answer named."""
    reports_max: int = 8
    """The most reports one poll may carry (``reports_per_poll`` of the node's GPUs)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Job events its attempts left for the node's next poll (:attr:`Fleet.batch_events`)."""
    attempt_of: dict[str, str] = field(default_factory=dict)
    """Job id -> the attempt of it this node runs (where its events are batched)."""

    def queue_event(self, event: dict[str, Any]) -> None:
        """Leave ``event`` for the next poll. A progress event replaces its attempt's progress
        event still waiting there when nothing of that attempt came after it: the job's
        latest epoch is what the planner reads, so a node sends one progress event per job
        per poll however short the epochs (the seq skipped is never used)."""
        for index in range(len(self.events) - 1, -1, -1):
            waiting = self.events[index]
            if waiting["attempt_id"] != event["attempt_id"]:
                continue
            if waiting["kind"] == "progress" == event["kind"]:
                self.events[index] = event
                return
            break
        self.events.append(event)

    def end(self, attempt_id: str, report: dict[str, Any] | None, *, at_once: bool = True) -> None:
        """The attempt's process is gone: never start it again, and owe ``report`` on it (none
        for one whose events were refused: it was fenced, its lease is gone already).
        ``at_once``: the node polls at once to deliver it (a job's exit, which frees GPUs the
        driver may fill); else it rides in the node's next poll (an attempt the server told
        to stop: the poll that follows the answer carries it)."""
        ended = self.attempts.pop(attempt_id)
        if self.attempt_of.get(ended.job_id) == attempt_id:
            del self.attempt_of[ended.job_id]
        self.ended.add(attempt_id)
        if report is not None:
            self.outbox.append({"attempt_id": attempt_id, **report})
            if at_once:
                self.wake.set()


class Fleet:
    """``nodes``: node id -> (agent token, GPUs). ``jobs``: job id -> its training program."""

    def __init__(
        self,
        base_urls: Sequence[str],
        nodes: Mapping[str, tuple[str, int]],
        jobs: dict[str, TrainingJob],
        *,
        poll_s: float,
        heartbeat_s: float,
        restart_s: float = 0.0,
        boundary_lag_s: float | None = None,
        boundary_retry_s: float | None = None,
        admin_token: str | None = None,
        report_s: float = 0.0,
        wait_s: float | None = None,
        lease_slack_s: float = 0.0,
        restore_guard_s: float | None = None,
        batch_events: bool = False,
    ) -> None:
        self.base_urls = tuple(base_urls)
        self.nodes = dict(nodes)
        self.jobs = jobs
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.restart_s = restart_s
        self.boundary_lag_s = boundary_lag_s
        self.boundary_retry_s = boundary_retry_s
        self.admin_token = admin_token
        self.report_s = report_s
        """Nodes whose token is this one are acted for by an admin (they name themselves)."""
        self.wait_s = wait_s
        """Long polls: each poll asks the server to hold its answer up to this long while
        nothing is new for the node (``wait_s``, ``seen_round``), carrying the reports owed;
        a job's exit is reported in a poll of its own, at once. None: plain polls every
        ``poll_s`` (and the boundary polls)."""
        self.lease_slack_s = lease_slack_s
        """Wall seconds an attempt trains past its lease's end while no word of an extension
        has come (the real agent's ``lease_slack_s``, scaled by the caller)."""
        self.restore_guard_s = restore_guard_s
        """None: every started attempt restores for ``restart_s``. A number (wall seconds):
        the simulator's rule (docs/simulator.md, step 6; the reference's): an attempt whose job
        needs at most its lease's time left less this many seconds to finish starts without
        the restore (a short final stretch is not charged), so the replay and the simulator
        charge the same workload model and differ only in the scheduling."""
        self.batch_events = batch_events
        """Each attempt's job events go in its node's polls (``events``), not in a request of
        their own with the attempt's job token: a node's jobs cost its one request."""
        self.log = FleetLog()
        self.registered: set[str] = set()
        self._clients: list[wire.Client] = []
        self._sleepers: dict[asyncio.Event, set[asyncio.Future[None]]] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run every node (register, then poll) until ``stop`` is set."""
        self._clients = [wire.Client(url, REQUEST_TIMEOUT_S) for url in self.base_urls]
        try:
            await asyncio.gather(
                *(self._node(n, t, i, stop) for i, (n, (t, _)) in enumerate(self.nodes.items()))
            )
        finally:
            for client in self._clients:
                await client.aclose()
            self._clients = []

    async def _nap(self, stop: asyncio.Event, seconds: float, bell: Bell | None = None) -> None:
        """Sleep ``seconds``, or until ``stop`` is set or ``bell`` rings: one future and one
        timer a nap, every nap of a fleet woken by one waiter on ``stop``
        (:meth:`_sleepers_of`); a task a wait, and an entry in ``stop``'s waiters each, were
        a large share of a thousand nodes' CPU."""
        if stop.is_set() or (bell is not None and bell.is_set()):
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(max(0.0, seconds), _wake, future)
        await self._await_unless_stopped(stop, future, bell)
        timer.cancel()

    async def _until_done(self, stop: asyncio.Event, task: asyncio.Task[Any]) -> None:
        """Wait until ``task`` is done or ``stop`` is set."""
        if stop.is_set() or task.done():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task.add_done_callback(lambda _: _wake(future))
        await self._await_unless_stopped(stop, future)

    async def _await_unless_stopped(
        self, stop: asyncio.Event, future: asyncio.Future[None], bell: Bell | None = None
    ) -> None:
        sleepers = self._sleepers_of(stop)
        sleepers.add(future)
        if bell is not None:
            bell.nappers.add(future)
        try:
            await future
        finally:
            sleepers.discard(future)
            if bell is not None:
                bell.nappers.discard(future)

    def _sleepers_of(self, stop: asyncio.Event) -> set[asyncio.Future[None]]:
        """The naps that ``stop`` ends, watched by one task that wakes them all when it is
        set."""
        sleepers = self._sleepers.get(stop)
        if sleepers is None:
            sleepers = self._sleepers[stop] = set()
            watcher = asyncio.get_running_loop().create_task(_wake_all_at(stop, sleepers))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)
        return sleepers

    async def _node(self, node: str, token: str, index: int, stop: asyncio.Event) -> None:
        here = Node(token, node if token == self.admin_token else None)
        here.reports_max = reports_per_poll(self.nodes[node][1])
        loop = asyncio.get_running_loop()
        spread = max(self.poll_s, REGISTER_SPACING_S * len(self.nodes))
        await asyncio.sleep(spread * index / max(1, len(self.nodes)))
        body = {"gpus": self.nodes[node][1], "hostname": f"{node}.scale", "gpu_type": "v100"}
        if token == self.admin_token:
            body["node"] = node
        turned_away = self.backoff()
        while await self._call("register", "POST", "/v1/agent/register", token, body) is None:
            await asyncio.sleep(turned_away.failure())
        self.registered.add(node)
        training = asyncio.create_task(self._trainer(here, stop))
        if self.wait_s is not None:
            await self._long_polls(here, node, stop)
            await training
            return
        next_beat = 0.0
        while not stop.is_set():
            started = loop.time()
            beat = started >= next_beat
            boundary = math.inf
            poll = await self._poll(here, "poll", heartbeat=beat, tokens=True)
            if poll is not None:
                if beat:
                    next_beat = started + self.heartbeat_s
                self.log.saw(node, poll)
                await self._before_stop(here, poll)
                tokens = await self._tokens(here, poll)
                if self._reconcile(here, poll, tokens) or here.outbox:
                    await self._poll(here, "poll ack", heartbeat=False, tokens=False)
                ends = poll.get("round_ends_at")
                if ends:
                    boundary = self.until_boundary_poll(wall_seconds(ends) - time.time())
            pause = self.poll_s - (loop.time() - started)
            if 0.0 < boundary < pause:
                pause = boundary
            if not here.outbox:
                here.wake.clear()
            await self._nap(stop, max(0.0, pause), here.wake)
        await training

    async def _long_polls(self, here: Node, node: str, stop: asyncio.Event) -> None:
        """The node's loop with long polls: one poll after the other, each held by the server
        up to ``wait_s`` until something is new for the node, so a new round's leases and a
        mid-round fill start as soon as the driver commits them. Each long poll carries the
        reports owed; a job's exit is reported at once in a poll of its own
        (:meth:`_reporter`), as an agent reports an exit when it sees it. What a poll's answer
        started is acknowledged by the next long poll, which lists it as running and carries
        the reports on the attempts that answer stopped (the server applies both before it
        holds the poll, and answers at once when either must wait), so a round boundary
        costs a node one request. Without an answer (an error, a 503 from a server that
        shed it) the node tries again after the real agent's backoff (:meth:`backoff`)."""
        assert self.wait_s is not None
        loop = asyncio.get_running_loop()
        reporter = asyncio.create_task(self._reporter(here, stop))
        turned_away = self.backoff()
        next_beat = 0.0
        while not stop.is_set():
            started = loop.time()
            beat = started >= next_beat
            polling = asyncio.create_task(
                self._poll(here, "poll", heartbeat=beat, tokens=True, wait_s=self.wait_s)
            )
            await self._until_done(stop, polling)
            if not polling.done():
                polling.cancel()
                break
            poll = polling.result()
            if poll is None:
                await self._nap(stop, turned_away.failure())
                continue
            turned_away.reset()
            if beat:
                next_beat = started + self.heartbeat_s
            busy = deferred(poll, here)  # what it said, before the answer starts anything
            self.log.long_polls[answered_for(poll, here, busy)] += 1
            here.seen_round = poll["current_round"]
            self.log.saw(node, poll)
            acted = await self._changeover(here, poll)
            if busy:
                # answered at once because something it said must wait (a busy job: the
                # driver writing a boundary or a fill): send it again, not at once
                await self._nap(stop, BUSY_RETRY_S)
            elif acted or here.outbox:
                # the next long poll lists what started (it acknowledges it) and carries the
                # reports on what stopped: one request of the node's per boundary
                continue
            elif loop.time() - started < self.wait_s / 2:
                # answered early with nothing to start (a new round that only extends, or a
                # lease of a job this fleet does not run yet): do not spin on the server
                await self._nap(stop, self.boundary_retry_s or self.wait_s / 10)
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter

    async def _reporter(self, here: Node, stop: asyncio.Event) -> None:
        """Deliver the node's reports as soon as they are owed (a job's exit), while its long
        poll waits: a poll of its own, no heartbeat, no tokens."""
        while not stop.is_set():
            await self._nap(stop, self.heartbeat_s, here.wake)
            owed = len(here.outbox)
            await self._deliver(here)
            if not here.outbox:
                here.wake.clear()
            elif len(here.outbox) >= owed:  # answered 503 (busy) or not at all: not at once
                await self._nap(stop, BUSY_RETRY_S)

    async def _deliver(self, here: Node) -> None:
        """The node's owed reports, in a poll of their own (no heartbeat, no tokens), one
        sender at a time so that they leave in order and once."""
        async with here.sending:
            if here.outbox:
                await self._poll(here, "poll ack", heartbeat=False, tokens=False)

    def backoff(self) -> Backoff:
        """The delays between a node's failed requests: the real agent's (``agent/loop.py``:
        from half its poll interval, doubling up to ten of them, with jitter), on ``poll_s``.
        A fixed pause of ``poll_s`` brought every node a server turned away back in the same
        second, again and again, and kept an overloaded server overloaded."""
        return Backoff(base_s=self.poll_s / 2, cap_s=10 * self.poll_s)

    def until_boundary_poll(self, round_ends_in: float) -> float:
        """Seconds until the poll for the next round, given that the round a poll answer
        named ends in ``round_ends_in`` seconds (negative: it has ended and the next one is
        not out yet); inf when no such poll is due (the regular interval applies)."""
        if self.boundary_lag_s is None:
            return math.inf
        wait = round_ends_in + self.boundary_lag_s
        if wait < 0.0 and self.boundary_retry_s is not None and -wait < self.poll_s:
            return self.boundary_retry_s
        return wait

    async def _poll(
        self,
        here: Node,
        kind: str,
        *,
        heartbeat: bool,
        tokens: bool,
        wait_s: float = 0.0,
    ) -> Any:
        """One ``POST /v1/agent/poll`` with the reports owed; a report answered (applied,
        refused or unknown) leaves the outbox, one lost with the request or answered 503
        stays owed, as do those past the node's cap per poll (the next poll carries them).
        ``wait_s``: a long poll from the round the node last saw."""
        sent = here.outbox[: here.reports_max]
        events = here.events[: here.reports_max]
        # taken out now, not when answered: a long poll carrying them may be held for
        # seconds, and a report owed meanwhile goes in another poll, never these twice
        del here.outbox[: len(sent)]
        body: dict[str, Any] = {
            "heartbeat": heartbeat,
            "tokens": tokens,
            "reports": sent,
            "running": sorted(here.attempts),
            "defer_busy": True,
        }
        if events:
            body["events"] = events
        if wait_s > 0:
            body["wait_s"] = wait_s
            body["seen_round"] = here.seen_round
        if here.name is not None:
            body["node"] = here.name
        poll = await self._call(kind, "POST", "/v1/agent/poll", here.token, body, held_s=wait_s)
        if poll is None:  # not answered: owed still, first in line, in their order
            here.outbox[:0] = sent
            return None
        del here.events[: len(events)]
        # answered 503 (their job was busy): owed still, first in line, in their order
        here.outbox[:0] = [
            report
            for report, answer in zip(sent, poll["reports"], strict=False)
            if answer["status"] == BUSY
        ]
        here.events[:0] = [
            event
            for event, answer in zip(events, poll.get("events", []), strict=False)
            if answer["status"] == BUSY
        ]
        for answer in poll["reports"]:
            self.log.events[f"report {answer['status']}"] += 1
        for event, answer in zip(events, poll.get("events", []), strict=False):
            if answer["status"] != BUSY:
                self._answered(here, event, answer)
            else:
                self.log.events[f"{event['kind']} deferred"] += 1
        return poll

    def _answered(self, here: Node, event: dict[str, Any], answer: dict[str, Any]) -> None:
        """An event's answer in a poll, as :meth:`_job_event` takes a post's: accepted, or
        refused (fenced: the attempt's program stops, when that attempt is still its job's)."""
        job = self.jobs.get(here_job(here, event["attempt_id"]) or "")
        if job is None:
            return
        if answer["status"] in (200, 201):
            job.accepted.append(event["seq"])
            return
        self.log.events[f"{event['kind']} refused"] += 1
        if answer.get("stop") and here.attempt_of.get(job.id) == event["attempt_id"]:
            job.fenced = True

    async def _trainer(self, here: Node, stop: asyncio.Event) -> None:
        """The node's training processes: advance each attempt every ``poll_s``, and at the
        moment one of them finishes its last epoch (a program exits then; its agent notices at
        once), not up to ``poll_s`` later."""
        while not stop.is_set():
            await self._train(here)
            await self._nap(stop, self.next_training_step(here))

    def next_training_step(self, here: Node) -> float:
        """Seconds until the trainer should next advance ``here``'s attempts: ``poll_s``, or
        sooner when an attempt's job will finish within its lease before then."""
        now = time.time()
        wait = self.poll_s
        for attempt in here.attempts.values():
            job = self.jobs[attempt.job_id]
            if job.finished:
                continue
            if attempt.revoked:  # it stops at its lease's end
                wait = min(wait, max(0.0, attempt.ends_t - now) + 1e-4)
            since = max(job.trained_until, attempt.started_t, now)
            done = since + job.seconds_left()
            if done <= attempt.ends_t + self.lease_slack_s:
                wait = min(wait, max(0.0, done - now) + 1e-4)
        return wait

    def _stopping(self, here: Node, poll: Any) -> list[TrainingJob]:
        """The jobs of ``here``'s attempts that ``poll`` no longer leases or tells to stop."""
        leases = {lease["attempt_id"] for lease in poll["leases"]}
        stop = set(poll["stop"])
        return [
            self.jobs[attempt.job_id]
            for attempt_id, attempt in here.attempts.items()
            if attempt_id not in leases or attempt_id in stop
        ]

    async def _before_stop(self, here: Node, poll: Any) -> None:
        """Before the leases change: count the leased time, and let each attempt about to
        stop post its progress (the SDK's last report before it checkpoints)."""
        async with here.training:
            self._account(here)
            stopping = self._stopping(here, poll)
            await self._publish_all(stopping, here, force=True)

    def _reconcile(self, here: Node, poll: Any, tokens: Mapping[str, str] | None = None) -> bool:
        """Stop what is no longer leased (owing ``checkpointed``), note extensions, start what
        is new with its job token (``tokens``, :meth:`_tokens`; by default those the poll
        minted). Whether something started."""
        self._settle(here, poll)
        return self._start(here, poll, tokens)

    async def _changeover(self, here: Node, poll: Any) -> bool:
        """A poll's changes with long polls: count the leased time, start what is new at once
        (its restore, like the simulator's restart overhead, stands for the checkpoint that a
        stopping attempt on its GPUs writes meanwhile), let each attempt about to stop post
        its progress (at once, each program on its own), then stop it and note extensions.
        Whether something started."""
        tokens = await self._tokens(here, poll)
        async with here.training:
            self._account(here)
            stopping = self._stopping(here, poll)
            started = self._start(here, poll, tokens)
            await self._publish_all(stopping, here, force=True)
            self._settle(here, poll)
        return started

    def _settle(self, here: Node, poll: Any) -> None:
        """Stop what is no longer leased (owing ``checkpointed``) and note extensions. Under
        the simulator's rule (:attr:`restore_guard_s`) an attempt told to stop before its
        lease's end trains on to it and stops then (:meth:`_train`): the round driver begins
        a round a little early (its boundary lead: 75 ms, 9 simulated seconds at 120x), so
        the revokes of a boundary reach the nodes before the leases they end are over, where
        the simulator's rounds run to their boundary."""
        leases = {lease["attempt_id"]: lease for lease in poll["leases"]}
        stop = set(poll["stop"])
        now = time.time()
        for attempt_id in list(here.attempts):
            lease = leases.get(attempt_id)
            if lease is None or attempt_id in stop:
                attempt = here.attempts[attempt_id]
                if self.restore_guard_s is not None and now < attempt.ends_t:
                    attempt.revoked = True
                    continue
                here.end(attempt_id, {"state": "checkpointed"}, at_once=False)
            else:
                here.attempts[attempt_id].ends_at = lease["ends_at"]
                here.attempts[attempt_id].ends_t = wall_seconds(lease["ends_at"])

    def _new_leases(self, here: Node, poll: Any) -> dict[str, Any]:
        """Attempt id -> lease, for the leases of ``poll`` that ``here`` is to start: live, not
        told to stop, not started or ended here, of a job this fleet runs."""
        stop = set(poll["stop"])
        return {
            lease["attempt_id"]: lease
            for lease in poll["leases"]
            if lease["attempt_id"] not in here.attempts
            and lease["attempt_id"] not in stop
            and lease["attempt_id"] not in here.ended
            and lease["job_id"] in self.jobs
        }

    async def _tokens(self, here: Node, poll: Any) -> dict[str, str]:
        """The job token of each lease ``here`` is to start: the one ``poll`` minted, else
        (the answer that minted it was lost: a timeout, a dropped connection) a new one asked
        for (``POST /v1/agent/leases/{attempt}/token``, which replaces it), as the real agent
        does (``agent/loop.py``). Without it the lease would stay unstarted, and every long
        poll of the node would be answered at once for it, for the rest of the run."""
        tokens = dict(poll["tokens"])
        for attempt_id in self._new_leases(here, poll).keys() - tokens.keys():
            answer = await self._call(
                "token", "POST", f"/v1/agent/leases/{attempt_id}/token", here.token, None
            )
            if answer is not None:
                self.log.events["token asked again"] += 1
                tokens[attempt_id] = answer["token"]
        return tokens

    def _start(self, here: Node, poll: Any, tokens: Mapping[str, str] | None = None) -> bool:
        """Start each new lease with its job token (``tokens``: attempt id -> token; by default
        those the poll minted); whether any started."""
        tokens = poll["tokens"] if tokens is None else tokens
        now = time.time()
        started = False
        for attempt_id, lease in self._new_leases(here, poll).items():
            job = self.jobs[lease["job_id"]]
            token = tokens.get(attempt_id)
            if token is None:  # asked for and not answered: the next answer tries again
                continue
            job.token = token  # scoped to this attempt: an older one's is fenced
            self.log.started[attempt_id] = now
            job.fenced = False
            job.restarts += 1
            ends_t = wall_seconds(lease["ends_at"])
            here.attempts[attempt_id] = Attempt(
                attempt_id, job.id, lease["ends_at"], self.training_from(job, lease, now), ends_t
            )
            here.attempt_of[job.id] = attempt_id
            started = True
        return started

    def training_from(self, job: TrainingJob, lease: Mapping[str, Any], now: float) -> float:
        """When a lease received at ``now`` starts training: after its restore. Under the
        simulator's rule (:attr:`restore_guard_s`) the attempt is the simulator's: delivered
        at the lease's ``began_at`` (its round's boundary, or its fill's issue), its restore
        counted from then, and the time since credited at once when the poll brings it later.
        The poll takes milliseconds, which the compressed clock makes seconds (up to 14
        simulated seconds after the boundary at 120x, p95 7.6 s), and the simulator has none:
        a job rotated often lost 2 s a stint, and a short final stretch (no restore) could
        miss its end by that and take another round. Otherwise from ``now``, as a real
        agent's."""
        ends_t = wall_seconds(lease["ends_at"])
        began = lease.get("began_at")
        if self.restore_guard_s is None or began is None:
            return now + self.restore_s(job, ends_t - now)
        start = wall_seconds(began)
        return start + self.restore_s(job, ends_t - start)

    def restore_s(self, job: TrainingJob, lease_left_s: float) -> float:
        """Wall seconds a new attempt of ``job`` spends restoring, with ``lease_left_s`` of its
        lease to go: ``restart_s``, or none for a short final stretch under the simulator's
        rule (:attr:`restore_guard_s`)."""
        guard = self.restore_guard_s
        if guard is not None and job.seconds_left() <= lease_left_s - guard:
            return 0.0
        return self.restart_s

    async def _train(self, here: Node) -> None:
        """Advance every attempt's job by the leased wall time since the last call (none
        before the attempt's restore is done, none past its lease's end) and post what is
        due; a finished job's attempt owes ``exited 0``, a fenced one stops."""
        async with here.training:
            self._account(here)
            attempts = list(here.attempts.values())
            jobs = [self.jobs[attempt.job_id] for attempt in attempts]
            await self._publish_all(jobs, here)
            for attempt, job in zip(attempts, jobs, strict=True):
                if attempt.attempt_id not in here.attempts:
                    continue  # the agent stopped it meanwhile
                if job.fenced:
                    job.fenced = False  # the SDK stops the process on a 409
                    here.end(attempt.attempt_id, None)
                elif job.finished:
                    here.end(attempt.attempt_id, {"state": "exited", "exit_code": 0})
                elif attempt.revoked and time.time() >= attempt.ends_t:
                    here.end(attempt.attempt_id, {"state": "checkpointed"})

    def _account(self, here: Node) -> None:
        """Count the leased time of every attempt into its job's epochs (no request)."""
        for attempt in here.attempts.values():
            job = self.jobs[attempt.job_id]
            if job.finished:
                continue
            now = min(time.time(), attempt.ends_t + self.lease_slack_s)
            since = max(job.trained_until, attempt.started_t)
            if now > since:
                job.partial_s += now - since
                if job.spans and abs(job.spans[-1][1] - since) < 1e-9:
                    job.spans[-1] = (job.spans[-1][0], now)
                else:
                    job.spans.append((since, now))
            job.trained_until = max(job.trained_until, now)
            while not job.finished:
                batch = job.batch_size_at(job.epochs_done)
                seconds = job.epoch_seconds[batch]
                if job.partial_s < seconds:
                    break
                job.partial_s -= seconds
                job.epochs_done += 1
                if job.epochs_done >= job.epochs:
                    job.finished = True
                    job.finished_at = now - job.partial_s
                elif job.batch_size_at(job.epochs_done) != batch:
                    job.scalings.append((job.epochs_done, job.batch_size_at(job.epochs_done)))

    def _due(self, job: TrainingJob, *, force: bool) -> bool:
        """Whether :meth:`_publish` has anything to post for ``job`` now."""
        if job.token is None or job.fenced:
            return False
        if not (force or time.time() - job.posted_at >= self.report_s):
            return False
        return job.posted_epoch < job.epochs_done or bool(job.scalings)

    async def _publish_all(
        self, jobs: Sequence[TrainingJob], here: Node, *, force: bool | None = None
    ) -> None:
        """:meth:`_publish` for each of ``jobs`` (``force``: None, each job's own ``finished``)
        at once, as each program posts on its own; only those with something due are
        started: a task a job every second was most of a thousand nodes' CPU."""
        forced = [(job, job.finished if force is None else force) for job in jobs]
        due = [(job, forcing) for job, forcing in forced if self._due(job, force=forcing)]
        if len(due) == 1:
            await self._publish(due[0][0], force=due[0][1], here=here)
        elif due:
            await asyncio.gather(*(self._publish(j, force=f, here=here) for j, f in due))

    async def _publish(self, job: TrainingJob, *, force: bool, here: Node | None = None) -> None:
        """Post the job's latest finished epoch and its batch-size changes, as the SDK does,
        when ``force`` or ``report_s`` has passed since the last post (0: every epoch, each
        with its own progress event)."""
        if not self._due(job, force=force):
            return
        job.posted_at = time.time()
        first = job.epochs_done if self.report_s > 0 else job.posted_epoch + 1
        for epoch in range(max(first, job.posted_epoch + 1), job.epochs_done + 1):
            batch = job.batch_size_at(epoch - 1)
            job.seq += 1
            await self._job_event(
                job,
                {
                    "seq": job.seq,
                    "kind": "progress",
                    "epoch": epoch,
                    "samples": job.samples_per_epoch,
                    "seconds": job.epoch_seconds[batch],
                    "batch_size": batch,
                },
                here,
            )
            if job.fenced:
                return
            job.posted_epoch = epoch
            while job.scalings and job.scalings[0][0] <= epoch:
                at, following = job.scalings.pop(0)
                job.seq += 1
                await self._job_event(
                    job,
                    {"seq": job.seq, "kind": "scaling", "batch_size": following, "epoch": at},
                    here,
                )
                if job.fenced:
                    return

    async def _job_event(
        self, job: TrainingJob, event: dict[str, Any], here: Node | None = None
    ) -> None:
        """Post one event; a 409 (the attempt is fenced) stops the attempt. Any other failure
        (transport, 429, 5xx) is sent again after a backoff, in order, as the SDK's outbox
        does, up to ``EVENT_TRIES`` times; one never delivered counts in ``undelivered``."""
        assert job.token is not None
        self.log.events[event["kind"]] += 1
        batched_as = here.attempt_of.get(job.id) if here is not None else None
        if self.batch_events and here is not None and batched_as is not None:
            here.queue_event({"attempt_id": batched_as, **event})
            return
        for attempt in range(EVENT_TRIES):
            sent = job.token
            answer = await self._call(
                event["kind"], "POST", f"/v1/jobs/{job.id}/events", sent, event, refusals=(409,)
            )
            if answer is not None:
                job.accepted.append(event["seq"])
                return
            if self.log.refused_last:
                # Fenced: the attempt whose token this was is over. Only when that is still
                # the job's current attempt does the program stop: a newer attempt, started
                # on another node while this request was in flight, is not the one refused.
                job.fenced = job.fenced or job.token == sent
                self.log.events[f"{event['kind']} refused"] += 1
                return
            await asyncio.sleep(min(1.0, 0.02 * 2**attempt))
        job.undelivered += 1

    async def _call(
        self,
        kind: str,
        method: str,
        path: str,
        token: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        refusals: Sequence[int] = (),
        held_s: float = 0.0,
    ) -> Any:
        """One request; its JSON answer, or None (counted as an error unless a refusal). The
        API process is chosen by the token: each node, and each job's attempt, sticks to one.
        ``held_s``: how long the server may hold it on purpose (a long poll), on top of the
        request timeout."""
        assert self._clients
        client = self._clients[zlib.crc32(token.encode()) % len(self._clients)]
        started = time.perf_counter()
        try:
            response = await client.request(
                method,
                path,
                json=body,
                params=params,
                headers={"Authorization": f"Bearer {token}"},
                timeout_s=REQUEST_TIMEOUT_S + held_s,
            )
        except wire.TransportError as error:
            self.log.errors[(kind, type(error).__name__)] += 1
            self.log.refused_last = False
            return None
        self.log.latency[kind].append(time.perf_counter() - started)
        if response.is_success:
            return response.json()
        self.log.refused_last = response.status_code in refusals
        if not self.log.refused_last:
            self.log.errors[(kind, str(response.status_code))] += 1
        return None


def deferred(poll: Mapping[str, Any], here: Node) -> bool:
    """Whether ``poll``'s answer left something ``here`` said for a later poll (its job was
    busy): a report or an event answered 503, or an attempt the node runs whose lease is not
    RUNNING yet (its acknowledgement waits). The server answers such a long poll at once."""
    answers = [*poll.get("reports", []), *poll.get("events", [])]
    return any(answer.get("status") == BUSY for answer in answers) or any(
        lease["attempt_id"] in here.attempts and lease.get("state") in ("ISSUED", "STARTED")
        for lease in poll["leases"]
    )


def answered_for(poll: Mapping[str, Any], here: Node, busy: bool) -> str:
    """Why a long poll of ``here`` was answered: ``leases`` (a lease to start, or an attempt it
    runs to stop), ``round`` (a new round that only extends what it runs), ``busy`` (something
    it said must wait: answered at once), else ``held`` (held to its end, nothing new)."""
    leased = {lease["attempt_id"] for lease in poll["leases"]}
    stop = set(poll["stop"])
    if any(a not in leased or a in stop for a in here.attempts) or any(
        a not in here.attempts and a not in here.ended and a not in stop for a in leased
    ):
        return "leases"
    if poll["current_round"] != here.seen_round:
        return "round"
    return "busy" if busy else "held"


def here_job(here: Node, attempt_id: str) -> str | None:
    """The job of ``here``'s attempt ``attempt_id``, running or ended (None: unknown)."""
    attempt = here.attempts.get(attempt_id)
    if attempt is not None:
        return attempt.job_id
    return next((job for job, a in here.attempt_of.items() if a == attempt_id), None)


async def _wake_all_at(stop: asyncio.Event, sleepers: set[asyncio.Future[None]]) -> None:
    await stop.wait()
    for future in list(sleepers):
        _wake(future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def wall_seconds(stamp: str) -> float:
    """An API timestamp (ISO 8601 with an offset) as seconds since the epoch."""
    return datetime.fromisoformat(stamp).timestamp()


def job_body(job: SimJob, time_scale: float = 1.0) -> dict[str, Any]:
    """``POST /v1/jobs`` for a workload's job; its declared throughput (samples per second)
    ``time_scale`` times the table's, as the job runs that much faster in wall time. A job
    of a tenant names it (the replay submits as an admin); one of none goes to the default."""
    spec = job.spec
    tenant = {"tenant": spec.tenant} if spec.tenant else {}
    return {
        **tenant,
        "name": f"trace-{spec.job_id}",
        "gpus": spec.gpus,
        "epochs": spec.epochs,
        "samples_per_epoch": spec.samples_per_epoch,
        "initial_batch_size": spec.initial_batch_size,
        "mode": spec.mode.value,
        "batch_sizes": list(spec.batch_sizes),
        "throughput": {
            str(b): r * time_scale for b, r in spec.throughput.samples_per_second.items()
        },
        "budget": spec.budget,
        "model": spec.model,
    }


def training_job(job_id: str, job: SimJob, time_scale: float = 1.0) -> TrainingJob:
    """The training program of a submitted job, epochs ``time_scale`` times shorter."""
    return TrainingJob(
        id=job_id,
        samples_per_epoch=job.spec.samples_per_epoch,
        regimes=job.trajectory,
        epoch_seconds={b: s / time_scale for b, s in job.epoch_seconds.items()},
    )
