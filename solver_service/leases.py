"""The round driver's writes: gather, run the core's round engine, apply.

:func:`start_round` materializes round ``r = current_round + 1`` in one transaction:

1. **Gather** (the boundary gate closed first, :mod:`store.boundary_gate`: the agents' polls
   in flight end first and the others defer their job work until the commit; then locks in
   the order jobs, nodes, leases, cluster, the order the agent endpoints take them in, so a
   report racing a boundary waits instead of deadlocking): the active jobs
   (PENDING, RUNNING, SUSPENDED) in arrival order, their ids and states only (the fields fixed
   at submission are read once per job and kept, :class:`KnownJobs`), the READY nodes with
   their real sizes (:func:`store.snapshot.gpu_layout`), the live leases as global GPUs, the
   freshest plan with a column for ``r`` (:func:`store.plans.freshest_plan`; none: the newest
   plan, whose last column the engine repeats; named by one small read, and read only when
   the driver has not kept it from an earlier boundary or fill, :class:`KeptPlan`), and the
   RUNNING jobs whose last lease is older
   than round ``r - 1`` (revoked a round ago, never confirmed a checkpoint).
2. **Engine** (:func:`shockwave.rounds.engine.boundary`, the same rule the simulator runs): the
   plan's column (``plan``, or ``previous_plan`` when the cluster has moved on since, or when the
   newest plan ends before ``r``), else first in, first out (``greedy``); placement over
   nodes of any size; GPUs the column leaves free go to waiting jobs that fit (work
   conservation); the changes with their reasons.
3. **Apply**: an ``extend`` moves the job's attempts to round ``r`` (new end time); an
   ``issue`` writes one new attempt per node the gang spans; a ``revoke`` revokes the live
   lease; a ``suspend`` sends the job back to the queue (see :mod:`store.leases`). The round
   is recorded (:class:`~store.tables.RoundRow`, with the plan's age and the lease counts) and
   the cluster's ``current_round`` and round times move, last. The writes are bulk
   statements (:func:`_apply`): a boundary of thousands of leases is a few statements.

:func:`fill_round` is work conservation between boundaries (:func:`shockwave.rounds.engine.fill`):
GPUs that no live lease holds and no revoked attempt still uses go at once to waiting jobs
that fit (first those the freshest plan stored by the round's start wants in the next round,
as in the simulator, then in arrival order), each with a lease of the current round (to its
end); the round's record gains the jobs and the leases issued. The driver calls it whenever
the cluster's state version moved (a job submitted, finished, failed or cancelled, a node
joined); on a cluster with no GPU free it returns after one read, locking nothing.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple, TypeVar

from sqlalchemy import insert, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, func, select

from shockwave.domain.lifecycle import (
    ACTIVE,
    LIVE_LEASES,
    JobState,
    LeaseState,
    NodeState,
    lease_transition,
)
from shockwave.domain.model import ValidationError
from shockwave.rounds import engine
from shockwave.rounds.engine import SOURCES
from solver_service.collector import quiet_collector
from store import boundary_gate, events, tenants
from store.cluster_version import bump_state_version, ensure_cluster
from store.db import among, one_statement
from store.leases import move_lease, stop_running
from store.plans import PlanRef, freshest_plan_ref, newest_plan_ref
from store.snapshot import WITHOUT_POLICY_STATE, GpuLayout, free_gpus, gpu_layout
from store.tables import ClusterRow, JobEventRow, JobRow, LeaseRow, NodeRow, PlanRow, RoundRow

_T = TypeVar("_T")

__all__ = [
    "SOURCES",
    "FillOutcome",
    "KnownJobs",
    "LostNodes",
    "RoundOutcome",
    "fill_round",
    "round_end",
    "start_round",
]


@dataclasses.dataclass(frozen=True, slots=True)
class RoundOutcome:
    """What a boundary did. ``plan_age_s``: seconds from the plan's creation to the boundary
    (None for greedy); ``plan_version``: the state version the plan was made at (None for
    greedy). ``jobs``: placed jobs in priority order. ``suspended``: jobs moved to
    the queue because a revoked attempt never confirmed its checkpoint."""

    index: int
    source: str
    plan_id: int | None
    plan_age_s: float | None
    plan_solve_s: float | None
    plan_gap: float | None
    jobs: tuple[str, ...]
    issued: int
    extended: int
    revoked: int
    suspended: tuple[str, ...]
    started_at: datetime
    ends_at: datetime
    plan_version: int | None = None
    unfit: Mapping[str, str] = dataclasses.field(default_factory=dict)
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Wall seconds of each step of the boundary: ``gather`` (reads and locks), ``engine``,
    ``apply`` (lease and round writes, flushed) and ``commit``."""


