"""The round driver's writes: a round's leases from a plan, and nodes lost to silence.

:func:`start_round` materializes round ``r = current_round + 1`` in one transaction, in steps:

1. Lock the active jobs (PENDING, RUNNING, SUSPENDED) and read the READY nodes.
2. Choose the round's jobs (:func:`choose_jobs`): the column for ``r`` of the plan with the
   highest state version that covers ``r``: ``plan`` when that version is the cluster's
   current one, ``previous_plan`` when the cluster has moved on since; with no such plan,
   ``greedy`` (the core's ``fifo`` policy with backfill: arrival order, narrower later jobs
   fill what a blocked wide job leaves). A plan's column is kept as the policy decided it,
   except that a later column (the plan's own ``rounds[0]`` was used up in an earlier round) or
   a previous plan's column is filled up with waiting jobs in arrival order: the policy filled
   only its first column (work conservation), and a stale column names jobs that have gone.
3. Place them (:func:`shockwave.placement.place`) over the READY nodes, each continuing job on
   the GPUs its live lease holds. The nodes are taken as identical (the core's cluster is
   homogeneous): ``gpus_per_node`` is the smallest READY node's GPU count, a larger node's
   extra GPUs stay idle, and READY nodes are numbered by id (:mod:`store.snapshot`).
4. Apply: a job placed on exactly its previous GPUs keeps its attempts (lease extension: new
   round index and end time); a job placed elsewhere or anew gets one new attempt per node it
   spans; every other live lease is revoked. A job revoked a round ago whose attempt never
   confirmed its checkpoint is suspended now (see :mod:`store.leases`).
5. Record the round (:class:`~store.tables.RoundRow`, with the plan's age and the lease counts)
   and move the cluster's ``current_round`` and round times, last.

Locks are taken in the order jobs, nodes, leases, cluster, the order the agent endpoints take
them in, so a report racing a boundary waits instead of deadlocking.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import update
from sqlmodel import Session, col, func, select

from shockwave.lifecycle import ACTIVE, LIVE_LEASES, JobState, LeaseState, NodeState
from shockwave.model import ValidationError
from shockwave.placement import place
from shockwave.policy import get_policy, make_params
from shockwave.snapshot import ActiveJob, JobProgress, Snapshot
from store import events
from store.cluster_version import bump_state_version, ensure_cluster
from store.leases import move_lease, stop_running
from store.plans import freshest_plan
from store.snapshot import WITHOUT_POLICY_STATE, GpuLayout, gpu_layout
from store.tables import ClusterRow, JobEventRow, JobRow, LeaseRow, NodeRow, PlanRow, RoundRow

SOURCES = ("plan", "previous_plan", "greedy")
GREEDY_POLICY = "fifo"


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """The round's jobs, highest priority first, and where they came from."""

    source: str
    jobs: tuple[str, ...]
    plan: PlanRow | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RoundOutcome:
    """What a boundary did. ``plan_age_s``: seconds from the plan's creation to the boundary
    (None for greedy). ``jobs``: placed jobs in priority order. ``suspended``: jobs moved to
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


@dataclasses.dataclass(frozen=True, slots=True)
class LostNodes:
    """Nodes marked LOST, the jobs sent back to the queue, the cluster's new state version."""

    nodes: tuple[str, ...]
    requeued: tuple[str, ...]
    state_version: int


SOURCE_WORDS = {
    "plan": "the plan",
    "previous_plan": "the previous plan",
    "greedy": "the greedy fallback (no plan)",
}


def preemption_reason(
    r: int, choice: Choice, job_id: str, unplaced: Mapping[str, str], placed: int
) -> str:
    """Why a job that held GPUs loses them in round ``r``, in words (the job's events, the
    stream, the dashboard and the demo show it)."""
    source = SOURCE_WORDS.get(choice.source, choice.source)
    if job_id in unplaced:
        return f"preempted in round {r}: chosen by {source} but did not fit ({unplaced[job_id]})"
    return (
        f"preempted in round {r}: {source} gives its GPUs to {placed} job(s) further behind "
        "their fair finish time"
    )


def _preempt(session: Session, leases: Sequence[LeaseRow], reason: str, now: datetime) -> None:
    """Revoke a job's ``leases`` (one per node its gang spans) for ``reason``, and record one
    ``preemption`` event on the job with it."""
    for lease in leases:
        move_lease(session, lease, LeaseState.REVOKED, now=now)
        lease.reason = reason[:256]
    if leases:
        first = leases[0]
        session.add(
            JobEventRow(
                job_id=first.job_id,
                kind="preemption",
                payload={
                    "attempt_ids": [lease.id for lease in leases],
                    "nodes": sorted({lease.node_id for lease in leases}),
                    "round": first.round_index,
                },
                reason=reason[:256],
                created_at=now,
            )
        )


