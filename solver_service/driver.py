"""The round driver: the clock of the cluster. It turns plans into leases, one round at a time.

Each :meth:`RoundDriver.step` does what is due at ``now``, in order:

1. Lead or stand by. On Postgres exactly one driver is active: it holds a session-level
   advisory lock (``pg_try_advisory_lock``) on a dedicated connection for as long as it runs.
   Any other instance stands by, trying the lock every step; when the active one dies its
   connection closes, Postgres releases the lock, and a standby takes over at its next step
   (``tick_s``, well within a round). On SQLite (the embedded deployment, one process) there
   is no lock: the process runs one driver.
2. Mark nodes LOST whose last heartbeat is older than ``node_ttl_s``; their jobs go back to
   the queue and a plan is requested at the cluster's new version. Silence is measured on
   the servers' answering clock (:func:`solver_service.leases.mark_lost_nodes`), and not at
   all for a TTL after the database was away or an API process said it shed requests
   (:meth:`RoundDriver.servers_overloaded`): a server that could not answer never declares
   the nodes it did not answer LOST.
3. At the round boundary (the current round's end, or at once before the first round and
   after a takeover that missed one) materialize round ``current_round + 1``
   (:func:`solver_service.leases.start_round`). Rounds are never skipped: a boundary begun
   less than half a round late keeps the cadence (the round ends a round after the last one was
   due to), one begun later starts the next round now, with a full round's length
   (:func:`solver_service.leases.round_end`).
4. Between boundaries, whenever the cluster's state version moved (a job submitted, finished,
   failed or cancelled, a node joined): start waiting jobs on the free GPUs at once
   (:func:`solver_service.leases.fill_round`, work conservation), with leases to the round's end.
   The change wakes the driver's sleep (store.lease_signal: in-process, or over Postgres
   ``NOTIFY`` from the API's processes), so this happens within a step of the commit.
5. Once a round, ask for the next round's plan (``request_plan``) at the cluster's version:
   half-way through the round, or earlier when the plans' measured round trips need more
   (:mod:`solver_service.plan_timing`: at most the whole round ahead, and the whole round
   before a round trip is measured). A plan at that version
   or a later one answers it; the boundary uses the freshest plan stored by then whatever
   came (a late plan never holds up a round: the previous plan's next column, else greedy),
   and a request left unanswered moves the next ones earlier.

Time comes from the injected ``clock`` and waiting from the injected ``sleep``, so tests run
rounds of milliseconds by calling :meth:`step` with the times they choose.

Metrics (Prometheus, on the driver's own registry, ``shockwave_driver_`` prefix): rounds by
source (``plan``, ``previous_plan``, ``greedy``: the last two are fallbacks), jobs started by
mid-round fills, leases issued,
extended and revoked, nodes lost, plan requests, the plan's age at the last boundary, the solve
time and gap of the plan used, the current round and whether this instance leads, how late
the last boundary began after its due time and how long materializing each round took. The
per-round figures but the last two are stored in ``rounds`` for the API; those two are in the
log line of each round too (``bench/scale.py`` reads them from there).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import Field
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlmodel import Session

from solver_service import leases
from solver_service.leases import SLACK_S, SOURCES, LostNodes, RoundOutcome
from solver_service.plan_timing import PlanTiming
from store import lease_signal
from store.cluster_version import DEFAULT_CLUSTER, PlanRequest, ensure_cluster, no_plan_requests
from store.settings import DatabaseSettings
from store.snapshot import WITHOUT_POLICY_STATE
from store.tables import ClusterRow

log = logging.getLogger(__name__)


class DriverSettings(DatabaseSettings):
    """The database (:class:`~store.settings.DatabaseSettings`, as for the API) and the
    driver's own settings. ``round_seconds``: when set, the cluster's round length is set to it
    at start (else the cluster's own, 120 s by default). ``node_ttl_s``: a node silent for
    longer is LOST. ``tick_s``: the longest the loop sleeps between steps (a standby tries the
    lock this often)."""

    round_seconds: float | None = Field(default=None, gt=0, le=86400)
    node_ttl_s: float = Field(default=30.0, gt=0)
    tick_s: float = Field(default=0.5, gt=0, le=60)
    boundary_lead_s: float = Field(default=0.0, ge=0, le=10)
    """Seconds before a round's end that the driver begins the next round (keeping the
    cadence: the next round still ends a round after this one was due to). Materializing a
    round and the agents' polls that fetch its leases take tens of milliseconds; with a lead
    that covers them the new leases start at the boundary rather than that long after it, and
    the leases the round revokes stop that much sooner. Negligible against a 120 s round (0 by
    default); a replay at 120x, where 50 ms is 6 simulated seconds a start, sets it."""


class DriverMetrics:
    """The driver's Prometheus metrics on ``registry`` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rounds = Counter(
            "shockwave_driver_rounds",
            "Rounds started, by source: plan (fresh), previous_plan and greedy (fallbacks).",
            ["source"],
            registry=r,
        )
        self.leases = Counter(
            "shockwave_driver_leases",
            "Leases at round boundaries, by action: issued, extended, revoked.",
            ["action"],
            registry=r,
        )
        self.fills = Counter(
            "shockwave_driver_fill_jobs",
            "Jobs started between boundaries on GPUs that freed up (work conservation).",
            registry=r,
        )
        self.nodes_lost = Counter(
            "shockwave_driver_nodes_lost", "Nodes marked LOST for silence.", registry=r
        )
        self.plan_requests = Counter(
            "shockwave_driver_plan_requests",
            "Plans asked for (once a round, and on lost nodes).",
            registry=r,
        )
        self.plan_age = Gauge(
            "shockwave_driver_plan_age_seconds",
            "Age of the plan used at the last boundary (NaN when greedy).",
            registry=r,
        )
        self.plan_solve = Gauge(
            "shockwave_driver_plan_solve_seconds",
            "Solve time of the plan used at the last boundary (NaN when greedy).",
            registry=r,
        )
        self.plan_gap = Gauge(
            "shockwave_driver_plan_gap",
            "Relative gap of the plan used at the last boundary (NaN when unknown).",
            registry=r,
        )
        self.current_round = Gauge(
            "shockwave_driver_current_round", "The round whose leases are out.", registry=r
        )
        self.leader = Gauge(
            "shockwave_driver_leader", "1 while this instance is the active driver.", registry=r
        )
        self.boundary_lateness = Gauge(
            "shockwave_driver_boundary_lateness_seconds",
            "How long after its due time the last boundary began (NaN for the first round).",
            registry=r,
        )
        self.boundary_seconds = Histogram(
            "shockwave_driver_boundary_seconds",
            "Time to materialize a round (choose, place, write leases, commit).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        for source in SOURCES:
            self.rounds.labels(source)
        for action in ("issued", "extended", "revoked"):
            self.leases.labels(action)

    def observe_boundary(self, lateness_s: float | None, materialize_s: float) -> None:
        self.boundary_lateness.set(_or_nan(lateness_s))
        self.boundary_seconds.observe(materialize_s)

    def observe_round(self, outcome: RoundOutcome) -> None:
        self.rounds.labels(outcome.source).inc()
        self.leases.labels("issued").inc(outcome.issued)
        self.leases.labels("extended").inc(outcome.extended)
        self.leases.labels("revoked").inc(outcome.revoked)
        self.plan_age.set(_or_nan(outcome.plan_age_s))
        self.plan_solve.set(_or_nan(outcome.plan_solve_s))
        self.plan_gap.set(_or_nan(outcome.plan_gap))
        self.current_round.set(outcome.index)


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


class LeaderLock:
    """A Postgres session-level advisory lock on a connection of its own (no pool: closing it
    really ends the session, and with it the lock)."""

    def __init__(self, engine: Engine, key: int) -> None:
        self._engine = create_engine(engine.url, poolclass=NullPool)
        self._key = key
        self._connection: Connection | None = None
        self._held = False
        self.failed = False
        """Whether the last :meth:`hold` failed on the database (an outage, not a busy lock)."""

    @property
    def held(self) -> bool:
        return self._held

    def hold(self) -> bool:
        """Whether this instance holds the lock now: checks a held lock's connection is alive,
        else tries to take the lock."""
        try:
            if self._connection is None:
                self._connection = self._engine.connect().execution_options(
                    isolation_level="AUTOCOMMIT"
                )
            if self._held:
                self._connection.execute(text("SELECT 1"))
                return True
            taken = self._connection.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": self._key}
            ).scalar_one()
            self._held = bool(taken)
        except SQLAlchemyError as error:
            if self._held:
                log.warning("round driver: lost the leader lock's connection (%s)", error)
            self.release()
            self.failed = True
        else:
            self.failed = False
        return self._held

    def release(self) -> None:
        """Give the lock up by closing its connection."""
        connection, self._connection, self._held = self._connection, None, False
        if connection is not None:
            try:
                connection.close()
            except SQLAlchemyError as error:
                log.debug("round driver: closing the lock connection failed: %s", error)

    def close(self) -> None:
        self.release()
        self._engine.dispose()