@dataclasses.dataclass(frozen=True, slots=True)
class LostNodes:
    """Nodes marked LOST, the jobs sent back to the queue, the cluster's new state version."""

    nodes: tuple[str, ...]
    requeued: tuple[str, ...]
    state_version: int


def at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


SLACK_S = 1e-3
"""Times are stored to the microsecond: a step this close to a due time counts as on time (the
round driver's boundary and half-way checks, and a round's cadence)."""


def round_end(now: float, due: float | None, length: float, lead: float = 0.0) -> float:
    """When a round that begins at ``now`` ends, the last one having been due to end at
    ``due``: a boundary that begins less than half a round late keeps the cadence (``due +
    length``: a few milliseconds of lateness each round would otherwise add up, 0.3 simulated
    seconds a round in a replay at 120x, half a round over a 190-round trace), and so does one
    begun up to ``lead`` early (the driver's boundary lead, :class:`DriverSettings`); the first
    round, and one begun later (a takeover, an outage), run a full ``length`` from ``now``, so
    no round is shorter than half a round. Rounds are never skipped."""
    if due is not None and -(SLACK_S + lead) <= now - due < length / 2:
        return due + length
    return now + length


def start_round(
    session: Session,
    cluster_id: str,
    now: float,
    lead: float = 0.0,
    known: KnownJobs | None = None,
) -> RoundOutcome:
    """Materialize the next round of ``cluster_id`` at ``now`` and commit (module docstring).
    ``lead``: how early before the current round's end ``now`` may be (the round keeps its
    cadence). ``known``: what earlier boundaries and fills learnt of the jobs' fixed fields
    (the driver keeps one; default: nothing, every active job's spec is read). The collector
    is quiet meanwhile (:mod:`solver_service.collector`)."""
    with quiet_collector():
        return _start_round(session, cluster_id, now, lead, known)


def _start_round(
    session: Session, cluster_id: str, now: float, lead: float, known: KnownJobs | None
) -> RoundOutcome:
    clock = [time.perf_counter()]
    phases: dict[str, float] = {}

    def lap(phase: str) -> None:
        clock.append(time.perf_counter())
        phases[phase] = clock[-1] - clock[-2]

    ensure_cluster(session, cluster_id)
    cluster = session.get(
        ClusterRow, cluster_id, populate_existing=True, options=WITHOUT_POLICY_STATE
    )
    assert cluster is not None
    r = cluster.current_round + 1
    due = cluster.round_ends_at.timestamp() if cluster.round_ends_at is not None else None
    started, ends = at(now), at(round_end(now, due, cluster.round_seconds, lead))
    boundary_gate.close(session)
    jobs = _lock_active_jobs(session, known if known is not None else KnownJobs())
    layout = gpu_layout(session)
    live = _lock_live_leases(session)
    held = _held_gpus(live, layout)
    plan = _kept_plan(
        session,
        freshest_plan_ref(session, cluster.id, r) or newest_plan_ref(session, cluster.id),
        known,
    )
    waiting = _waiting(jobs.values(), plan.widths if plan is not None else {})
    unconfirmed = _unconfirmed(session, jobs, held, r)
    settling = _settling(session)
    limits = tenants.core_tenants(session)
    lap("gather")
    changes = engine.boundary(
        r=r,
        now=now,
        state_version=cluster.state_version,
        jobs=waiting,
        plans=[_engine_plan(plan, now)] if plan is not None else [],
        leases=held,
        cluster=layout.cluster if layout is not None else None,
        unconfirmed=unconfirmed,
        conserve=True,
        settling=settling,
        tenants=limits,
    )
    lap("engine")
    # a lease issued just ahead of its boundary counts from the boundary (the round's start)
    began = at(max(now, ends.timestamp() - cluster.round_seconds))
    issued, extended, revoked, suspended = _apply(
        session, changes, jobs, live, layout, r, started, ends, began
    )
    used = plan if changes.plan is not None else None
    age = max(0.0, now - used.created_at.timestamp()) if used else None
    session.add(
        RoundRow(
            cluster_id=cluster_id,
            index=r,
            plan_id=used.id if used else None,
            source=changes.source,
            jobs=list(changes.assignment),
            started_at=started,
            ends_at=ends,
            plan_age_s=age,
            leases_issued=issued,
            leases_extended=extended,
            leases_revoked=revoked,
        )
    )
    session.flush()
    session.execute(
        update(ClusterRow)
        .where(col(ClusterRow.id) == cluster_id)
        .values(current_round=r, round_started_at=started, round_ends_at=ends, updated_at=started)
    )
    outcome = RoundOutcome(
        index=r,
        source=changes.source,
        plan_id=used.id if used else None,
        plan_age_s=age,
        plan_solve_s=used.solve_seconds if used else None,
        plan_gap=used.gain_gap if used else None,
        plan_version=used.view.state_version if used else None,
        jobs=tuple(changes.assignment),
        issued=issued,
        extended=extended,
        revoked=revoked,
        suspended=suspended,
        started_at=started,
        ends_at=ends,
        unfit=dict(changes.unfit),
        phases=phases,
    )
    lap("apply")
    session.commit()
    lap("commit")
    return outcome


