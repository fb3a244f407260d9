"""Capacity and load, read from the database: the nodes and their GPUs, the jobs by state;
and the operator's approval of each node's GPUs.

Nodes are written by the agent endpoints (register, heartbeat); here they are only read. An
approval (:func:`approve_node`) is what an operator says a node has: a node gets leases only
once approved and never for more GPUs than approved (:func:`store.snapshot.gpu_layout`), and a
registration that reports more, or another GPU type, is refused (:func:`check_inventory`): an
agent's token alone cannot make its node attract more jobs than the machine can run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import case, func
from sqlalchemy.orm import QueryableAttribute, defer
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import ACTIVE, JobState, NodeState
from shockwave.domain.waiting import Gpus
from shockwave.market.estimators import contention_factor
from store.errors import Conflict
from store.paging import cut, page_key
from store.principals import Principal, Role
from store.tables import ClusterRow, JobRow, NodeApprovalRow, NodeRow, PlanRow, RoundRow, utcnow


@dataclass(frozen=True, slots=True)
class Capacity:
    """``total_gpus`` of all registered nodes, ``ready_gpus`` of the READY ones, node counts
    by state. A node's GPUs count as far as they are approved (:func:`usable_gpus`): a node
    nobody approved adds none, so it cannot skew the contention factor every prediction uses."""

    total_gpus: int
    ready_gpus: int
    nodes: dict[str, int]


def usable_gpus() -> Any:
    """A node's GPUs as far as an operator approved them (0 before approval), as a SQL
    expression over ``nodes`` outer-joined to ``node_approvals`` (:func:`_approved`)."""
    return case(
        (col(NodeApprovalRow.gpus).is_(None), 0),
        (col(NodeApprovalRow.gpus) < col(NodeRow.gpus), col(NodeApprovalRow.gpus)),
        else_=col(NodeRow.gpus),
    )


def _approved(query: Any) -> Any:
    return query.select_from(NodeRow).outerjoin(
        NodeApprovalRow, col(NodeApprovalRow.node_id) == col(NodeRow.id)
    )


def capacity(session: Session) -> Capacity:
    rows = session.exec(
        _approved(
            select(NodeRow.state, func.count(), func.coalesce(func.sum(usable_gpus()), 0))
        ).group_by(NodeRow.state)
    ).all()
    nodes = {state.value: 0 for state in NodeState}
    gpus = {state.value: 0 for state in NodeState}
    for state, count, state_gpus in rows:
        nodes[state] = int(count)
        gpus[state] = int(state_gpus)
    return Capacity(total_gpus=sum(gpus.values()), ready_gpus=gpus[NodeState.READY], nodes=nodes)


def gpus_by_kind(session: Session) -> Gpus:
    """GPUs by ``gpu_type``: of every registered node and of the READY ones (for
    :func:`shockwave.domain.waiting.why_waiting`)."""
    rows = session.exec(
        _approved(
            select(NodeRow.gpu_type, NodeRow.state, func.coalesce(func.sum(usable_gpus()), 0))
        ).group_by(NodeRow.gpu_type, NodeRow.state)
    ).all()
    total: dict[str, int] = {}
    ready: dict[str, int] = {}
    for kind, state, gpus in rows:
        total[kind] = total.get(kind, 0) + int(gpus)
        if state == NodeState.READY.value:
            ready[kind] = ready.get(kind, 0) + int(gpus)
    return Gpus(total=total, ready=ready)


def jobs_by_state(session: Session, tenant: str | None = None) -> dict[str, int]:
    """Job counts for every state (zeros included), of ``tenant`` only if given."""
    query = select(JobRow.state, func.count()).group_by(JobRow.state)
    if tenant is not None:
        query = query.where(JobRow.tenant == tenant)
    counts = {state.value: 0 for state in JobState}
    for state, count in session.exec(query).all():
        counts[state] = int(count)
    return counts


def contention(session: Session) -> float:
    """The contention factor now: active jobs per READY GPU, at least 1 (one GPU is assumed
    while no node is registered, so the factor is defined from the first job on)."""
    active = session.exec(
        select(func.count()).select_from(JobRow).where(col(JobRow.state).in_(ACTIVE))
    ).one()
    return contention_factor(int(active), max(1, capacity(session).ready_gpus))


def node_page(
    session: Session, *, page_size: int, page_token: str | None, state: NodeState | None
) -> tuple[list[NodeRow], str | None]:
    """One page of nodes ordered by id (of ``state`` only, if given), and the next page's
    token."""
    query = select(NodeRow)
    if state is not None:
        query = query.where(NodeRow.state == state)
    if page_token:
        query = query.where(col(NodeRow.id) > page_key("node", page_token))
    rows = session.exec(query.order_by(col(NodeRow.id)).limit(page_size + 1)).all()
    return cut(rows, page_size, lambda row: row.id, "node")


def schedule_view(session: Session, principal: Principal) -> dict[str, Any] | None:
    """The current round (who runs, where its jobs came from) and the plan it used, or None
    before the first round. A user sees only its own tenant's jobs; an agent sees counts."""
    state = cast("QueryableAttribute[Any]", ClusterRow.policy_state)
    row = session.get(ClusterRow, "default", options=(defer(state),))
    if row is None or row.current_round < 0:
        return None
    current = session.get(RoundRow, ("default", row.current_round))
    if current is None:
        return None
    jobs = list(current.jobs)
    if principal.role is Role.USER:
        own = set(
            session.exec(
                select(JobRow.id).where(col(JobRow.id).in_(jobs), JobRow.tenant == principal.tenant)
            ).all()
        )
        jobs = [j for j in jobs if j in own]
    elif principal.role is not Role.ADMIN:
        jobs = []
    plan = session.get(PlanRow, current.plan_id) if current.plan_id is not None else None
    return {
        "round": current.index,
        "started_at": current.started_at.isoformat(),
        "ends_at": current.ends_at.isoformat(),
        "source": current.source,
        "jobs": jobs,
        "running_jobs": len(current.jobs),
        "plan": None
        if plan is None
        else {
            "id": plan.id,
            "base_round": plan.base_round,
            "state_version": plan.state_version,
            "cluster_version": row.state_version,
            "rounds_planned": len(plan.rounds),
            "policy": plan.policy,
            "status": plan.status,
            "solver": plan.solver,
            "objective": plan.objective,
            "gain_gap": plan.gain_gap,
            "solve_seconds": plan.solve_seconds,
        },
    }


