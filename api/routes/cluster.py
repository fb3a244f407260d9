"""/v1/cluster, /v1/nodes, /v1/schedule: capacity, load and the current plan."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.errors import openapi_problems
from api.schemas import ClusterPublic, NodePublic, NodeSummary, Page, SchedulePublic
from shockwave.lifecycle import NodeState
from store import cluster
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