@dataclasses.dataclass(frozen=True, slots=True)
class FillOutcome:
    """What a mid-round fill did: the round the jobs join, the jobs started (in the engine's
    order) and the lease rows issued (one per node a gang spans)."""

    round_index: int
    jobs: tuple[str, ...]
    issued: int
    nodes: tuple[str, ...] | None = ()
    """The nodes whose leases it changed (None: it may have changed any node's)."""


def fill_round(
    session: Session,
    cluster_id: str,
    clock: Callable[[], float],
    known: KnownJobs | None = None,
) -> FillOutcome:
    """Start waiting jobs on the GPUs no live lease holds, with leases to the current round's
    end, and commit (module docstring). Nothing is written before the first round or once the
    current round's end has passed (the boundary is due).

    The leases are stamped ``clock()`` read once the jobs and live leases are locked, not a
    time read before: an exit report that committed while the fill waited for those locks
    freed the GPUs the fill takes, and its lease's ``updated_at`` must not be later than the
    new lease's ``issued_at`` (the hand-over the chaos checker accepts). ``known``: as for
    :func:`start_round`."""
    cluster = session.get(
        ClusterRow, cluster_id, populate_existing=True, options=WITHOUT_POLICY_STATE
    )
    if cluster is None or cluster.round_ends_at is None:
        return FillOutcome(-1, (), 0)
    r = cluster.current_round
    ends = cluster.round_ends_at
    if not _any_gpu_free(session):
        session.rollback()
        return FillOutcome(r, (), 0)
    boundary_gate.close(session)
    jobs = _lock_active_jobs(session, known if known is not None else KnownJobs())
    layout = gpu_layout(session)
    live = _lock_live_leases(session)
    now = clock()
    if now >= ends.timestamp():
        session.rollback()
        return FillOutcome(r, (), 0)
    held = _held_gpus(live, layout)
    if layout is None or all(j in held for j in jobs):
        session.rollback()
        return FillOutcome(r, (), 0)
    # the plans the round's boundary had, as the simulator's fills know only the plans made
    # by the boundary: a plan made since (for round r + 1, at a change mid-round) would have
    # the fills follow a decision the simulator's never see (Gavel, which plans one round at
    # a time, fills in arrival order there and in its next round's order here)
    plan = _kept_plan(
        session,
        freshest_plan_ref(session, cluster.id, r + 1, made_by=cluster.round_started_at),
        known,
    )
    upcoming = _engine_plan(plan) if plan is not None else None
    prefer = engine.next_column(upcoming, r)
    changes = engine.fill(
        types=upcoming.types if upcoming is not None else {},
        jobs=_waiting(jobs.values(), plan.widths if plan is not None else {}),
        leases=held,
        cluster=layout.cluster,
        prefer=prefer,
        busy=_still_checkpointing(session, layout),
        settling=_settling(session),
        tenants=tenants.core_tenants(session),
    )
    if not changes.changes:
        session.rollback()
        return FillOutcome(r, (), 0)
    issued, _, _, _ = _apply(session, changes, jobs, live, layout, r, at(now), ends, at(now))
    issues = [c for c in changes.changes if c.kind is engine.ChangeKind.ISSUE]
    nodes: tuple[str, ...] | None = None
    if layout is not None and len(issues) == len(changes.changes):
        nodes = tuple(sorted({n for c in issues for n in layout.by_node(c.gpus)}))
    row = session.get(RoundRow, (cluster_id, r), with_for_update=True)
    if row is not None:  # the round's record lists every job leased in it
        row.jobs = [*row.jobs, *(j for j in changes.assignment if j not in row.jobs)]
        row.leases_issued += issued
        session.add(row)
    session.commit()
    return FillOutcome(r, tuple(changes.assignment), issued, nodes)


