"""What operators and integrators read beyond single jobs: the recent rounds with who held which
GPU, a job's attempts with their output tails, and the stream of job state changes.

Everything is scoped like the rest of the data layer: admins see all, a user its own tenant's
jobs (other tenants' jobs in a round are shown as GPUs taken, without ids), a job token its job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import JobState
from store import jobs
from store.plans import newest_plan
from store.principals import Principal, Role, require
from store.tables import ClusterRow, JobEventRow, JobRow, LeaseRow, NodeRow, PlanRow, RoundRow

STREAM_KINDS = ("state", "preemption")
"""The job events the stream carries: state changes and preemptions (with their reasons)."""


@dataclass(frozen=True, slots=True)
class Held:
    """One job's GPUs in one round: ``job_id`` None for another tenant's job."""

    job_id: str | None
    name: str | None
    node_id: str
    gpus: list[int]
    state: str


@dataclass(frozen=True, slots=True)
class RoundView:
    index: int
    source: str
    started_at: datetime
    ends_at: datetime
    held: list[Held]


def recent_rounds(session: Session, principal: Principal, limit: int) -> list[RoundView]:
    """The last ``limit`` rounds issued (oldest first) and, per round, the GPUs each job held
    (its lease: node and local GPU indices)."""
    require(principal, Role.ADMIN, Role.USER)
    rounds = list(
        session.exec(
            select(RoundRow)
            .where(RoundRow.cluster_id == "default")
            .order_by(col(RoundRow.index).desc())
            .limit(limit)
        ).all()
    )
    rounds.reverse()
    if not rounds:
        return []
    leases = session.exec(
        select(LeaseRow, JobRow.name, JobRow.tenant)
        .join(JobRow, col(JobRow.id) == col(LeaseRow.job_id))
        .where(col(LeaseRow.round_index) >= rounds[0].index)
        .order_by(col(LeaseRow.round_index), col(LeaseRow.node_id))
    ).all()
    by_round: dict[int, list[Held]] = {}
    for lease, name, tenant in leases:
        mine = principal.role is not Role.USER or tenant == principal.tenant
        by_round.setdefault(lease.round_index, []).append(
            Held(
                job_id=lease.job_id if mine else None,
                name=name if mine else None,
                node_id=lease.node_id,
                gpus=[int(g) for g in lease.gpus],
                state=lease.state,
            )
        )
    return [
        RoundView(r.index, r.source, r.started_at, r.ends_at, by_round.get(r.index, []))
        for r in rounds
    ]


@dataclass(frozen=True, slots=True)
class Timing:
    """The cluster's clock as the round driver set it: the current round, when it started and
    how long rounds are; ``current`` -1 before the first round."""

    current: int
    started_at: datetime | None
    round_seconds: float


def timing(session: Session) -> Timing:
    row = session.get(ClusterRow, "default")
    if row is None:
        return Timing(-1, None, 120.0)
    return Timing(row.current_round, row.round_started_at, row.round_seconds)


def planned_rounds_of_all(session: Session) -> tuple[int, list[list[str]]] | None:
    """The freshest plan's first round and its rounds' job ids; None before any plan."""
    plan: PlanRow | None = newest_plan(session, "default")
    if plan is None:
        return None
    return plan.base_round, [list(r) for r in plan.rounds]


def visible_jobs(session: Session, principal: Principal, ids: list[str]) -> dict[str, JobRow]:
    """Those of ``ids`` the caller may see, by id."""
    if not ids:
        return {}
    query = select(JobRow).where(col(JobRow.id).in_(ids))
    if principal.role is Role.USER:
        query = query.where(JobRow.tenant == principal.tenant)
    elif principal.role is not Role.ADMIN:
        return {}
    return {row.id: row for row in session.exec(query).all()}


def active_jobs(session: Session, principal: Principal, limit: int) -> list[JobRow]:
    """The caller's jobs that still want GPUs (PENDING, RUNNING, SUSPENDED), oldest first."""
    require(principal, Role.ADMIN, Role.USER)
    query = select(JobRow).where(
        col(JobRow.state).in_([JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED])
    )
    if principal.role is Role.USER:
        query = query.where(JobRow.tenant == principal.tenant)
    return list(session.exec(query.order_by(col(JobRow.created_at)).limit(limit)).all())


def attempts(session: Session, principal: Principal, job_id: str) -> list[LeaseRow]:
    """The job's attempts (leases), oldest first, with their output tails."""
    require(principal, Role.ADMIN, Role.USER, Role.JOB)
    jobs.visible_job(session, principal, job_id)
    return list(
        session.exec(
            select(LeaseRow)
            .where(LeaseRow.job_id == job_id)
            .order_by(col(LeaseRow.issued_at), col(LeaseRow.round_index))
        ).all()
    )


def node_gpu_types(session: Session) -> dict[str, str]:
    return {row.id: row.gpu_type for row in session.exec(select(NodeRow)).all()}


def stream_since(
    session: Session, principal: Principal, after: int, job_id: str | None, limit: int
) -> list[dict[str, Any]]:
    """The state changes and preemptions stored after event id ``after`` that the caller may
    see (of ``job_id`` only, if given), oldest first, at most ``limit``: each as the stream
    sends it (``id``, ``job_id``, ``name``, ``tenant``, ``kind``, ``from``, ``to``,
    ``reason``, ``created_at``)."""
    require(principal, Role.ADMIN, Role.USER, Role.JOB)
    query = (
        select(JobEventRow, JobRow.name, JobRow.tenant, JobRow.state)
        .join(JobRow, col(JobRow.id) == col(JobEventRow.job_id))
        .where(col(JobEventRow.id) > after, col(JobEventRow.kind).in_(STREAM_KINDS))
    )
    if principal.role is Role.USER:
        query = query.where(JobRow.tenant == principal.tenant)
    elif principal.role is Role.JOB:
        query = query.where(JobRow.id == principal.job_id)
    if job_id is not None:
        query = query.where(JobRow.id == job_id)
    rows = session.exec(query.order_by(col(JobEventRow.id)).limit(limit)).all()
    return [
        {
            "id": event.id,
            "job_id": event.job_id,
            "name": name,
            "tenant": tenant,
            "kind": event.kind,
            "from": event.payload.get("from"),
            "to": event.payload.get("to"),
            "state": state,
            "reason": event.reason,
            "created_at": event.created_at.isoformat(),
        }
        for event, name, tenant, state in rows
    ]


def last_event_id(session: Session) -> int:
    """The newest event id (0 when none): where a stream that asks for no history starts."""
    row = session.exec(select(JobEventRow.id).order_by(col(JobEventRow.id).desc()).limit(1)).first()
    return int(row or 0)