def approve_node(session: Session, node_id: str, gpus: int, gpu_type: str = "") -> NodeApprovalRow:
    """Approve node ``node_id`` (registered or not yet) for at most ``gpus`` GPUs of
    ``gpu_type`` (empty: any type), replacing an earlier approval. The caller commits (and
    bumps the cluster's version: capacity may have changed)."""
    row = session.get(NodeApprovalRow, node_id, with_for_update=True)
    if row is None:
        row = NodeApprovalRow(node_id=node_id, gpus=gpus, gpu_type=gpu_type)
    row.gpus, row.gpu_type, row.approved_at = gpus, gpu_type, utcnow()
    session.add(row)
    session.flush()
    return row


def node_approval(session: Session, node_id: str) -> NodeApprovalRow | None:
    return session.get(NodeApprovalRow, node_id)


def check_inventory(session: Session, node_id: str, gpus: int, gpu_type: str) -> bool:
    """Whether node ``node_id`` is approved; :class:`~store.errors.Conflict` when it reports
    more GPUs than approved, or a GPU type other than the approved one."""
    approval = node_approval(session, node_id)
    if approval is None:
        return False
    if gpus > approval.gpus:
        raise Conflict(
            f"gpus: node {node_id} reports {gpus} GPUs but is approved for {approval.gpus}; "
            "an operator must approve more (shockwave admin approve-node)",
            title="Capacity not approved",
            field="gpus",
        )
    if approval.gpu_type and gpu_type != approval.gpu_type:
        raise Conflict(
            f"gpu_type: node {node_id} reports GPU type {gpu_type!r} but is approved for "
            f"{approval.gpu_type!r}",
            title="Capacity not approved",
            field="gpu_type",
        )
    return True