def lock_key(cluster_id: str, schema: str | None) -> int:
    """The advisory lock's 64-bit key: one per cluster and database schema."""
    digest = hashlib.sha256(f"shockwave-round-driver:{schema or ''}:{cluster_id}".encode())
    return int.from_bytes(digest.digest()[:8], "big", signed=True)


class RoundDriver:
    """Runs the rounds of one cluster (module docstring). ``request_plan`` asks the solver
    service for a plan; ``registry`` receives the metrics (``self.metrics.registry``);
    ``leases_changed`` is called after each commit that issues or ends leases (a round, a
    fill, nodes lost): in one process with the API it wakes the agents' long polls
    (store.lease_signal); on Postgres the same commits are also announced to the API processes
    (:func:`store.lease_signal.publish`). ``sleep`` is how the loop waits: the composition
    root hands in a :class:`store.lease_signal.Wakeup`'s, woken by the changes the API
    commits."""

    def __init__(
        self,
        engine: Engine,
        settings: DriverSettings,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        timer: Callable[[], float] = time.perf_counter,
        request_plan: PlanRequest = no_plan_requests,
        cluster_id: str = DEFAULT_CLUSTER,
        registry: CollectorRegistry | None = None,
        leases_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.cluster_id = cluster_id
        self.metrics = DriverMetrics(registry)
        self._clock = clock
        self._sleep = sleep
        self._timer = timer
        self._request_plan = request_plan
        self._leases_changed = leases_changed
        self._lock: LeaderLock | None = None
        if engine.dialect.name == "postgresql":
            self._lock = LeaderLock(engine, lock_key(cluster_id, settings.database_schema))
        self._leading = False
        self._requested_round: int | None = None
        self._timing = PlanTiming()
        self._filled_version: tuple[int, int] | None = None
        self._known = leases.KnownJobs()
        """The active jobs' fields fixed at submission, read once (not every boundary)."""
        self.last_round: RoundOutcome | None = None
        self.last_fill: leases.FillOutcome | None = None
        self.last_lost: LostNodes | None = None
        self._lost_grace_until = -math.inf
        """No node is marked LOST before this time: a database outage (seen here as an error,
        or as the leader lock's connection lost) also kept the agents' heartbeats from being
        recorded, so silence is only counted from one TTL after the database is back."""

    @property
    def is_leader(self) -> bool:
        return self._leading

    def step(self, now: float) -> bool:
        """Do whatever is due at ``now``; whether anything was done (a standby does nothing)."""
        if not self._lead():
            return False
        did = False
        lost = self._mark_lost(now)
        did = lost is not None
        cluster = self._cluster()
        if _boundary_due(cluster, now, self.settings.boundary_lead_s):
            due = cluster.round_ends_at.timestamp() if cluster.round_ends_at else None
            began = self._timer()
            outcome = self._start_round(now)
            took = self._timer() - began
            lateness = None if due is None else max(0.0, now - due)
            self.metrics.observe_boundary(lateness, took)
            did = True
            log.info(
                "round %s (%s): %s jobs, leases %s issued, %s extended, %s revoked; "
                "began %s s after due, materialized in %.3f s (%s)",
                outcome.index,
                outcome.source,
                len(outcome.jobs),
                outcome.issued,
                outcome.extended,
                outcome.revoked,
                "-" if lateness is None else f"{lateness:.3f}",
                took,
                ", ".join(f"{phase} {s:.3f}" for phase, s in outcome.phases.items()),
            )
            self._settle(outcome, now)
            cluster = self._cluster()
            self._filled_version = (cluster.current_round, cluster.state_version)
        elif self._filled_version != (cluster.current_round, cluster.state_version):
            self._filled_version = (cluster.current_round, cluster.state_version)
            did = self._fill(now) or did
        ask_at = self._ask_at(cluster)
        asking = ask_at is not None and now >= ask_at - SLACK_S
        if asking and self._requested_round != cluster.current_round:
            self._requested_round = cluster.current_round
            self._timing.ask(cluster.current_round + 1, cluster.state_version, now)
            assert cluster.round_ends_at is not None
            log.info(
                "round %s: plan for round %s asked at version %s, %.1f s before its end",
                cluster.current_round,
                cluster.current_round + 1,
                cluster.state_version,
                cluster.round_ends_at.timestamp() - now,
            )
            self._ask(cluster.state_version)
            did = True
        return did

    def run(self, stop: threading.Event) -> None:
        """Step until ``stop`` is set, sleeping until the next thing is due (at most
        ``tick_s``); a database outage is logged and retried. Releases the lock at the end."""
        try:
            while not stop.is_set():
                now = self._clock()
                try:
                    self.step(now)
                    pause = self._pause(now)
                except SQLAlchemyError as error:
                    log.warning("round driver: database error, retrying: %s", error)
                    self._lost_grace_until = now + self.settings.node_ttl_s
                    pause = self.settings.tick_s
                if not stop.is_set():
                    self._sleep(pause)
        finally:
            self.close()

    def close(self) -> None:
        """Stop leading: release the lock (a standby takes over)."""
        self._set_leading(False)
        if self._lock is not None:
            self._lock.close()

    def _lead(self) -> bool:
        leading = self._lock.hold() if self._lock is not None else True
        if self._lock is not None and self._lock.failed:  # the database is away
            self._lost_grace_until = self._clock() + self.settings.node_ttl_s
        if leading and not self._leading:
            self._take_office()
        self._set_leading(leading)
        return leading

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        self.metrics.leader.set(1 if leading else 0)

    def _take_office(self) -> None:
        """On becoming the active driver: make sure the cluster exists, apply the configured
        round length, and forget what an earlier term asked for."""
        with Session(self.engine) as session:
            ensure_cluster(session, self.cluster_id)
            if self.settings.round_seconds is not None:
                cluster = session.get(ClusterRow, self.cluster_id)
                assert cluster is not None
                cluster.round_seconds = self.settings.round_seconds
                session.add(cluster)
            session.commit()
        self._requested_round = None
        self._timing = PlanTiming()
        self._filled_version = None
        log.info("round driver: active for cluster %s", self.cluster_id)

    def servers_overloaded(self) -> None:
        """An API process shed requests (it could not get to them in time): count no node's
        silence before one TTL from now, as after a database outage. Callable from any
        thread (the notification listener's)."""
        now = self._clock()
        until = now + self.settings.node_ttl_s
        if until > self._lost_grace_until:
            if self._lost_grace_until < now:  # logged when the hold begins, not each second
                log.warning("an API process is overloaded: no node is marked LOST meanwhile")
            self._lost_grace_until = until

    def _mark_lost(self, now: float) -> LostNodes | None:
        if now < self._lost_grace_until:
            return None
        with Session(self.engine) as session:
            lost = leases.mark_lost_nodes(session, self.cluster_id, now, self.settings.node_ttl_s)
        if lost is not None:
            self._announce_leases()
            self.last_lost = lost
            self.metrics.nodes_lost.inc(len(lost.nodes))
            log.warning(
                "nodes lost: %s; jobs back to the queue: %s",
                ", ".join(lost.nodes),
                ", ".join(lost.requeued) or "none",
            )
            self._ask(lost.state_version)
        return lost

    def _start_round(self, now: float) -> RoundOutcome:
        with Session(self.engine) as session:
            outcome = leases.start_round(
                session, self.cluster_id, now, self.settings.boundary_lead_s, self._known
            )
        self._announce_leases()
        self.last_round = outcome
        self.metrics.observe_round(outcome)
        return outcome

    def _settle(self, outcome: RoundOutcome, now: float) -> None:
        """Measure the round trip of the request for this round's plan (plan_timing)."""
        asked = self._timing.asked
        created = None if outcome.plan_age_s is None else now - outcome.plan_age_s
        settled = self._timing.settle(outcome.index, outcome.plan_version, created, now)
        if settled is not None and not settled[1] and asked is not None:
            log.info(
                "round %s: no plan at version %s or later stored %.1f s after it was asked "
                "(the plan used: version %s); the next ones are asked earlier",
                outcome.index,
                asked.version,
                settled[0],
                "-" if outcome.plan_version is None else outcome.plan_version,
            )

    def _fill(self, now: float) -> bool:
        # Stamped after the fill's locks are held (fill_round): an exit report may commit
        # while this step runs; never earlier than the step's own time.
        with Session(self.engine) as session:
            fill = leases.fill_round(
                session, self.cluster_id, lambda: max(now, self._clock()), self._known
            )
        if not fill.jobs:
            return False
        self._announce_leases(fill.nodes)
        self.last_fill = fill
        self.metrics.fills.inc(len(fill.jobs))
        self.metrics.leases.labels("issued").inc(fill.issued)
        log.info(
            "round %s: %s started on free GPUs (work conservation), %s leases issued",
            fill.round_index,
            ", ".join(fill.jobs),
            fill.issued,
        )
        return True

    def _cluster(self) -> ClusterRow:
        """The cluster's row without its policy state (hundreds of kB at scale, and read every
        step): detached, so the state must not be touched."""
        with Session(self.engine, expire_on_commit=False) as session:
            cluster = session.get(ClusterRow, self.cluster_id, options=WITHOUT_POLICY_STATE)
            if cluster is None:
                ensure_cluster(session, self.cluster_id)
                session.commit()
                cluster = session.get(ClusterRow, self.cluster_id, options=WITHOUT_POLICY_STATE)
            assert cluster is not None
            session.expunge(cluster)
            return cluster

    def _announce_leases(self, nodes: tuple[str, ...] | None = None) -> None:
        """After a commit that issued or ended leases: wake the held polls of this process
        (``leases_changed``) and, on Postgres, of the API processes (store.lease_signal):
        those of ``nodes`` only, when the commit changed no other node's leases (a fill),
        else every one."""
        payload = lease_signal.payload_of(nodes)
        lease_signal.publish(self.engine, lease_signal.LEASES, payload)
        self._leases_changed()

    def _ask(self, state_version: int) -> None:
        self.metrics.plan_requests.inc()
        try:
            self._request_plan(self.cluster_id, state_version)
        except Exception:
            log.exception("plan request %s@%s failed", self.cluster_id, state_version)

    def _pause(self, now: float) -> float:
        """Seconds until the next thing is due, at most ``tick_s`` (a standby: ``tick_s``)."""
        if not self._leading:
            return self.settings.tick_s
        cluster = self._cluster()
        due = [self.settings.tick_s]
        if cluster.round_ends_at is not None and cluster.round_started_at is not None:
            ends = cluster.round_ends_at.timestamp()
            due.append(ends - self.settings.boundary_lead_s - now)
            ask_at = self._ask_at(cluster)
            if self._requested_round != cluster.current_round and ask_at is not None:
                due.append(ask_at - now)
        return max(0.001, min(due))

    def _ask_at(self, cluster: ClusterRow) -> float | None:
        """When to ask for the next round's plan (plan_timing); None before the first round."""
        if cluster.round_started_at is None or cluster.round_ends_at is None:
            return None
        return self._timing.ask_at(
            cluster.round_started_at.timestamp(),
            cluster.round_ends_at.timestamp(),
            self.settings.boundary_lead_s,
        )


def _boundary_due(cluster: ClusterRow, now: float, lead: float = 0.0) -> bool:
    ends = cluster.round_ends_at
    return ends is None or now >= ends.timestamp() - SLACK_S - lead
