"""/v1/cluster, /v1/nodes, /v1/schedule: capacity, load and the current plan."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from api import prediction
from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.errors import openapi_problems
from api.routes.prediction import get_now
from api.schemas import (
    ClusterPublic,
    HeldPublic,
    NodeApproval,
    NodeApprovalPublic,
    NodeId,
    NodePublic,
    NodeSummary,
    Page,
    PlannedRound,
    QueueEntry,
    RoundPublic,
    RoundsPublic,
    SchedulePublic,
)
from shockwave.domain.lifecycle import NodeState
from store import cluster, cluster_version, views
from store.principals import Role, require

router = APIRouter(prefix="/v1", tags=["cluster"])

PROBLEMS = openapi_problems(
    (401, "Missing or unknown token"),
    (403, "Role not allowed"),
    (422, "Invalid input; names the field"),
)

NO_ROUND_REASON = "no round driver has run yet"


@router.get(
    "/cluster",
    response_model=ClusterPublic,
    responses=PROBLEMS,
    summary="Cluster",
    openapi_extra=access(admin=ANY, user=OWN, agent=ANY, job=DENIED),
)
def get_cluster(session: SessionDep, principal: CurrentPrincipal) -> ClusterPublic:
    """GPU totals, node counts by state and job counts by state; a user sees only its own
    tenant's job counts and no node counts."""
    require(principal, Role.ADMIN, Role.AGENT, Role.USER)
    capacity = cluster.capacity(session)
    user = principal.role is Role.USER
    return ClusterPublic(
        total_gpus=capacity.total_gpus,
        ready_gpus=capacity.ready_gpus,
        nodes=None if user else capacity.nodes,
        jobs=cluster.jobs_by_state(session, (principal.tenant or "") if user else None),
        tenant=principal.tenant if user else None,
    )


@router.get(
    "/nodes",
    response_model=Page[NodePublic] | Page[NodeSummary],
    responses=PROBLEMS,
    summary="List nodes",
    openapi_extra=access(admin=ANY, user=ANY, agent=ANY, job=DENIED),
)
def list_nodes(
    session: SessionDep,
    principal: CurrentPrincipal,
    settings: SettingsDep,
    page_size: Annotated[int | None, Query(ge=1, le=500)] = None,
    page_token: Annotated[str | None, Query(max_length=512)] = None,
    state: NodeState | None = None,
) -> Page[NodePublic] | Page[NodeSummary]:
    """Nodes ordered by id. Admins and agents get every field; users get id, GPUs and state."""
    require(principal, Role.ADMIN, Role.AGENT, Role.USER)
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    rows, token = cluster.node_page(session, page_size=size, page_token=page_token, state=state)
    if principal.role is Role.USER:
        return Page[NodeSummary](
            items=[NodeSummary.model_validate(r, from_attributes=True) for r in rows],
            next_page_token=token,
        )
    return Page[NodePublic](
        items=[NodePublic.model_validate(r, from_attributes=True) for r in rows],
        next_page_token=token,
    )


@router.put(
    "/nodes/{node}/approval",
    response_model=NodeApprovalPublic,
    responses=PROBLEMS,
    summary="Approve a node's GPUs",
    openapi_extra=access(admin=ANY, user=DENIED, agent=DENIED, job=DENIED),
)
def approve_node(
    node: Annotated[NodeId, Path(description="The node (registered or not yet)")],
    approval: NodeApproval,
    session: SessionDep,
    principal: CurrentPrincipal,
) -> NodeApprovalPublic:
    """Admins only: approve node ``node`` for at most ``gpus`` GPUs of ``gpu_type`` (empty:
    any type), before or after its agent registers; approving again replaces the approval. A
    node gets leases only once approved, with no more GPUs than approved; its agent is refused
    (409) when it reports more GPUs, or another type (docs/agent.md, "Approving a node")."""
    require(principal, Role.ADMIN)
    row = cluster.approve_node(session, node, approval.gpus, approval.gpu_type)
    cluster_version.bump_and_request(session, f"node {node} approved")
    session.commit()
    return NodeApprovalPublic(
        node=row.node_id, gpus=row.gpus, gpu_type=row.gpu_type, approved_at=row.approved_at
    )


@router.get(
    "/schedule",
    response_model=SchedulePublic,
    responses=PROBLEMS,
    summary="Current round and plan",
    openapi_extra=access(admin=ANY, user=OWN, agent=OWN, job=DENIED),
)
def get_schedule(principal: CurrentPrincipal, session: SessionDep) -> SchedulePublic:
    """The current round: its jobs, where they came from (the fresh plan, the previous plan's
    next round, or the greedy fallback) and the plan's solve figures. Before the round driver
    has run, both are null and ``reason`` says why; this endpoint never invents a schedule."""
    require(principal, Role.ADMIN, Role.USER, Role.AGENT)
    view = cluster.schedule_view(session, principal)
    if view is None:
        return SchedulePublic(round=None, plan=None, reason=NO_ROUND_REASON)
    return SchedulePublic(round=view["round"], plan=view, reason=f"round from {view['source']}")


@router.get(
    "/rounds",
    response_model=RoundsPublic,
    responses=PROBLEMS,
    summary="Recent and planned rounds (the Gantt chart's data)",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=DENIED),
)
def list_rounds(
    session: SessionDep,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=200, description="Rounds issued to show")] = 20,
) -> RoundsPublic:
    """The last ``limit`` rounds issued, each with the GPUs every job held (node and local
    GPU indices; another tenant's job has no id for a user), and the freshest plan's rounds
    from the current one on with their expected start times."""
    require(principal, Role.ADMIN, Role.USER)
    recent = views.recent_rounds(session, principal, limit)
    timing = views.timing(session)
    planned: list[PlannedRound] = []
    plan = views.planned_rounds_of_all(session)
    if plan is not None:
        base, rounds = plan
        ids = sorted({job for r in rounds for job in r})
        visible = views.visible_jobs(session, principal, ids)
        for t, members in enumerate(rounds):
            index = base + t
            if index < timing.current:
                continue
            starts = None
            if timing.started_at is not None:
                ahead = index - max(timing.current, 0)
                starts = timing.started_at + timedelta(seconds=ahead * timing.round_seconds)
            planned.append(
                PlannedRound(
                    index=index, starts_at=starts, jobs=[j for j in members if j in visible]
                )
            )
    return RoundsPublic(
        current=timing.current,
        round_seconds=timing.round_seconds,
        recent=[
            RoundPublic(
                index=r.index,
                source=r.source,
                started_at=r.started_at,
                ends_at=r.ends_at,
                held=[
                    HeldPublic(
                        job_id=h.job_id, name=h.name, node_id=h.node_id, gpus=h.gpus, state=h.state
                    )
                    for h in r.held
                ],
            )
            for r in recent
        ],
        planned=planned,
    )


@router.get(
    "/queue",
    response_model=list[QueueEntry],
    responses=PROBLEMS,
    summary="The queue: active jobs with FTF estimate, predicted start and finish, and why "
    "each waits",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=DENIED),
)
def get_queue(
    session: SessionDep,
    principal: CurrentPrincipal,
    now: Annotated[datetime, Depends(get_now)],
    limit: Annotated[int, Query(ge=1, le=500, description="Jobs to show, oldest first")] = 200,
) -> list[QueueEntry]:
    """The caller's PENDING, RUNNING and SUSPENDED jobs, oldest first, each with its
    finish-time-fairness estimate, remaining time, predicted start and finish (from the
    freshest plan; null when the plan does not name the job) and why it waits."""
    require(principal, Role.ADMIN, Role.USER)
    return prediction.queue(session, principal, now, limit)