def at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def start_round(session: Session, cluster_id: str, now: float) -> RoundOutcome:
    """Materialize the next round of ``cluster_id`` at ``now`` and commit (module docstring)."""
    ensure_cluster(session, cluster_id)
    cluster = session.get(
        ClusterRow, cluster_id, populate_existing=True, options=WITHOUT_POLICY_STATE
    )
    assert cluster is not None
    r = cluster.current_round + 1
    started, ends = at(now), at(now + cluster.round_seconds)
    jobs = {row.id: row for row in _lock_active_jobs(session)}
    layout = gpu_layout(session)
    choice = choose_jobs(session, cluster, r, jobs, layout, now)
    live = list(
        session.exec(
            select(LeaseRow)
            .where(col(LeaseRow.state).in_(LIVE_LEASES))
            .order_by(col(LeaseRow.id))
            .with_for_update()
        ).all()
    )
    held = _held_gpus(live, layout)
    assignment: Mapping[str, tuple[int, ...]] = {}
    unplaced: Mapping[str, str] = {}
    if layout is not None:
        requests = [(job_id, jobs[job_id].gpus) for job_id in choice.jobs]
        placement = place(layout.cluster, requests, held)
        assignment, unplaced = placement.assignment, placement.unplaced
    leases_of: dict[str, list[LeaseRow]] = defaultdict(list)
    for lease in live:
        leases_of[lease.job_id].append(lease)

    issued = extended = revoked = 0
    for job_id, gpus in assignment.items():
        if job_id in held and set(gpus) == set(held[job_id]):
            for lease in leases_of.pop(job_id):
                _extend(session, lease, r, ends, started)
                extended += 1
            continue
        moved = leases_of.pop(job_id, [])
        why = f"moved in round {r}: placed on other GPUs (checkpoint, then restart there)"
        _preempt(session, moved, why, started)
        revoked += len(moved)
        assert layout is not None
        for node_id, local in _by_node(layout, gpus).items():
            session.add(
                LeaseRow(
                    id=str(uuid.uuid4()),
                    job_id=job_id,
                    node_id=node_id,
                    round_index=r,
                    gpus=local,
                    issued_at=started,
                    ends_at=ends,
                    updated_at=started,
                )
            )
            issued += 1
    for job_id, leftover in leases_of.items():
        why = preemption_reason(r, choice, job_id, unplaced, len(assignment))
        _preempt(session, leftover, why, started)
        revoked += len(leftover)
    session.flush()
    suspended = _suspend_unconfirmed(session, jobs, set(assignment), r)

    plan = choice.plan
    age = max(0.0, now - plan.created_at.timestamp()) if plan else None
    session.add(
        RoundRow(
            cluster_id=cluster_id,
            index=r,
            plan_id=plan.id if plan else None,
            source=choice.source,
            jobs=list(assignment),
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
        source=choice.source,
        plan_id=plan.id if plan else None,
        plan_age_s=age,
        plan_solve_s=plan.solve_seconds if plan else None,
        plan_gap=plan.gain_gap if plan else None,
        jobs=tuple(assignment),
        issued=issued,
        extended=extended,
        revoked=revoked,
        suspended=suspended,
        started_at=started,
        ends_at=ends,
    )
    session.commit()
    return outcome


def choose_jobs(
    session: Session,
    cluster: ClusterRow,
    r: int,
    jobs: Mapping[str, JobRow],
    layout: GpuLayout | None,
    now: float,
) -> Choice:
    """The jobs of round ``r``: the freshest plan's column, else greedy (module docstring)."""
    plan = freshest_plan(session, cluster.id, r)
    if plan is None:
        return Choice("greedy", greedy(jobs.values(), layout, r, cluster.round_seconds, now))
    column = [j for j in dict.fromkeys(plan.rounds[r - plan.base_round]) if j in jobs]
    fresh = plan.state_version == cluster.state_version
    if r > plan.base_round or not fresh:
        column = _fill(column, jobs, layout)
    return Choice("plan" if fresh else "previous_plan", tuple(column), plan)


def greedy(
    rows: Iterable[JobRow],
    layout: GpuLayout | None,
    r: int,
    round_seconds: float,
    now: float,
) -> tuple[str, ...]:
    """The core's ``fifo`` policy with backfill on the active jobs (arrival order): the fast
    fallback when no plan covers the round. Nothing runs without a READY node."""
    if layout is None:
        return ()
    jobs = tuple(job for job in map(_active_job, rows) if job is not None)
    policy = get_policy(GREEDY_POLICY)
    snapshot = Snapshot(
        now=now, round_index=r, round_seconds=round_seconds, cluster=layout.cluster, jobs=jobs
    )
    return policy.decide(snapshot, make_params(policy, {"backfill": True})).jobs


def mark_lost_nodes(
    session: Session, cluster_id: str, now: float, ttl_s: float
) -> LostNodes | None:
    """Mark LOST every READY node silent for more than ``ttl_s`` at ``now`` and commit: its
    live and revoked attempts become LOST, and each job that ran there and runs nowhere else
    goes back to the queue (SUSPENDED with a checkpoint, else PENDING). Bumps the cluster's
    state version. None (and nothing written) when no node is silent."""
    cutoff = at(now - ttl_s)
    silent = _silent_nodes(session, cutoff)
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
        select(JobRow).where(col(JobRow.id).in_(job_ids)).order_by(col(JobRow.id)).with_for_update()
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


def _lock_active_jobs(session: Session) -> list[JobRow]:
    return list(
        session.exec(
            select(JobRow)
            .where(col(JobRow.state).in_(ACTIVE))
            .order_by(col(JobRow.created_at), col(JobRow.id))
            .with_for_update()
        ).all()
    )


def _active_job(row: JobRow) -> ActiveJob | None:
    """The job of ``row`` for the greedy order; None for a row the model now refuses (the
    planner reports it: :func:`store.snapshot.active_jobs`)."""
    try:
        spec = events.spec_of_row(row)
    except ValidationError:
        return None
    return ActiveJob(spec=spec, progress=JobProgress(batch_size=row.batch_size))


def _fill(column: list[str], jobs: Mapping[str, JobRow], layout: GpuLayout | None) -> list[str]:
    """``column`` plus waiting jobs, in arrival order, that fit in the GPUs it leaves (not a
    job the model now refuses: the planner left it out, :func:`store.snapshot.active_jobs`)."""
    if layout is None:
        return column
    free = layout.cluster.total_gpus - sum(jobs[j].gpus for j in column)
    filled = list(column)
    for job_id, row in jobs.items():
        if job_id not in filled and row.gpus <= free and _active_job(row) is not None:
            filled.append(job_id)
            free -= row.gpus
    return filled


def _held_gpus(live: Sequence[LeaseRow], layout: GpuLayout | None) -> dict[str, tuple[int, ...]]:
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


def _by_node(layout: GpuLayout, gpus: Sequence[int]) -> dict[str, list[int]]:
    """Global GPU indices grouped into local indices per node id."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for g in sorted(gpus):
        by_node[layout.node_ids[g // layout.gpus_per_node]].append(g % layout.gpus_per_node)
    return dict(by_node)


def _extend(session: Session, lease: LeaseRow, r: int, ends: datetime, now: datetime) -> None:
    lease.round_index = r
    lease.ends_at = ends
    lease.updated_at = now
    session.add(lease)


def _suspend_unconfirmed(
    session: Session, jobs: Mapping[str, JobRow], placed: set[str], r: int
) -> tuple[str, ...]:
    """RUNNING jobs that hold no lease in round ``r`` and whose last attempt ended before
    round ``r - 1`` (revoked a round ago, never confirmed): back to the queue."""
    running = [j for j in jobs if jobs[j].state == JobState.RUNNING.value and j not in placed]
    if not running:
        return ()
    last_round = dict(
        session.exec(
            select(LeaseRow.job_id, func.max(LeaseRow.round_index))
            .where(col(LeaseRow.job_id).in_(running))
            .group_by(col(LeaseRow.job_id))
        ).all()
    )
    suspended = []
    for job_id in running:
        latest = last_round.get(job_id)
        if latest is not None and latest >= r - 1:
            continue
        reason = f"preempted before round {r}; its attempt never confirmed a checkpoint"
        if stop_running(session, jobs[job_id], reason, except_attempt=None):
            suspended.append(job_id)
    return tuple(suspended)


def _silent_nodes(session: Session, cutoff: datetime) -> list[str]:
    nodes = session.exec(select(NodeRow).where(NodeRow.state == NodeState.READY)).all()
    return sorted(n.id for n in nodes if _silent(n, cutoff))


def _silent(node: NodeRow, cutoff: datetime) -> bool:
    last = node.last_heartbeat_at or node.registered_at
    return last < cutoff