def _any_gpu_free(session: Session) -> bool:
    """Whether a READY node has a GPU that no live lease holds and no revoked attempt still
    uses (:func:`store.snapshot.free_gpus`: one aggregate), read without locks: a fill can
    start nothing on a cluster that has none (at scale, the common case), so it then locks no
    job. Every change that frees a GPU commits before the version bump that asks for the
    fill, so this read sees it."""
    return free_gpus(session) > 0


@dataclasses.dataclass(frozen=True, slots=True)
class KeptPlan:
    """What a boundary or a fill uses of a stored plan, kept by the driver (a stored plan never
    changes): its row's figures and its engine view (``usable_from`` its creation)."""

    id: int
    created_at: datetime
    widths: Mapping[str, int]
    solve_seconds: float | None
    gain_gap: float | None
    view: engine.Plan

    @classmethod
    def of(cls, row: PlanRow) -> KeptPlan:
        assert row.id is not None
        return cls(
            id=row.id,
            created_at=row.created_at,
            widths=dict(row.widths or {}),
            solve_seconds=row.solve_seconds,
            gain_gap=row.gain_gap,
            view=engine.Plan(
                base_round=row.base_round,
                rounds=tuple(tuple(column) for column in row.rounds),
                state_version=row.state_version,
                usable_from=row.created_at.timestamp(),
                plan_id=row.id,
                types=dict(row.types or {}),
            ),
        )


def _kept_plan(session: Session, ref: PlanRef | None, known: KnownJobs | None) -> KeptPlan | None:
    """The plan ``ref`` names, from ``known`` when an earlier boundary or fill read it, else
    read (its row carries a whole window of job ids: megabytes at 10,000 jobs) and kept."""
    if ref is None:
        return None
    kept = known.plans.get(ref) if known is not None else None
    if kept is None:
        row = session.get(PlanRow, ref[0])
        if row is None:
            return None
        kept = KeptPlan.of(row)
        if known is not None:
            known.keep_plan(ref, kept)
    return kept


def _engine_plan(plan: KeptPlan, now: float | None = None) -> engine.Plan:
    """The engine's view of a stored plan. ``now``: the boundary's time, stamped before its
    reads. A plan the boundary read is committed, so it is on hand: its ``usable_from`` is
    at most ``now`` (a plan stored while the boundary waited for its locks was stamped after
    ``now``, and the engine took it for one not back yet: the round went first in, first
    out, as if there were no plan)."""
    if now is None or plan.view.usable_from <= now:
        return plan.view
    return dataclasses.replace(plan.view, usable_from=now)


