"""What the agent endpoints do (/v1/agent): register, heartbeat, poll leases, report status.

An agent acts only for the node its token names; another node's leases do not exist for it
(404). An admin acts for any node it names. Lease reports follow :mod:`store.leases`; a report for
an attempt that must not run (revoked, lost, its job finished) is refused with a 409 carrying
``stop: true``: attempt fencing, the agent reports what it runs and the server answers with
what must stop. Reports are idempotent: the same report twice gets the same answer.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Text, bindparam, case, cast, func, select, text, update
from sqlmodel import Session, SQLModel, col

from api.agent_schemas import (
    POLL_WAIT_MAX_S,
    AgentPoll,
    AttemptReport,
    EventAnswer,
    JobTokenPublic,
    LeasePublic,
    LeaseStatusPublic,
    LeaseStatusReport,
    NodeLeases,
    NodeRegister,
    NodeStatus,
    PollAnswer,
    ReportAnswer,
)
from shockwave.domain.lifecycle import (
    LIVE_LEASES,
    TAKEN_BACK,
    JobEffect,
    JobState,
    LeaseState,
    NodeState,
    Report,
    report_effect,
    reports_per_poll,
    transition,
)
from shockwave.domain.observed import ClientEvent
from store import boundary_gate, cluster, cluster_version, population
from store import events as store_events
from store.errors import Conflict, InvalidInput, NotFound
from store.jobs import (
    POLLED,
    POLLED_COLUMNS,
    PolledJob,
    insert_events,
    record_state,
    state_event,
    write_folded,
)
from store.leases import (
    JobLeases,
    checkpoint_dir,
    fenced_reasons,
    move_lease,
    revoke_live_leases,
    stop_running,
    successor_of,
)
from store.principals import Principal, Role, require
from store.tables import JobRow, LeaseRow, NodeRow, utcnow
from store.tokens import (
    add_attempt_tokens,
    attempts_with_tokens,
    revoke_attempt_tokens,
)

STOP_ROUNDS = 2
"""Revoked and lost attempts are listed in ``stop`` for this many rounds after the fact (a
stopped agent finds out anyway: every attempt it runs that is not a lease must stop)."""

CLUSTER = cluster_version.DEFAULT_CLUSTER

# The tables of the hot path (every agent heartbeats and polls every few seconds): its
# statements are Core, on the session's connection, without the ORM's identity map and
# unit of work (docs/reliability.md, "Load": that halved a heartbeat's CPU).
NODES = SQLModel.metadata.tables["nodes"]
CLUSTERS = SQLModel.metadata.tables["clusters"]
LEASES = SQLModel.metadata.tables["leases"]
JOBS = SQLModel.metadata.tables["jobs"]

_BEAT = (
    update(NODES)
    .where(NODES.c.id == bindparam("node"), NODES.c.state == NodeState.READY)
    .values(
        last_heartbeat_at=case(
            (NODES.c.last_heartbeat_at > bindparam("now"), NODES.c.last_heartbeat_at),
            else_=bindparam("now"),
        )
    )
    .returning(*NODES.c)
)
"""A READY node's heartbeat, stamped with when its request arrived (never moving the stamp
back: contacts may finish out of order); no row when the node is unknown or LOST."""
_ROUND = (CLUSTERS.c.current_round, CLUSTERS.c.round_ends_at, CLUSTERS.c.state_version)
_CLUSTER_ROUND = select(*_ROUND).where(CLUSTERS.c.id == CLUSTER)
_NODE_ROUND = (
    select(NODES.c.id, NODES.c.state, NODES.c.gpus, *_ROUND)
    .select_from(NODES.outerjoin(CLUSTERS, CLUSTERS.c.id == CLUSTER))
    .where(NODES.c.id == bindparam("node"))
)
"""The node (no row: unknown) and the cluster's round (NULLs before the cluster exists)."""
_BEATEN = _BEAT.cte("beat")
_BEAT_ROUND = select(_BEATEN.c.id, _BEATEN.c.state, _BEATEN.c.gpus, *_ROUND).select_from(
    _BEATEN.outerjoin(CLUSTERS, CLUSTERS.c.id == CLUSTER)
)
"""A READY node's heartbeat and the cluster's round in one round trip (Postgres: SQLite has
no ``UPDATE`` in a ``WITH``); no row when the node is unknown or LOST."""
_LEASE_COLUMNS = (
    LEASES.c.id,
    LEASES.c.round_index,
    cast(LEASES.c.gpus, Text).label("gpus"),
    LEASES.c.state,
    LEASES.c.ends_at,
    LEASES.c.began_at,
    LEASES.c.issued_at,
    JOBS.c.id.label("job_id"),
    JOBS.c.state.label("job_state"),
    JOBS.c.batch_size,
)
"""What a node's lease answer reads of each lease and its job each time: the job's launch
fields (command, image, env) never change, and each process reads them once a job
(:class:`_Launches`); the lease's GPUs as their JSON text, decoded only when the process has
not built that lease's answer yet (:class:`_LeaseAnswers`)."""


def _shown(since: Any) -> Any:
    """The leases a node is shown: live ones, and those revoked or lost since round ``since``."""
    return LEASES.c.state.in_(LIVE_LEASES) | (
        LEASES.c.state.in_(TAKEN_BACK) & (LEASES.c.round_index >= since)
    )


_NODE_LEASES = (
    select(*_LEASE_COLUMNS)
    .join(JOBS, JOBS.c.id == LEASES.c.job_id)
    .where(LEASES.c.node_id == bindparam("node"))
    .where(_shown(bindparam("since")))
    .order_by(LEASES.c.round_index, LEASES.c.id)
)
"""A node's live leases with their jobs, and its attempts revoked or lost since a round."""


def _node_view(node: Any) -> Any:
    """``node`` (the ``nodes`` table, or the heartbeat's ``UPDATE ... RETURNING``) with the
    cluster's round and the node's leases as :data:`_NODE_LEASES` reads them, in one
    statement: a row per lease, or one row with NULL lease columns for a node without any;
    no row when ``node`` has none (unknown, or the heartbeat's node not READY)."""
    since = func.coalesce(CLUSTERS.c.current_round, -1) - STOP_ROUNDS
    return (
        select(
            node.c.id.label("node_id"),
            node.c.state.label("node_state"),
            node.c.gpus.label("node_gpus"),
            *_ROUND,
            *_LEASE_COLUMNS,
        )
        .select_from(
            node.outerjoin(CLUSTERS, CLUSTERS.c.id == CLUSTER)
            .outerjoin(LEASES, (LEASES.c.node_id == node.c.id) & _shown(since))
            .outerjoin(JOBS, JOBS.c.id == LEASES.c.job_id)
        )
        .where(node.c.id == bindparam("node"))
        .order_by(LEASES.c.round_index, LEASES.c.id)
    )


