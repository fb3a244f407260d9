"""/v1/tenants: the tenant tree, its shares and limits (admins change it; a user reads its own
tenant only). Tenants live in :mod:`store.tenants`; a change asks for a new plan, since the
shares it plans with changed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from sqlmodel import Session

from api.auth import ANY, DENIED, OWN, SEE_ONLY, access
from api.deps import CurrentPrincipal, SessionDep
from api.errors import openapi_problems
from api.tenant_schemas import (
    TenantChangePublic,
    TenantCreate,
    TenantDetail,
    TenantPublic,
    TenantTree,
    TenantUpdate,
)
from store import cluster_version, tenants
from store.principals import Principal
from store.tenants import MAX_PATH, PATH_PATTERN, Share, TenantSettings

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])

PROBLEMS = openapi_problems(
    (401, "Missing, unknown, revoked or expired token"),
    (403, "Admins only"),
    (404, "No such tenant (or not the caller's)"),
    (409, "The tenant exists already"),
    (422, "Invalid input; names the field"),
)
TenantPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_PATH,
        pattern=PATH_PATTERN,
        description="The tenant's path in the tree (``org/team``; the slash as is or %2F)",
    ),
]


def _public(
    settings: TenantSettings, shares: dict[str, Share], children: list[str] | None = None
) -> TenantPublic:
    share = shares.get(settings.path, Share())
    return TenantPublic(
        path=settings.path,
        parent=settings.parent,
        children=children or [],
        weight=settings.weight,
        guaranteed_gpus=settings.guaranteed_gpus,
        max_gpus=settings.max_gpus,
        max_jobs=settings.max_jobs,
        configured=settings.configured,
        version=settings.version,
        updated_at=settings.updated_at,
        active_jobs=share.active_jobs,
        entitled_gpus=share.entitled_gpus,
        held_gpus=share.held_gpus,
    )


def _detail(session: Session, principal: Principal, path: str) -> TenantDetail:
    settings = tenants.get_tenant(session, principal, path)
    changes = [
        TenantChangePublic.model_validate(row, from_attributes=True)
        for row in tenants.history(session, path)
    ]
    if not principal.is_admin:  # which admin token made a change is the admins' business
        changes = [change.model_copy(update={"changed_by": ""}) for change in changes]
    visible = {t.path for t in tenants.list_tenants(session, principal)}
    below = sorted(p for p in visible if tenants.parent_of(p) == path)
    public = _public(settings, tenants.shares_now(session), below)
    return TenantDetail(**public.model_dump(), history=changes)


@router.get(
    "",
    response_model=TenantTree,
    responses=PROBLEMS,
    summary="List the tenant tree (a user: its own tenant)",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=DENIED),
)
def list_tenants(session: SessionDep, principal: CurrentPrincipal) -> TenantTree:
    """Every configured tenant, every tenant that has jobs and every tenant above those, by
    path, each with its children; a tenant without settings shows the defaults (weight 1, no
    limits, ``configured`` false)."""
    tenants.require_reader(principal)
    listed = tenants.list_tenants(session, principal)
    tree = tenants.children(listed)
    shares = tenants.shares_now(session)
    items = [_public(t, shares, tree[t.path]) for t in listed]
    roots = [t.path for t in listed if t.parent is None or t.parent not in tree]
    return TenantTree(items=items, roots=roots)


@router.post(
    "",
    status_code=201,
    response_model=TenantDetail,
    responses=PROBLEMS,
    summary="Configure a tenant",
    openapi_extra=access(admin=ANY, user=DENIED, agent=DENIED, job=DENIED),
)
def create_tenant(
    data: TenantCreate, session: SessionDep, principal: CurrentPrincipal
) -> TenantDetail:
    """A tenant that has settings already is a 409 (change it with PATCH)."""
    settings = data.model_dump(exclude={"path"})
    tenants.create_tenant(session, principal, data.path, settings)
    cluster_version.bump_and_request(session, "tenant configured")
    session.commit()
    return _detail(session, principal, data.path)


@router.get(
    "/{tenant_path:path}",
    response_model=TenantDetail,
    responses=PROBLEMS,
    summary="Get a tenant's settings and their history",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=DENIED),
)
def get_tenant(
    tenant_path: TenantPath, session: SessionDep, principal: CurrentPrincipal
) -> TenantDetail:
    tenants.require_reader(principal)
    return _detail(session, principal, tenant_path)


@router.patch(
    "/{tenant_path:path}",
    response_model=TenantDetail,
    responses=PROBLEMS,
    summary="Change a tenant's weight or limits",
    openapi_extra=access(admin=ANY, user=SEE_ONLY, agent=DENIED, job=DENIED),
)
def update_tenant(
    tenant_path: TenantPath, data: TenantUpdate, session: SessionDep, principal: CurrentPrincipal
) -> TenantDetail:
    """Changes the settings present in the body (null clears a limit; ``weight`` cannot be
    null). A tenant without settings starts from the defaults. Each change is kept with its
    time in the tenant's history."""
    tenants.require_reader(principal)
    tenants.get_tenant(session, principal, tenant_path)
    tenants.update_tenant(session, principal, tenant_path, data.model_dump(exclude_unset=True))
    cluster_version.bump_and_request(session, "tenant changed")
    session.commit()
    return _detail(session, principal, tenant_path)