def _apply(
    session: Session,
    changes: engine.RoundChanges,
    jobs: Mapping[str, ActiveJob],
    live: Sequence[LiveLease],
    layout: GpuLayout | None,
    r: int,
    started: datetime,
    ends: datetime,
    began: datetime,
) -> tuple[int, int, int, tuple[str, ...]]:
    """Write the engine's changes: the lease rows issued, extended and revoked, and the jobs
    actually suspended. At a boundary, a live lease the engine could not see (held off the
    READY nodes) is revoked too. ``began``: when the issued leases' time counts from.

    Written in bulk: the extended leases in one ``UPDATE``, the revoked ones in one ``UPDATE``
    a reason and their events in one ``INSERT`` (:func:`_revoke`), the issued ones in one
    ``INSERT``; only the few jobs suspended go through the ORM
    (:func:`store.leases.stop_running`). On Postgres an ``UPDATE`` names any number of leases
    in one array parameter (:func:`store.db.among`); elsewhere, and for the inserts, a
    statement per chunk of :data:`BULK_ROWS`."""
    leases_of: dict[str, list[LiveLease]] = defaultdict(list)
    for lease in live:
        leases_of[lease.job_id].append(lease)
    new: list[dict[str, object]] = []
    extend: list[str] = []
    revoke: list[tuple[list[LiveLease], str]] = []
    suspend: list[engine.Change] = []
    for change in changes.changes:
        if change.kind is engine.ChangeKind.REVOKE:
            moved = leases_of.pop(change.job_id, [])
            revoke.append((moved, f"preempted in round {r}: {change.reason}"))
        elif change.kind is engine.ChangeKind.EXTEND:
            extend.extend(lease.id for lease in leases_of.pop(change.job_id, []))
        elif change.kind is engine.ChangeKind.ISSUE:
            assert layout is not None
            for node_id, local in layout.by_node(change.gpus).items():
                new.append(
                    {
                        "id": str(uuid.uuid4()),
                        "job_id": change.job_id,
                        "node_id": node_id,
                        "round_index": r,
                        "gpus": local,
                        "state": LeaseState.ISSUED.value,
                        "reason": "",
                        "issued_at": started,
                        "ends_at": ends,
                        "updated_at": started,
                        "began_at": began,
                        "first_ends_at": ends,
                    }
                )
        else:
            suspend.append(change)
    if changes.source != "fill":
        for leftover in leases_of.values():
            revoke.append((leftover, f"preempted in round {r}: its lease is off the READY nodes"))
    revoked = _revoke(session, revoke, started)
    for chunk in _id_chunks(session, extend):
        session.execute(
            update(LeaseRow)
            .where(among(col(LeaseRow.id), chunk, session))
            .values(round_index=r, ends_at=ends, updated_at=started),
            execution_options={"synchronize_session": False},
        )
    for rows in _chunks(new):
        session.execute(insert(LeaseRow), rows)
    session.flush()
    suspended = tuple(
        c.job_id
        for c in suspend
        if c.job_id in jobs
        and (row := session.get(JobRow, c.job_id)) is not None
        and stop_running(session, row, c.reason, except_attempt=None)
    )
    return len(new), len(extend), revoked, suspended


BULK_ROWS = 1000
"""Rows a bulk statement of the boundary writes at most (bound parameters stay well within
every database's limit)."""


def _chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), BULK_ROWS):
        yield items[start : start + BULK_ROWS]


def _id_chunks(session: Session, ids: Sequence[str]) -> Iterator[Sequence[str]]:
    """The ids a statement names (:func:`store.db.among`): all at once on Postgres (one array
    parameter), else :data:`BULK_ROWS` at a time."""
    if one_statement(session):
        if ids:
            yield ids
    else:
        yield from _chunks(ids)