_VIEW = _node_view(NODES)
"""A node's view (:func:`_node_view`) without a heartbeat."""
_BEAT_VIEW = _node_view(_BEATEN).add_columns(
    func.set_config("synchronous_commit", "off", True).label("async_commit")
)
"""A READY node's heartbeat and its view in one round trip (Postgres: SQLite has no
``UPDATE`` in a ``WITH``), its transaction set not to wait for the WAL's flush at commit
(:func:`_commit_contact`: it wrote a heartbeat only; a poll that goes on to write more rolls
it back first)."""
_LAUNCH = select(JOBS.c.id, JOBS.c.command, JOBS.c.image, JOBS.c.env).where(
    JOBS.c.id.in_(bindparam("ids", expanding=True))
)
_LOCK_JOBS = (
    select(JOBS.c.id, JOBS.c.state)
    .where(JOBS.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(JOBS.c.created_at, JOBS.c.id)
    .with_for_update()
)
"""Lock jobs in the round driver's order (arrival, then id), so a poll that locks several
waits for a boundary instead of deadlocking with it."""
_LOCK_FREE_JOBS = _LOCK_JOBS.with_for_update(skip_locked=True)
"""Lock those of the jobs that no other transaction holds, without waiting (a poll with
``defer_busy``): the others are left for a later poll."""
_LOCK_POLLED = _LOCK_JOBS.with_only_columns(*(JOBS.c[name] for name in POLLED_COLUMNS))
_LOCK_FREE_POLLED = _LOCK_FREE_JOBS.with_only_columns(*(JOBS.c[name] for name in POLLED_COLUMNS))
""":data:`_LOCK_JOBS` and :data:`_LOCK_FREE_JOBS` that read what a poll's events fold into
(:data:`store.jobs.POLLED_COLUMNS`) in the same statement: a poll with events locks and reads
its jobs once, not twice."""
_JOB_STATES = select(JOBS.c.id, JOBS.c.state).where(JOBS.c.id.in_(bindparam("ids", expanding=True)))
"""The jobs' states, read again (under the locks the poll holds already)."""
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit TO OFF")
BUSY = 503
BUSY_DETAIL = "its job is busy (a round being written); nothing was recorded: send it again"
_STARTING = (
    LEASES.c.id.in_(bindparam("ids", expanding=True)),
    LEASES.c.node_id == bindparam("node"),
    LEASES.c.state.in_((LeaseState.ISSUED, LeaseState.STARTED)),
)
"""A node's live, not yet RUNNING leases among ``ids``."""
_RUN_LEASES = (
    update(LEASES)
    .where(*_STARTING)
    .values(state=LeaseState.RUNNING, updated_at=bindparam("now"))
    .returning(LEASES.c.id, LEASES.c.job_id)
)
"""Those of :data:`_STARTING`, RUNNING (waiting for any other transaction's lock on them)."""
_RUN_FREE_LEASES = (
    update(LEASES)
    .where(LEASES.c.id.in_(select(LEASES.c.id).where(*_STARTING).with_for_update(skip_locked=True)))
    .values(state=LeaseState.RUNNING, updated_at=bindparam("now"))
    .returning(LEASES.c.id, LEASES.c.job_id)
)
"""Those of :data:`_STARTING` that no other transaction holds, RUNNING, without waiting (a
poll with ``defer_busy``): the others are acknowledged by a later poll."""
_SYNC_COMMIT = text("SET LOCAL synchronous_commit TO ON")
_RUN_JOBS = (
    update(JOBS)
    .where(JOBS.c.id.in_(bindparam("ids", expanding=True)))
    .values(state=JobState.RUNNING, updated_at=bindparam("now"))
)
_ATTEMPT = (
    select(
        LEASES.c.state,
        LEASES.c.node_id,
        LEASES.c.ends_at,
        JOBS.c.id.label("job_id"),
        JOBS.c.state.label("job_state"),
    )
    .join(JOBS, JOBS.c.id == LEASES.c.job_id)
    .where(LEASES.c.id == bindparam("attempt"))
)
"""An attempt's lease and its job's state, read without locks."""
_ATTEMPTS = (
    select(
        LEASES.c.id,
        LEASES.c.state,
        LEASES.c.node_id,
        LEASES.c.ends_at,
        JOBS.c.id.label("job_id"),
        JOBS.c.state.label("job_state"),
    )
    .join(JOBS, JOBS.c.id == LEASES.c.job_id)
    .where(LEASES.c.id.in_(bindparam("ids", expanding=True)))
)
"""Several attempts as :data:`_ATTEMPT` reads one, with their ids: one read for a poll's
reports, events and running attempts, however many (:func:`_fresh_and_named`)."""
_NOT_RUNNING = (LeaseState.ISSUED, LeaseState.STARTED)
"""Live leases whose attempt has not been acknowledged as running yet."""


def acting_node(principal: Principal, requested: str | None) -> str:
    """The node a call acts for: an agent's own (naming another is a 404, as if it did not
    exist), or the one an admin names."""
    require(principal, Role.AGENT, Role.ADMIN)
    if principal.role is Role.AGENT:
        own = principal.node or ""
        if requested is not None and requested != own:
            raise NotFound(f"no node {requested}")
        return own
    if requested is None:
        raise InvalidInput("an admin must name the node", field="node")
    return requested


def register(
    session: Session,
    node_id: str,
    data: NodeRegister,
    arrived: datetime | None = None,
    *,
    approve: bool = False,
) -> NodeRow:
    """Create or update the node, READY, heartbeat ``arrived`` (now by default). When the
    cluster's capacity changed (a new node, another GPU count or type, a node that was not
    READY) its state version is bumped (and a plan requested after commit); a READY node
    registering again as it was (an agent restarted, or retrying a register whose answer it
    missed) is a heartbeat: a thousand agents starting at once bump the version once each, not
    once per retry.

    The node's GPUs are an operator's word, not its agent's (:mod:`store.cluster`): an agent
    reporting more GPUs than its node was approved for, or another GPU type, is refused (409);
    a node not approved yet is registered but gets no leases until an operator approves it.
    ``approve``: the caller is an operator (an admin registering a node in its name): what it
    registers is approved as it stands."""
    if approve:
        cluster.approve_node(session, node_id, data.gpus, data.gpu_type)
    else:
        cluster.check_inventory(session, node_id, data.gpus, data.gpu_type)
    now = arrived or utcnow()
    node = session.get(NodeRow, node_id, with_for_update=True)
    if (
        node is not None
        and node.state == NodeState.READY.value
        and (node.gpus, node.gpu_type, node.hostname) == (data.gpus, data.gpu_type, data.hostname)
    ):
        if node.last_heartbeat_at is None or node.last_heartbeat_at < now:
            node.last_heartbeat_at = now
        session.add(node)
        session.flush()
        return node
    if node is None:
        node = NodeRow(id=node_id, hostname=data.hostname, gpus=data.gpus, registered_at=now)
    node.hostname = data.hostname
    node.gpus = data.gpus
    node.gpu_type = data.gpu_type
    node.state = NodeState.READY.value
    node.last_heartbeat_at = now
    session.add(node)
    session.flush()
    cluster_version.bump_and_request(session, f"node {node_id} registered")
    return node


def heartbeat(session: Session, node_id: str, arrived: datetime | None = None) -> NodeStatus:
    """Record a sign of life and commit; the node's status after it.

    The contact counts from ``arrived`` (when the request reached the server; now by default),
    not from when it was served: a server slow to answer never makes a node look silent.
    A READY node's heartbeat is one ``UPDATE ... RETURNING`` and one read of the cluster's
    round. A LOST node that heartbeats again is READY again (capacity changed: the version is
    bumped); its lost attempts stay lost. An unknown node is a 404."""
    connection = session.connection()
    now = arrived or utcnow()
    beat = connection.execute(_BEAT, {"node": node_id, "now": now}).first()
    if beat is not None:
        status = node_status(session, beat)
        session.commit()
        return status
    node = _revive(session, node_id, now)
    session.commit()
    return node_status(session, node)


def _revive(session: Session, node_id: str, now: datetime) -> NodeRow:
    """The slow path of a heartbeat (a LOST node, or SQLite): stamp it, READY again with the
    version bumped when it was not; not committed."""
    node = session.get(NodeRow, node_id, with_for_update=True)
    if node is None:
        raise NotFound(f"no node {node_id}: register it first")
    if node.last_heartbeat_at is None or node.last_heartbeat_at < now:
        node.last_heartbeat_at = now
    if node.state != NodeState.READY:
        node.state = NodeState.READY.value
        cluster_version.bump_and_request(session, f"node {node_id} is back")
    session.add(node)
    session.flush()
    return node


def node_status(session: Session, node: Any) -> NodeStatus:
    """The node (an ORM row, or a Core row of the ``nodes`` table) with the cluster's round."""
    round_ = _round(session.connection())
    return NodeStatus(
        id=node.id,
        hostname=node.hostname,
        gpus=node.gpus,
        gpu_type=node.gpu_type,
        state=NodeState(node.state),
        last_heartbeat_at=node.last_heartbeat_at,
        registered_at=node.registered_at,
        current_round=round_.current,
        round_ends_at=round_.ends_at,
        state_version=round_.version,
    )


class Round(NamedTuple):
    """The cluster's current round (-1 before the first), when it ends, its state version."""

    current: int
    ends_at: datetime | None
    version: int


def _round(connection: Connection) -> Round:
    """Three columns of the cluster's row (not the policy's memory: hundreds of kB at scale)."""
    return _as_round(connection.execute(_CLUSTER_ROUND).first())


def _as_round(row: Any) -> Round:
    if row is None or row.current_round is None:
        return Round(-1, None, 0)
    return Round(row.current_round, row.round_ends_at, row.state_version)


def node_leases(session: Session, node_id: str, running: list[str]) -> NodeLeases:
    """The node's live leases of unfinished jobs, and the attempts it must stop."""
    connection = session.connection()
    node = connection.execute(_NODE_ROUND, {"node": node_id}).first()
    if node is None:
        raise NotFound(f"no node {node_id}: register it first")
    return _leases_of(connection, node_id, _as_round(node), running)


def _leases_of(
    connection: Connection, node_id: str, round_: Round, running: list[str]
) -> NodeLeases:
    since = round_.current - STOP_ROUNDS
    rows = connection.execute(_NODE_LEASES, {"node": node_id, "since": since}).all()
    return _answer_leases(connection, node_id, round_, rows, running)


def _answer_leases(
    connection: Connection, node_id: str, round_: Round, rows: Sequence[Any], running: list[str]
) -> NodeLeases:
    """The node's answer from its lease ``rows`` (:data:`_LEASE_COLUMNS`)."""
    shown = [
        row for row in rows if row.state in LIVE_LEASES and not JobState(row.job_state).terminal
    ]
    leases = LEASE_ANSWERS.of(connection, node_id, shown)
    live = {lease.attempt_id for lease in leases}
    stop = {row.id for row in rows if row.id not in live}
    stop.update(attempt for attempt in running if attempt not in live)
    return NodeLeases(
        node=node_id,
        current_round=round_.current,
        round_ends_at=round_.ends_at,
        leases=leases,
        stop=sorted(stop),
    )


class Launch(NamedTuple):
    """A job's launch fields, which never change once it is submitted."""

    command: tuple[str, ...]
    image: str | None
    env: dict[str, str]


class _Launches:
    """Each job's :class:`Launch`, read from the database once per process (at most
    :data:`LAUNCHES_KEPT` jobs kept; the oldest forgotten first; a job's id, a random UUID, is
    never another job's): a node's lease answer, read every poll, then carries only what
    changes (decoding and copying these JSON fields was about a quarter of an idle poll's
    CPU with 8 leases)."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._launches: dict[str, Launch] = {}
        self._lock = threading.Lock()

    def of(self, connection: Connection, job_ids: Sequence[str]) -> dict[str, Launch]:
        """The launches of ``job_ids``, reading those this process does not know yet."""
        known = self._launches
        found = {job: launch for job in job_ids if (launch := known.get(job)) is not None}
        missing = sorted(set(job_ids) - found.keys())
        if not missing:
            return found
        read = {
            row.id: Launch(
                tuple(str(arg) for arg in row.command),
                row.image,
                {str(k): str(v) for k, v in (row.env or {}).items()},
            )
            for row in connection.execute(_LAUNCH, {"ids": missing})
        }
        with self._lock:
            known.update(read)
            while len(known) > self._kept:
                del known[next(iter(known))]
        return {**found, **read}


LAUNCHES_KEPT = 65536
LAUNCHES = _Launches(LAUNCHES_KEPT)


class _LeaseAnswers:
    """Each lease as its agent sees it (:class:`LeasePublic`), kept per process by everything
    it is built from (the node, the lease's columns read each poll, its job's batch size; its
    job's launch fields never change): an idle node's polls and a held poll's re-reads, which
    read the same leases again and again within a round, build each answer once a round (an
    extension's new end is a new answer), not once a poll (building 8 of them, their GPUs'
    JSON decoded, was a sixth of an idle poll's own CPU). At most :data:`LEASE_ANSWERS_KEPT`
    kept; the oldest forgotten first. The answers are shared: never changed in place (a
    change is a ``model_copy``)."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._answers: dict[tuple[Any, ...], LeasePublic] = {}
        self._lock = threading.Lock()

    def of(self, connection: Connection, node_id: str, rows: Sequence[Any]) -> list[LeasePublic]:
        """The answers of lease ``rows`` (:data:`_LEASE_COLUMNS`) of ``node_id``, in order."""
        keys = [_answer_key(node_id, row) for row in rows]
        known = self._answers
        found = [known.get(key) for key in keys]
        missing = [row for row, answer in zip(rows, found, strict=True) if answer is None]
        if not missing:
            return found  # type: ignore[return-value]
        launches = LAUNCHES.of(connection, [row.job_id for row in missing])
        built = {
            key: _lease_public(row, node_id, launches[row.job_id])
            for key, row, answer in zip(keys, rows, found, strict=True)
            if answer is None
        }
        with self._lock:
            known.update(built)
            while len(known) > self._kept:
                del known[next(iter(known))]
        return [
            answer if answer is not None else built[key]
            for key, answer in zip(keys, found, strict=True)
        ]


def _answer_key(node_id: str, row: Any) -> tuple[Any, ...]:
    """What :func:`_lease_public` builds a lease's answer from, but its job's launch fields."""
    return (
        node_id,
        row.id,
        row.job_id,
        row.round_index,
        row.gpus,
        row.state,
        row.ends_at,
        row.began_at,
        row.issued_at,
        row.batch_size,
    )


LEASE_ANSWERS_KEPT = 16384
LEASE_ANSWERS = _LeaseAnswers(LEASE_ANSWERS_KEPT)


def poll(
    session: Session,
    principal: Principal,
    node_id: str,
    data: AgentPoll,
    arrived: datetime | None = None,
) -> PollAnswer:
    """One contact of an agent, in one request (``POST /v1/agent/poll``) and one transaction:

    1. the reports, in order, each answered as :func:`report_status` would answer it alone
       (:func:`_apply_reports`); at most :func:`~shockwave.domain.lifecycle.reports_per_poll` of the
       node's GPUs (more is a 422 naming ``reports``, as are more log tails: ``logs``), so
       the server's work per request is bounded by what the node can run;
    2. each live lease listed in ``running`` that is not yet RUNNING (it just started, its
       ``started`` report is implied) becomes RUNNING (:func:`_acknowledge`: its job is
       locked only when the job starts);
    3. the log tails, and the heartbeat (unless ``data.heartbeat`` is false), stamped
       ``arrived`` (when the request reached the server: :func:`heartbeat`);
    4. the leases, as :func:`node_leases` reads them with ``data.running``; with
       ``data.tokens``, also a job token for each live lease not in ``running`` that has none
       yet (the agent is about to start it): one token per attempt, never one per poll (an
       agent that lost it asks :func:`job_token`, which replaces it);

    committed once. Locks are taken jobs first (all of them in one statement, in the round
    driver's order), then leases, then the node's row: the order of the round driver and of
    the node reaper, so a poll waits for them rather than deadlocking. Before its job locks a
    poll passes the boundary gate (:mod:`store.boundary_gate`): while the driver writes a
    boundary or a fill, a poll with ``defer_busy`` takes every job it names for busy. A poll
    with ``defer_busy`` that says nothing but what it runs acknowledges in the transaction of
    its heartbeat (:func:`_acknowledge_quietly`), taking no lock it would wait for.

    It replaces a heartbeat, a lease poll, a token request per new attempt and a report per
    attempt that started or was extended: at a round boundary the requests of a whole cluster
    fall from a few per lease to two per node (docs/reliability.md, "Load"). A poll that says
    nothing and starts nothing (:func:`_quiet_poll`: an idle node's, and each re-read of a held
    long poll) is one statement and a commit: on Postgres its heartbeat, the node, the
    cluster's round and its leases in one ``UPDATE ... RETURNING`` joined to the reads, each
    job's launch fields read once per process. Reports on unknown attempts cost one read for
    all of them.
    """
    now = arrived or utcnow()
    if not (data.reports or data.events or data.logs):
        quiet = _quiet_poll(session, node_id, data, now)
        if quiet is not None:
            return quiet
        session.rollback()  # the full path takes its locks in the order above
    connection = session.connection()
    known = connection.execute(_NODE_ROUND, {"node": node_id}).first()
    if known is None:
        raise NotFound(f"no node {node_id}: register it first")
    most = reports_per_poll(known.gpus)
    for name, items in (("reports", data.reports), ("events", data.events), ("logs", data.logs)):
        if len(items) > most:
            raise InvalidInput(
                f"at most {most} {name} per poll for a node of {known.gpus} GPUs; "
                "send the rest in the next polls",
                field=name,
            )
    running = set(data.running)
    named = {report.attempt_id for report in data.reports} | {e.attempt_id for e in data.events}
    fresh, attempts = _fresh_and_named(connection, principal, node_id, running, named)
    settled, locking = _triage(data.reports, attempts)
    locking |= {row.job_id for row in fresh if row.job_state != JobState.RUNNING.value}
    locking |= {attempts[e.attempt_id].job_id for e in data.events if e.attempt_id in attempts}
    busy: set[str] = set()
    locked: dict[str, str] = {}
    held: dict[str, PolledJob] = {}
    if (locking or fresh) and data.defer_busy:
        if boundary_gate.pass_through(connection, wait=False):
            if locking:
                locked, held = _lock(connection, locking, free=True, polled=bool(data.events))
            busy = locking - locked.keys()
        else:  # the driver is writing a boundary: every job is busy
            busy = locking | {row.job_id for row in fresh}
    elif locking or fresh:
        boundary_gate.pass_through(connection, wait=True)
        if locking:
            locked, held = _lock(connection, locking, free=False, polled=bool(data.events))
    events = _record_events(session, node_id, data.events, attempts, held, busy)
    reports = _apply_reports(session, principal, data.reports, attempts, settled, busy)
    fresh = [row for row in fresh if row.job_id not in busy]
    acknowledged: set[str] = set()
    if fresh:
        if data.reports and locked:  # a report may have moved a job since it was locked
            locked = _locked(session.connection(), _JOB_STATES, locked.keys())
        acknowledged = _acknowledge(
            session.connection(), node_id, fresh, locked, free=data.defer_busy
        )
    connection = session.connection()
    if data.logs:
        _store_logs(connection, node_id, data.logs)
    node = None
    if data.heartbeat and connection.dialect.name == "postgresql":
        node = connection.execute(_BEAT_ROUND, {"node": node_id, "now": now}).first()
    if node is None and data.heartbeat:
        _revive(session, node_id, now)  # not READY, or SQLite: the slow path
        connection = session.connection()
    if node is None:
        node = connection.execute(_NODE_ROUND, {"node": node_id}).first()
    if node is None:
        raise NotFound(f"no node {node_id}: register it first")
    round_ = _as_round(node)
    found = _leases_of(connection, node_id, round_, data.running)
    tokens = {}
    if data.tokens:
        tokens = _new_tokens(
            session,
            {
                lease.attempt_id: lease.job_id
                for lease in found.leases
                if lease.attempt_id not in running
            },
        )
    if not (locking - busy or tokens or acknowledged):
        _commit_contact(session)
    else:
        session.commit()
    return _poll_answer(found, node.state, round_, reports, events, tokens)


def _quiet_poll(
    session: Session, node_id: str, data: AgentPoll, now: datetime
) -> PollAnswer | None:
    """A poll that says nothing (no reports, events or log tails), in one statement when
    nothing is new for the agent to start: its heartbeat (when asked), the node, the cluster's
    round and the node's leases (:func:`_node_view`), then a commit that does not wait for
    the WAL's flush. A lease it runs that is not RUNNING yet is acknowledged from that read
    (with ``defer_busy``, on Postgres: :func:`_acknowledge_quietly`), and the job tokens it
    asks for are minted from it (:func:`_new_tokens`: a held poll's re-read that brings a
    round's new leases); either is committed waiting for the flush. The answer, committed;
    None, nothing committed, when it must be acknowledged without ``defer_busy``: that takes
    :func:`poll`'s full path."""
    connection = session.connection()
    if data.heartbeat and connection.dialect.name == "postgresql":
        rows = connection.execute(_BEAT_VIEW, {"node": node_id, "now": now}).all()
    else:
        rows = []
    revived = not rows and data.heartbeat
    if revived:
        _revive(session, node_id, now)  # not READY, or SQLite: the slow path
        connection = session.connection()
    if not rows:
        rows = connection.execute(_VIEW, {"node": node_id}).all()
    if not rows:
        raise NotFound(f"no node {node_id}: register it first")
    running = set(data.running)
    leases = [row for row in rows if row.id is not None]
    shown = [
        row for row in leases if row.state in LIVE_LEASES and not JobState(row.job_state).terminal
    ]
    fresh = [row for row in shown if row.id in running and row.state in _NOT_RUNNING]
    moved: set[str] = set()
    if fresh:
        if not (data.defer_busy and connection.dialect.name == "postgresql"):
            return None
        moved = _acknowledge_quietly(connection, node_id, fresh)
    starting = {row.id: row.job_id for row in shown if row.id not in running}
    tokens = _new_tokens(session, starting) if data.tokens else {}
    round_ = _as_round(rows[0])
    found = _answer_leases(connection, node_id, round_, leases, data.running)
    if moved or tokens:
        found = _as_running(found, moved)
        if data.heartbeat and connection.dialect.name == "postgresql":
            connection.execute(_SYNC_COMMIT)  # the heartbeat's statement set it off
        session.commit()
    elif revived:
        _commit_contact(session)
    else:
        session.commit()  # a heartbeat set to commit without the WAL's flush, or a read
    return _poll_answer(found, rows[0].node_state, round_, [], [], tokens)


def _new_tokens(session: Session, starting: Mapping[str, str]) -> dict[str, str]:
    """A job token for each of ``starting`` (attempt id -> job id: live leases the agent is
    about to start) that has none yet, not committed: one token per attempt, never one per
    poll (an agent that lost it asks :func:`job_token`, which replaces it). Those without
    one have nothing to revoke."""
    held = attempts_with_tokens(session, sorted(starting))
    return add_attempt_tokens(
        session, {attempt: job for attempt, job in starting.items() if attempt not in held}
    )


def _acknowledge_quietly(connection: Connection, node_id: str, fresh: Sequence[Any]) -> set[str]:
    """The acknowledgement of a poll with ``defer_busy`` that says nothing else (a node's
    first poll after it started a round's new attempts), in the transaction of its read
    (:func:`_quiet_poll`), after the heartbeat: nothing here waits for a lock (the boundary
    gate tried, jobs and leases taken only when free), so holding the node's row first
    cannot deadlock. Jobs are locked only for the attempts whose job starts
    (:func:`_acknowledge`); the attempts that became RUNNING (none while the gate is
    closed: a round driver writing a boundary holds every live lease)."""
    if not boundary_gate.pass_through(connection, wait=False):
        return set()
    starting = {row.job_id for row in fresh if row.job_state != JobState.RUNNING.value}
    locked = _locked(connection, _LOCK_FREE_JOBS, starting) if starting else {}
    return _acknowledge(connection, node_id, fresh, locked, free=True)


def _as_running(found: NodeLeases, moved: set[str]) -> NodeLeases:
    """``found`` with the leases ``moved`` (acknowledged since it was read) RUNNING."""
    leases = [
        lease.model_copy(update={"state": LeaseState.RUNNING})
        if lease.attempt_id in moved
        else lease
        for lease in found.leases
    ]
    return found.model_copy(update={"leases": leases})


def _commit_contact(session: Session) -> None:
    """Commit a poll that wrote a heartbeat and log tails at most: nothing an agent acts on,
    so on Postgres the commit need not wait for the WAL's flush (a database crash may forget
    the last fraction of a second of such contacts; never a report, an event, a start or a
    token)."""
    if session.connection().dialect.name == "postgresql":
        session.connection().execute(_ASYNC_COMMIT)
    session.commit()


def _poll_answer(
    found: NodeLeases,
    node_state: str,
    round_: Round,
    reports: list[ReportAnswer],
    events: list[EventAnswer],
    tokens: dict[str, str],
) -> PollAnswer:
    return PollAnswer(
        node=found.node,
        current_round=round_.current,
        round_ends_at=round_.ends_at,
        leases=found.leases,
        stop=found.stop,
        node_state=NodeState(node_state),
        state_version=round_.version,
        reports=reports,
        events=events,
        tokens=tokens,
    )


STAGGER_SHARE = 0.5
"""The share of the time left before a round is due over which the held polls it wakes are
spread (:func:`stagger_s`)."""
STAGGER_WINDOW_S = 10.0
"""How long before its due time a round may wake the held polls and have them take turns:
the longest boundary lead the round driver takes."""


def stagger_s(node_id: str, due: datetime | None, now: datetime | None = None) -> float:
    """How long the held poll of ``node_id`` waits before it reads what woke every held poll
    (a round), due at ``due`` (the end of the round its answer named): its fixed share (a
    hash of its id) of :data:`STAGGER_SHARE` of the time left until then. A round that the
    driver commits ahead of its due time (its boundary lead) wakes every held poll at once;
    taken in turns, their re-reads and the polls that acknowledge what they bring arrive
    spread over the lead instead of queueing for seconds at each API process, and every
    node has its leases with half the time left to spare. 0 when no round is due within
    :data:`STAGGER_WINDOW_S` (a round out late, nodes lost mid-round)."""
    if due is None:
        return 0.0
    left = (due - (now or utcnow())).total_seconds()
    if not 0 < left <= STAGGER_WINDOW_S:
        return 0.0
    return zlib.crc32(node_id.encode()) / 2**32 * STAGGER_SHARE * left


def has_news(answer: PollAnswer, data: AgentPoll) -> bool:
    """Whether a poll's ``answer`` tells the agent anything it must act on: a live lease it
    does not run, an attempt it runs that must stop, or a round other than
    ``data.seen_round``. A long poll (``wait_s``) is held while there is none."""
    running = set(data.running)
    return (
        (data.seen_round is not None and answer.current_round != data.seen_round)
        or any(lease.attempt_id not in running for lease in answer.leases)
        or any(attempt in running for attempt in answer.stop)
    )


def reports_nothing(body: bytes) -> bool:
    """Whether the raw body of a ``POST /v1/agent/poll`` is a long poll (``wait_s`` in its
    bounds) that carries no report: nobody waits on it (once read it is held until news comes;
    its events and log tails, if any, feed a planner that reads them once a round), so
    admission queues it behind the agents' requests that someone does wait on
    (api.admission, ``IDLE``). A body that is not such an object is not one (the route
    answers it as it would anyway)."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if not isinstance(data, dict) or data.get("reports"):
        return False
    wait_s = data.get("wait_s")
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float):
        return False
    return 0 < wait_s <= POLL_WAIT_MAX_S  # beyond: the route refuses it (422)


def deferred(answer: PollAnswer, data: AgentPoll) -> bool:
    """Whether some of what a poll said waits for a later poll (``defer_busy``): a report or an
    event answered 503, or a lease it listed in ``running`` still not RUNNING in its
    ``answer`` (its job or lease was busy). A long poll is not held then: the node sends it
    again in its next poll, which should come soon, not after the hold."""
    running = set(data.running)
    return (
        any(report.status == BUSY for report in answer.reports)
        or any(event.status == BUSY for event in answer.events)
        or any(
            lease.attempt_id in running and lease.state in _NOT_RUNNING for lease in answer.leases
        )
    )


def _store_logs(connection: Connection, node_id: str, logs: dict[str, str]) -> None:
    """Keep each attempt's output tail on its lease (the node's own attempts only); committed
    with the poll's heartbeat."""
    connection.execute(
        LEASES.update()
        .where(LEASES.c.id == bindparam("attempt"), LEASES.c.node_id == node_id)
        .values(log_tail=bindparam("tail")),
        [{"attempt": attempt, "tail": tail} for attempt, tail in logs.items()],
    )


def _fresh_and_named(
    connection: Connection,
    principal: Principal,
    node_id: str,
    running: set[str],
    named: set[str],
) -> tuple[list[Any], dict[str, Any]]:
    """One read (:data:`_ATTEMPTS`, without locks) for what a poll's full path needs of the
    attempts it lists: the node's live leases among ``running`` not RUNNING yet (as
    those an acknowledgement takes), and the attempts ``named`` by its reports and events that the
    caller may act on (an agent: its node's), by id."""
    if not (running or named):
        return [], {}
    rows = connection.execute(_ATTEMPTS, {"ids": sorted(running | named)}).all()
    fresh = [
        row
        for row in rows
        if row.id in running and row.node_id == node_id and row.state in _NOT_RUNNING
    ]
    attempts = {
        row.id: row
        for row in rows
        if row.id in named and (principal.role is not Role.AGENT or row.node_id == principal.node)
    }
    return fresh, attempts


def _triage(
    reports: list[AttemptReport], attempts: dict[str, Any]
) -> tuple[dict[int, LeaseStatusPublic], set[str]]:
    """Which reports change nothing (answered from the read, by their index) and the jobs of
    the others (to lock). Once a job is reported on through the locking path, every later
    report on it takes that path too: the read is stale for it."""
    settled: dict[int, LeaseStatusPublic] = {}
    locking: set[str] = set()
    for index, report in enumerate(reports):
        row = attempts.get(report.attempt_id)
        if row is None:
            continue
        answer = None if row.job_id in locking else _settled(report.attempt_id, row, report)
        if answer is not None:
            settled[index] = answer
        else:
            locking.add(row.job_id)
    return settled, locking


def _record_events(
    session: Session,
    node_id: str,
    events: list[Any],
    attempts: dict[str, Any],
    held: Mapping[str, PolledJob],
    busy: Collection[str] = (),
) -> list[EventAnswer]:
    """A poll's job events, in order, in the caller's transaction (their jobs locked, their
    rows ``held`` as the lock read them: :func:`_lock`): each
    recorded as its attempt's job token would record it (:func:`store.events.record_event`,
    fencing included), answered as that post would be. One for an attempt not on this node
    is a 404 answer; a refused one (fenced, a conflicting duplicate, a finished job, an epoch
    beyond the job) writes nothing and does not undo the others. One whose job is in
    ``busy`` (not locked: another transaction holds it) is answered 503, nothing recorded. A
    new scaling event bumps the cluster's version once for the poll."""
    answers = []
    scaled = False
    recorded = sorted(
        {
            event.attempt_id
            for event in events
            if (row := attempts.get(event.attempt_id)) is not None
            and row.node_id == node_id
            and row.job_id not in busy
        }
    )
    # their jobs are locked, so their leases' states read now are what each event's fence
    # check reads: one statement a poll, not one an event
    fences = fenced_reasons(session, recorded)
    # their jobs' rows were read by the statement that locked them: each event is folded into
    # its row in memory, the rows written at the flush below and the new events inserted after
    # it in one statement (store.events.record_held_event)
    pending: list[dict[str, Any]] = []
    folded: dict[str, PolledJob] = {}  # the rows that took a new event, to write back
    for event in events:
        row = attempts.get(event.attempt_id)
        if row is None or row.node_id != node_id:
            answers.append(
                EventAnswer(
                    attempt_id=event.attempt_id,
                    seq=event.seq,
                    status=404,
                    detail=f"no attempt {event.attempt_id}",
                )
            )
            continue
        if row.job_id in busy:
            answers.append(
                EventAnswer(
                    attempt_id=event.attempt_id, seq=event.seq, status=BUSY, detail=BUSY_DETAIL
                )
            )
            continue
        speaker = Principal(
            role=Role.JOB,
            key=f"attempt:{event.attempt_id}",
            job_id=row.job_id,
            attempt_id=event.attempt_id,
        )
        payload = event.model_dump(mode="json", exclude={"seq", "kind", "attempt_id"})
        told = ClientEvent(event.seq, event.kind, payload)
        job = held.get(row.job_id)
        try:
            if job is None:  # gone since the attempt was read: as a post would find it
                status, _ = store_events.record_event(session, speaker, row.job_id, told)
            else:
                status = store_events.record_held_event(
                    session, speaker, job, told, pending, fences[event.attempt_id]
                )
                if status == 201:
                    folded[job.id] = job
        except (Conflict, InvalidInput, NotFound) as error:
            code = {Conflict: 409, InvalidInput: 422, NotFound: 404}[type(error)]
            answers.append(
                EventAnswer(
                    attempt_id=event.attempt_id,
                    seq=event.seq,
                    status=code,
                    stop=bool(error.extra.get("stop")),
                    detail=error.detail,
                )
            )
            continue
        scaled = scaled or (status == 201 and event.kind == "scaling")
        answers.append(EventAnswer(attempt_id=event.attempt_id, seq=event.seq, status=status))
    if events:
        session.flush()
    write_folded(session, list(folded.values()))
    if pending:
        insert_events(session.connection(), pending)
    if scaled:
        cluster_version.bump_and_request(session, "batch size changed")
    return answers


def _apply_reports(
    session: Session,
    principal: Principal,
    reports: list[AttemptReport],
    attempts: dict[str, Any],
    settled: dict[int, LeaseStatusPublic],
    busy: Collection[str] = (),
) -> list[ReportAnswer]:
    """A poll's reports, in order, in the caller's transaction: what each would have got
    alone. ``attempts``: the attempts the caller may act on (one read for all); an unknown
    one (or another node's) is a 404 answer, one that changes nothing (``settled``) is
    answered from that read, neither writing nor locking; the others' jobs are locked
    already, and each is applied as :func:`report_status` applies it. A report refused as
    invalid (not a 404) fails the whole poll: nothing of it is written. One that would change
    something on a job in ``busy`` (not locked: another transaction holds it) is answered
    503, nothing applied, and so is every later report on that job (they must apply in
    order)."""
    answers = []
    applied = False
    pinned: list[Any] | None = None
    known: JobLeases | None = None
    changes: list[dict[str, Any]] = []  # the reports' job state events, inserted at the end
    for index, report in enumerate(reports):
        attempt_id = report.attempt_id
        if attempt_id not in attempts:
            detail = f"no attempt {attempt_id}"
            answers.append(
                ReportAnswer(attempt_id=attempt_id, status=404, stop=False, detail=detail)
            )
            continue
        if index not in settled and attempts[attempt_id].job_id in busy:
            answers.append(
                ReportAnswer(attempt_id=attempt_id, status=BUSY, stop=False, detail=BUSY_DETAIL)
            )
            continue
        status = settled.get(index)
        refused = None
        if status is None:
            if pinned is None:
                pinned, known = _load_reported(session, reports, attempts, settled, busy)
            outcome = report_status(
                session,
                principal,
                attempt_id,
                report,
                attempt=attempts[attempt_id],
                known=known,
                events=changes,
            )
            status, refused, applied = outcome.status, outcome.refused, True
        if refused is not None:
            detail = f"{refused}: stop it"
            answers.append(
                ReportAnswer(attempt_id=attempt_id, status=409, stop=True, detail=detail)
            )
        else:
            answers.append(
                ReportAnswer(attempt_id=attempt_id, status=200, stop=status.stop, lease=status)
            )
    if applied:
        session.flush()  # what follows reads with Core statements
    # after the flush: in the order the reports moved their jobs
    insert_events(session.connection(), changes)
    del pinned
    return answers


def _load_reported(
    session: Session,
    reports: list[AttemptReport],
    attempts: dict[str, Any],
    settled: dict[int, LeaseStatusPublic],
    busy: Collection[str],
) -> tuple[list[Any], JobLeases]:
    """Load the jobs (locked by the poll already) and lock and load the leases of the reports
    that take the locking path, one statement each for all of them, into the session, where
    :func:`report_status` finds them (``attempt`` given): not three statements a report.
    The rows, to be kept referenced while the reports are applied (the session's identity
    map holds its objects weakly), and the leases of the jobs reported on once in the poll,
    read in one statement (:class:`store.leases.JobLeases`: what applying a report reads of
    its job's other leases; a job reported on twice is read again for each, as the first
    report may have moved its other leases)."""
    applying = [
        report.attempt_id
        for index, report in enumerate(reports)
        if index not in settled
        and report.attempt_id in attempts
        and attempts[report.attempt_id].job_id not in busy
    ]
    ids = sorted(set(applying))
    jobs = sorted({attempts[attempt].job_id for attempt in ids})
    reported = Counter(
        attempts[report.attempt_id].job_id for report in reports if report.attempt_id in attempts
    )
    loaded: list[Any] = list(session.execute(_REPORTED_JOBS, {"ids": jobs}).scalars())
    loaded.extend(session.execute(_REPORTED_LEASES, {"ids": ids}).scalars())
    once = [job for job in jobs if reported[job] == 1]
    return loaded, JobLeases(session, once)


_REPORTED_JOBS = (
    select(JobRow)
    .where(col(JobRow.id).in_(bindparam("ids", expanding=True)))
    .options(POLLED)
    .execution_options(populate_existing=True)
)
"""The rows of a poll's reported jobs (locked by the poll already), what it reads of them."""
_REPORTED_LEASES = (
    select(LeaseRow)
    .where(col(LeaseRow.id).in_(bindparam("ids", expanding=True)))
    .order_by(col(LeaseRow.id))
    .with_for_update()
    .execution_options(populate_existing=True)
)
"""The leases of a poll's reports, locked."""


def _lock(
    connection: Connection, job_ids: Collection[str], *, free: bool, polled: bool
) -> tuple[dict[str, str], dict[str, PolledJob]]:
    """Lock ``job_ids`` in the round driver's order (``free``: only those no other transaction
    holds, without waiting): job id -> state of those locked, and, when ``polled`` (the poll
    carries events), their rows as events fold into them (:class:`store.jobs.PolledJob`), read
    by the same statement."""
    if not polled:
        return _locked(connection, _LOCK_FREE_JOBS if free else _LOCK_JOBS, job_ids), {}
    statement = _LOCK_FREE_POLLED if free else _LOCK_POLLED
    rows = {
        row.id: PolledJob(**row._mapping)
        for row in connection.execute(statement, {"ids": sorted(job_ids)})
    }
    return {job: row.state for job, row in rows.items()}, rows


def _locked(connection: Connection, statement: Any, job_ids: Collection[str]) -> dict[str, str]:
    """Job id -> state of those of ``job_ids`` that ``statement`` (:data:`_LOCK_JOBS`,
    :data:`_LOCK_FREE_JOBS` or :data:`_JOB_STATES`) returns."""
    return {row.id: row.state for row in connection.execute(statement, {"ids": sorted(job_ids)})}


def _acknowledge(
    connection: Connection,
    node_id: str,
    fresh: Sequence[Any],
    locked: Mapping[str, str],
    *,
    free: bool,
) -> set[str]:
    """A ``running`` report for each of ``fresh`` (rows with ``id``, ``job_id`` and
    ``job_state``: the node's leases a poll lists as running that are not RUNNING yet), in the
    caller's transaction, past the boundary gate; the attempts that became RUNNING.

    An acknowledgement is the node's own lease moving on, so it is guarded by the lease row
    (the node's, live and not yet RUNNING: a lease revoked, lost or stopped meanwhile stays as
    it is and comes back in the poll's ``stop``), not by its job's: a lease of a job that is
    RUNNING already (it moved: its earlier attempt is stopping) becomes RUNNING and its job
    is left alone, unlocked. That job cannot leave RUNNING meanwhile (a job with a live lease
    stays RUNNING until it finishes, and whatever finishes it revokes this lease under the
    lease's lock). Only a job that starts (not RUNNING) changes: it must be in ``locked`` (job
    id -> state, locked by the caller; one that is not is busy and left for a later poll),
    becomes RUNNING with a state event, as a ``running`` report would make it, unless it
    finished. ``free``: a
    lease another transaction holds is left for a later poll instead of waited for.

    A round boundary brings every node its new attempts at once, so this is one statement
    per step, not a report per lease."""
    wanted = []
    for row in fresh:
        state = locked.get(row.job_id)
        if state is None:
            if row.job_state == JobState.RUNNING.value:
                wanted.append(row.id)
        elif not JobState(state).terminal:
            wanted.append(row.id)
    if not wanted:
        return set()
    now = utcnow()
    statement = _RUN_FREE_LEASES if free else _RUN_LEASES
    moved = {
        row.id: row.job_id
        for row in connection.execute(statement, {"ids": wanted, "node": node_id, "now": now})
    }
    started: dict[str, str] = {}
    for attempt_id, job_id in sorted(moved.items()):
        state = locked.get(job_id)
        if state is not None and state != JobState.RUNNING.value and job_id not in started:
            transition(JobState(state), JobState.RUNNING)
            started[job_id] = attempt_id
    if started:
        connection.execute(_RUN_JOBS, {"ids": sorted(started), "now": now})
        insert_events(
            connection,
            [
                state_event(
                    job_id,
                    locked[job_id],
                    JobState.RUNNING,
                    f"attempt {attempt_id} started on {node_id}",
                    now,
                )
                for job_id, attempt_id in sorted(started.items())
            ],
        )
    return set(moved)


def visible_attempt(session: Session, principal: Principal, attempt_id: str) -> Any:
    """The attempt's lease state, node and end, and its job's id and state, read without locks,
    if the caller may act on it; else 404 (another node's attempts do not exist for an
    agent)."""
    require(principal, Role.AGENT, Role.ADMIN)
    row = session.connection().execute(_ATTEMPT, {"attempt": attempt_id}).first()
    if row is None or (principal.role is Role.AGENT and row.node_id != principal.node):
        raise NotFound(f"no attempt {attempt_id}")
    return row


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """``status``: the lease and job after the report. ``refused``: why the attempt must stop
    instead (the route answers 409, ``stop: true``), None when the report was applied."""

    status: LeaseStatusPublic
    refused: str | None = None


def report_status(
    session: Session,
    principal: Principal,
    attempt_id: str,
    report: LeaseStatusReport,
    *,
    attempt: Any = None,
    known: JobLeases | None = None,
    events: list[dict[str, Any]] | None = None,
) -> ReportOutcome:
    """Apply an agent's report on one attempt (see the module docstring of :mod:`store.leases`).

    - ``started`` / ``running`` on a live lease: the lease moves on, the job becomes RUNNING;
      on an attempt that must not run (revoked, lost, stopped, its job finished): refused.
    - ``checkpointed``: the attempt stopped with a checkpoint; its job, unless it runs
      elsewhere, is SUSPENDED.
    - ``exited``: code 0 means the job finished: SUCCEEDED. A nonzero code fails the job
      (FAILED, no retry) unless the process was asked to stop: the attempt had been revoked,
      or the report says ``stop_requested`` (the agent stopped it on its own: its lease ran
      out, the agent is draining, or the server said stop before a revoke reached this
      lease). A stop that ends in a signal (SIGTERM before the program's handler was
      installed: -15; SIGKILL after the grace period: -9) or a nonzero code is the stop that
      was asked for, not a failure: the job goes back to the queue (SUSPENDED with a
      checkpoint, else PENDING).
    - a lost attempt's reports are all refused: its job has already gone back to the queue.

    A report that changes nothing (``running`` from an attempt already RUNNING, as every agent
    sends for each lease a new round extends; ``started`` again) is answered from a read
    without locks: :func:`_settled`. Any other locks the job, then the lease (then the cluster
    row, when the version is bumped): the order the round driver takes them in.

    ``attempt``: the attempt as :data:`_ATTEMPTS` read it, its job locked and its job and
    lease loaded into the session, locked (:func:`_load_reported`, for a poll's reports):
    they are not read again. ``known``: the leases of the job, read already. ``events``: where
    the job's state events go (:func:`store.jobs.record_state`; the caller inserts them).
    """
    if attempt is not None:
        job = session.get(JobRow, attempt.job_id)
        lease = session.get(LeaseRow, attempt_id)
    else:
        attempt = visible_attempt(session, principal, attempt_id)
        settled = _settled(attempt_id, attempt, report)
        if settled is not None:
            return ReportOutcome(status=settled)
        job = session.get(JobRow, attempt.job_id, with_for_update=True, populate_existing=True)
        lease = session.get(LeaseRow, attempt_id, with_for_update=True, populate_existing=True)
    if job is None or lease is None:
        raise NotFound(f"no attempt {attempt_id}")
    refused = _apply(session, lease, job, report, known, events)
    stop = lease.state not in LIVE_LEASES or JobState(job.state).terminal
    status = LeaseStatusPublic(
        attempt_id=lease.id,
        job_id=job.id,
        state=LeaseState(lease.state),
        job_state=JobState(job.state),
        ends_at=lease.ends_at,
        stop=stop or refused is not None,
    )
    return ReportOutcome(status=status, refused=refused)


def _settled(attempt_id: str, row: Any, report: LeaseStatusReport) -> LeaseStatusPublic | None:
    """The answer to a ``started`` or ``running`` report that would change nothing, from the
    attempt's unlocked ``row``: the lease is already in that state (or past ``started``) and
    its job RUNNING. None otherwise (the locking path decides). Were a revoke to commit just
    after the read, the answer is the one the report would have got just before it; the
    agent's next poll lists the attempt in ``stop``."""
    if report.state not in ("started", "running"):
        return None
    done: tuple[LeaseState, ...] = (LeaseState.RUNNING,)
    if report.state == "started":
        done = (LeaseState.STARTED, LeaseState.RUNNING)
    if row.state not in done or row.job_state != JobState.RUNNING.value:
        return None
    return LeaseStatusPublic(
        attempt_id=attempt_id,
        job_id=row.job_id,
        state=LeaseState(row.state),
        job_state=JobState.RUNNING,
        ends_at=row.ends_at,
        stop=False,
    )


def _apply(
    session: Session,
    lease: LeaseRow,
    job: JobRow,
    report: LeaseStatusReport,
    known: JobLeases | None = None,
    events: list[dict[str, Any]] | None = None,
) -> str | None:
    """Apply ``report`` as the lease lifecycle says
    (:func:`shockwave.domain.lifecycle.report_effect`); the reason it is refused, or None.
    ``known``: the leases of the job, read already (:class:`store.leases.JobLeases`);
    ``events``: where the job's state events go (:func:`store.jobs.record_state`)."""
    reported = Report(report.state)
    revoked = lease.state == LeaseState.REVOKED.value
    effect = report_effect(
        lease.id,
        LeaseState(lease.state),
        lease.exit_code,
        job.id,
        JobState(job.state),
        reported,
        report.exit_code,
        report.stop_requested,
        superseded_by=successor_of(session, lease, known) if revoked else None,
    )
    if effect.lease is not None:
        move_lease(session, lease, effect.lease, exit_code=effect.exit_code)
    where = f"attempt {lease.id} on {lease.node_id}"
    if effect.job is JobEffect.RUN and job.state != JobState.RUNNING.value:
        record_state(
            session,
            job,
            JobState.RUNNING,
            f"attempt {lease.id} started on {lease.node_id}",
            events=events,
        )
    elif effect.job is JobEffect.REQUEUE:
        why = (
            "checkpointed"
            if reported is Report.CHECKPOINTED
            else f"stopped (exit {effect.exit_code})"
        )
        if lease.reason:
            why = f"{why}; {lease.reason}"
        stop_running(
            session, job, f"{where} {why}", except_attempt=lease.id, known=known, events=events
        )
    elif effect.job is JobEffect.SUCCEED:
        _finish(session, job, JobState.SUCCEEDED, f"{where} exited 0", lease.id, events)
    elif effect.job is JobEffect.FAIL:
        _finish(
            session, job, JobState.FAILED, f"{where} exited {effect.exit_code}", lease.id, events
        )
    return effect.refused


def _finish(
    session: Session,
    job: JobRow,
    target: JobState,
    reason: str,
    attempt: str,
    events: list[dict[str, Any]] | None = None,
) -> None:
    """End the job: through RUNNING if it never reported starting (it did run), then
    ``target``; its other attempts are revoked and the cluster's version bumped. A job that
    succeeded joins the population prior the predictor learns from. ``events``: where its
    state events go (:func:`store.jobs.record_state`)."""
    if target is JobState.SUCCEEDED and job.state != JobState.RUNNING.value:
        ran = f"attempt {attempt} ran (reported at exit)"
        record_state(session, job, JobState.RUNNING, ran, events=events)
    record_state(session, job, target, reason, events=events)
    if target is JobState.SUCCEEDED:
        population.learn_succeeded(session, job)
    revoke_live_leases(session, job.id, except_attempt=attempt)
    cluster_version.bump_and_request(session, f"job {job.id} {target.value.lower()}")


def _lease_public(row: Any, node_id: str, launch: Launch) -> LeasePublic:
    """A lease as its agent sees it, from a row of :data:`_LEASE_COLUMNS` and its job's
    launch fields."""
    directory = checkpoint_dir(row.job_id)
    gpus = [int(g) for g in json.loads(row.gpus)]
    return LeasePublic(
        attempt_id=row.id,
        job_id=row.job_id,
        node=node_id,
        round_index=row.round_index,
        gpus=gpus,
        ends_at=row.ends_at,
        began_at=row.began_at or row.issued_at,
        state=LeaseState(row.state),
        batch_size=row.batch_size,
        checkpoint_dir=directory,
        env={
            **launch.env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
            "SHOCKWAVE_JOB_ID": row.job_id,
            "SHOCKWAVE_ATTEMPT_ID": row.id,
            "SHOCKWAVE_BATCH_SIZE": str(row.batch_size),
            "SHOCKWAVE_CHECKPOINT_DIR": directory,
        },
        command=list(launch.command),
        image=launch.image,
    )


def job_token(session: Session, principal: Principal, attempt_id: str) -> JobTokenPublic:
    """A token scoped to the attempt's job and to the attempt itself, for its process; only
    for a live attempt of an unfinished job (a stale attempt gets a 409 with ``stop: true``).
    It replaces the attempt's earlier token, if any (revoked): one token per attempt. Once the
    attempt ends or is fenced the token is refused (:func:`store.tokens.principal_of`)."""
    row = visible_attempt(session, principal, attempt_id)
    if row.state not in LIVE_LEASES or JobState(row.job_state).terminal:
        raise Conflict(
            f"attempt {attempt_id} must stop",
            title="Stale attempt",
            stop=True,
            attempt_id=attempt_id,
        )
    token = _mint(session, row.job_id, attempt_id)
    session.commit()
    return JobTokenPublic(attempt_id=attempt_id, job_id=row.job_id, token=token)


def _mint(session: Session, job_id: str, attempt_id: str) -> str:
    """A new token for attempt ``attempt_id`` of job ``job_id``, revoking the attempt's earlier
    ones (stored hashed, not committed: the caller commits once for all it mints)."""
    revoke_attempt_tokens(session, [attempt_id])
    return add_attempt_tokens(session, {attempt_id: job_id})[attempt_id]