def _revoke(session: Session, revoke: Sequence[tuple[list[LiveLease], str]], now: datetime) -> int:
    """Revoke each job's live ``leases`` in ``revoke`` (one per node its gang spans) for its
    reason, and record one ``preemption`` event on the job with it; how many leases were
    revoked. In bulk: one ``UPDATE`` a reason and chunk (every live state may move to
    REVOKED, :func:`shockwave.domain.lifecycle.lease_transition`, and the rows are locked), one
    multi-row ``INSERT`` of the events a chunk."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    events: list[dict[str, object]] = []
    for leases, reason in revoke:
        if not leases:
            continue
        for lease in leases:
            lease_transition(lease.state, LeaseState.REVOKED)
        by_reason[reason[:256]].extend(lease.id for lease in leases)
        events.append(
            {
                "job_id": leases[0].job_id,
                "kind": "preemption",
                "payload": {
                    "attempt_ids": [lease.id for lease in leases],
                    "nodes": sorted({lease.node_id for lease in leases}),
                    "round": leases[0].round_index,
                },
                "reason": reason[:256],
                "created_at": now,
            }
        )
    for reason, ids in by_reason.items():
        for chunk in _id_chunks(session, ids):
            session.execute(
                update(LeaseRow)
                .where(among(col(LeaseRow.id), chunk, session))
                .values(state=LeaseState.REVOKED.value, reason=reason, updated_at=now),
                execution_options={"synchronize_session": False},
            )
    for rows in _chunks(events):
        session.execute(insert(JobEventRow), rows)
    return sum(len(ids) for ids in by_reason.values())


class LiveLease(NamedTuple):
    """The columns of a live lease a boundary or a fill reads."""

    id: str
    job_id: str
    node_id: str
    gpus: list[int]
    state: LeaseState
    round_index: int


def _lock_live_leases(session: Session) -> list[LiveLease]:
    rows = session.execute(
        sa_select(
            col(LeaseRow.id),
            col(LeaseRow.job_id),
            col(LeaseRow.node_id),
            col(LeaseRow.gpus),
            col(LeaseRow.state),
            col(LeaseRow.round_index),
        )
        .where(col(LeaseRow.state).in_(LIVE_LEASES))
        .order_by(col(LeaseRow.id))
        .with_for_update()
    ).all()
    return [
        LiveLease(lease, job, node, gpus, LeaseState(state), index)
        for lease, job, node, gpus, state, index in rows
    ]


def _still_checkpointing(session: Session, layout: GpuLayout) -> tuple[int, ...]:
    """GPUs of REVOKED attempts whose process has not exited yet (it is checkpointing)."""
    revoked = session.exec(
        select(LeaseRow.node_id, LeaseRow.gpus).where(LeaseRow.state == LeaseState.REVOKED)
    ).all()
    return tuple(g for node_id, gpus in revoked for g in layout.global_gpus(node_id, gpus))


def _settling(session: Session) -> frozenset[str]:
    """Jobs with a REVOKED attempt whose end is not confirmed yet (it is checkpointing)."""
    rows = session.exec(select(LeaseRow.job_id).where(LeaseRow.state == LeaseState.REVOKED))
    return frozenset(rows.all())


def _unconfirmed(
    session: Session, jobs: Mapping[str, ActiveJob], held: Mapping[str, tuple[int, ...]], r: int
) -> tuple[str, ...]:
    """RUNNING jobs with no live lease whose last attempt ended before round ``r - 1`` (revoked
    a round ago, never confirmed a checkpoint)."""
    running = [j for j in jobs if jobs[j].state == JobState.RUNNING.value and j not in held]
    if not running:
        return ()
    last_round = dict(
        session.exec(
            select(LeaseRow.job_id, func.max(LeaseRow.round_index))
            .where(among(col(LeaseRow.job_id), running, session))
            .group_by(col(LeaseRow.job_id))
        ).all()
    )
    return tuple(j for j in running if (last := last_round.get(j)) is not None and last < r - 1)


def mark_lost_nodes(
    session: Session, cluster_id: str, now: float, ttl_s: float
) -> LostNodes | None:
    """Mark LOST every READY node silent for more than ``ttl_s`` and commit: its live and
    revoked attempts become LOST, and each job that ran there and runs nowhere else goes back
    to the queue (SUSPENDED with a checkpoint, else PENDING). Bumps the cluster's state
    version. None (and nothing written) when no node is silent.

    Silence is measured on the servers' answering clock (:func:`answering_clock`), not on
    ``now``: a contact is stamped when its request arrived, and a server that takes long to
    get to its requests stamps none meanwhile, for any node. So the TTL only counts time in
    which the servers were answering: an API slowed down (overloaded, paused) never makes
    live nodes LOST, while a node that stopped talking is LOST a TTL after the others'
    contacts moved past its last one.

    Asked every step of the driver, so the common answer (no node silent) is one aggregate
    over the READY nodes' contacts (their number, the newest and the oldest): each node's
    contact is read only when the oldest is past the cutoff."""
    count, newest, oldest = _contact_span(session)
    if count == 0 or oldest is None or newest is None:
        return None
    cutoff = at(_answered_until(count, newest.timestamp(), now, ttl_s) - ttl_s)
    if oldest >= cutoff:
        return None
    ready = _ready_contacts(session)
    silent = sorted(node for node, last in ready.items() if last < cutoff)
    if not silent:
        return None
    leases = session.exec(
        select(LeaseRow).where(
            col(LeaseRow.node_id).in_(silent),
            col(LeaseRow.state).in_((*LIVE_LEASES, LeaseState.REVOKED)),
        )
    ).all()
    job_ids = sorted({lease.job_id for lease in leases})
    jobs = session.exec(
        select(JobRow)
        .where(col(JobRow.id).in_(job_ids))
        .order_by(col(JobRow.created_at), col(JobRow.id))
        .with_for_update()
    ).all()
    nodes = session.exec(select(NodeRow).where(col(NodeRow.id).in_(silent)).with_for_update()).all()
    lost = tuple(sorted(n.id for n in nodes if n.state == NodeState.READY and _silent(n, cutoff)))
    if not lost:
        session.rollback()
        return None
    stamp = at(now)
    ran_there: set[str] = set()
    for lease in session.exec(
        select(LeaseRow)
        .where(
            col(LeaseRow.node_id).in_(lost),
            col(LeaseRow.state).in_((*LIVE_LEASES, LeaseState.REVOKED)),
        )
        .with_for_update()
    ).all():
        move_lease(session, lease, LeaseState.LOST, now=stamp)
        ran_there.add(lease.job_id)
    for node in nodes:
        if node.id in lost:
            node.state = NodeState.LOST.value
            session.add(node)
    session.flush()
    requeued = tuple(
        job.id
        for job in jobs
        if job.id in ran_there
        and stop_running(session, job, "its node was lost", except_attempt=None)
    )
    session.flush()
    version, _ = bump_state_version(session, cluster_id)
    session.commit()
    return LostNodes(nodes=lost, requeued=requeued, state_version=version)


def _waiting(rows: Iterable[ActiveJob], widths: Mapping[str, int]) -> list[engine.Waiting]:
    """The active jobs the engine may start, in arrival order: not a row the model now refuses
    (the planner leaves it out with a reason, :func:`store.snapshot.active_jobs`), so a stored
    poison job reaches neither the fallback order nor spare GPUs. Each on its requested count,
    an elastic job on the count the plan gives it (``widths``, docs/elastic.md): a lease on
    another count than its last attempt's is a new attempt, as a move is. Each with its
    tenant, whose ``max_gpus`` the engine keeps it within."""
    waiting = []
    for row in rows:
        if not row.valid:
            continue
        width = widths.get(row.id, row.gpus) if row.elastic else row.gpus
        waiting.append(engine.Waiting(row.id, width, row.tenant))
    return waiting


class ActiveJob(NamedTuple):
    """What a boundary or a fill reads of an active job: its state and the fields fixed at
    submission (``valid``: the model accepts its stored spec; ``elastic``: it has a range)."""

    id: str
    state: str
    gpus: int
    tenant: str
    valid: bool
    elastic: bool


@dataclasses.dataclass
class KnownJobs:
    """What the driver keeps from one boundary to the next. The fields of jobs fixed at
    submission that boundaries need beyond the job's row's state (whether the model accepts
    the spec, whether the job is elastic), by job id: a job's spec is read and checked once,
    not every round; only the active jobs are kept. And the plans last read
    (:class:`KeptPlan`, at most :data:`KEPT_PLANS`): a plan is read once, not at every
    boundary and fill that follows it."""

    fixed: dict[str, tuple[bool, bool]] = dataclasses.field(default_factory=dict)
    plans: dict[PlanRef, KeptPlan] = dataclasses.field(default_factory=dict)

    def keep_plan(self, ref: PlanRef, plan: KeptPlan) -> None:
        self.plans[ref] = plan
        while len(self.plans) > KEPT_PLANS:
            del self.plans[next(iter(self.plans))]

    def learn(self, session: Session, job_ids: Sequence[str]) -> None:
        """Read and check the specs of ``job_ids`` not known yet."""
        unknown = [j for j in job_ids if j not in self.fixed]
        for chunk in _id_chunks(session, unknown):
            for row in session.exec(select(JobRow).where(among(col(JobRow.id), chunk, session))):
                self.fixed[row.id] = (_accepted(row), row.elastic is not None)

    def keep_only(self, job_ids: Iterable[str]) -> None:
        kept = set(job_ids)
        self.fixed = {j: facts for j, facts in self.fixed.items() if j in kept}


KEPT_PLANS = 4
"""Plans the driver keeps (a boundary's and its fills' are the last one or two)."""


def _accepted(row: JobRow) -> bool:
    try:
        events.spec_of_row(row)
    except ValidationError:
        return False
    return True


def _lock_active_jobs(session: Session, known: KnownJobs) -> dict[str, ActiveJob]:
    """The active jobs in arrival order, their rows locked; each one's fixed fields from
    ``known`` (read for the jobs it does not know yet)."""
    rows = session.execute(
        sa_select(col(JobRow.id), col(JobRow.state), col(JobRow.gpus), col(JobRow.tenant))
        .where(col(JobRow.state).in_(ACTIVE))
        .order_by(col(JobRow.created_at), col(JobRow.id))
        .with_for_update()
    ).all()
    ids = [row[0] for row in rows]
    known.learn(session, ids)
    known.keep_only(ids)
    return {
        job_id: ActiveJob(job_id, state, gpus, tenant, *known.fixed[job_id])
        for job_id, state, gpus, tenant in rows
    }


def _held_gpus(live: Sequence[LiveLease], layout: GpuLayout | None) -> dict[str, tuple[int, ...]]:
    """Each job's global GPUs from its live leases; a job with a lease off the READY layout
    (a lost node, a GPU past the homogeneous width) holds nothing placement can keep."""
    if layout is None:
        return {}
    held: dict[str, tuple[int, ...]] = {}
    broken: set[str] = set()
    for lease in live:
        gpus = layout.global_gpus(lease.node_id, lease.gpus)
        if len(gpus) != len(lease.gpus):
            broken.add(lease.job_id)
        held[lease.job_id] = held.get(lease.job_id, ()) + gpus
    return {job: tuple(sorted(gpus)) for job, gpus in held.items() if job not in broken}


def _ready_contacts(session: Session) -> dict[str, datetime]:
    """Each READY node's last contact (its registration before its first heartbeat): three
    columns a node, read when the oldest contact is past the cutoff (:func:`_contact_span`)."""
    rows = session.execute(
        sa_select(
            col(NodeRow.id), col(NodeRow.last_heartbeat_at), col(NodeRow.registered_at)
        ).where(col(NodeRow.state) == NodeState.READY)
    ).all()
    return {node: heartbeat or registered for node, heartbeat, registered in rows}


_CONTACT = func.coalesce(col(NodeRow.last_heartbeat_at), col(NodeRow.registered_at))
"""A node's last contact (its registration before its first heartbeat)."""


def _contact_span(session: Session) -> tuple[int, datetime | None, datetime | None]:
    """How many nodes are READY, and the newest and the oldest of their last contacts: one
    aggregate, one row."""
    count, newest, oldest = session.execute(
        sa_select(func.count(), func.max(_CONTACT), func.min(_CONTACT)).where(
            col(NodeRow.state) == NodeState.READY
        )
    ).one()
    return int(count), newest, oldest


def answering_clock(contacts: Sequence[datetime], now: float, ttl_s: float) -> float:
    """The time up to which the servers are known to have been answering: the newest of the
    READY nodes' ``contacts`` (each stamped at its request's arrival), or ``now`` with fewer
    than two READY nodes (no other node to compare with). Never later than ``now``, never
    more than ``ttl_s`` behind it: a node whose peers all went silent too (the whole cluster
    down) is still LOST, at most a TTL later."""
    newest = max((c.timestamp() for c in contacts), default=now)
    return _answered_until(len(contacts), newest, now, ttl_s)


def _answered_until(count: int, newest: float, now: float, ttl_s: float) -> float:
    """:func:`answering_clock` of ``count`` READY nodes whose newest contact is ``newest``."""
    if count < 2:
        return now
    return min(now, max(newest, now - ttl_s))


def _silent(node: NodeRow, cutoff: datetime) -> bool:
    last = node.last_heartbeat_at or node.registered_at
    return last < cutoff
