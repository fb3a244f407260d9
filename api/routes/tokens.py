"""/v1/tokens: the token lifecycle, for admins: create (the secret shown once), list (no
secrets), revoke, and set an expiry. Tokens live in :mod:`store.tokens`; a revocation reaches
every API process within its token cache's lifetime (``api.auth.TOKEN_CACHE_S``, 10 s)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.auth import ANY, DENIED, access
from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.errors import openapi_problems
from api.schemas import Page, TokenCreate, TokenCreated, TokenExpiry, TokenPublic
from store import tokens
from store.errors import InvalidInput
from store.principals import Role, require
from store.tables import INT4_MAX, JobRow, TokenRow

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])

PROBLEMS = openapi_problems(
    (401, "Missing, unknown, revoked or expired token"),
    (403, "Admins only"),
    (404, "No such token"),
    (409, "The token was revoked"),
    (422, "Invalid input; names the field"),
)
ADMIN_ONLY = access(admin=ANY, user=DENIED, agent=DENIED, job=DENIED)
TokenIdPath = Annotated[int, Path(ge=1, le=INT4_MAX)]


def _public(row: TokenRow, now: datetime | None = None) -> TokenPublic:
    now = now or datetime.now(UTC)
    if row.revoked_at is not None:
        state = "revoked"
    elif row.expires_at is not None and row.expires_at <= now:
        state = "expired"
    else:
        state = "active"
    return TokenPublic.model_validate({**row.model_dump(), "state": state})


def _expiry(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.now(UTC) + timedelta(seconds=seconds)


@router.post(
    "",
    status_code=201,
    response_model=TokenCreated,
    responses=PROBLEMS,
    summary="Create a token (its secret is in this answer only)",
    openapi_extra=ADMIN_ONLY,
)
def create_token(
    data: TokenCreate, session: SessionDep, principal: CurrentPrincipal
) -> TokenCreated:
    """A user token needs ``scope.tenant``, an agent token ``scope.node``, a job token
    ``scope.job_id`` (an existing job); admin and metrics tokens take none of them."""
    require(principal, Role.ADMIN)
    role = Role(data.role)
    scope = data.scope.model_dump()
    needed = {Role.USER: "tenant", Role.AGENT: "node", Role.JOB: "job_id"}.get(role)
    for field, value in scope.items():
        if value is not None and field != needed:
            raise InvalidInput(
                f"scope.{field} does not apply to a {role.value} token", field=f"scope.{field}"
            )
    if needed is not None and scope[needed] is None:
        raise InvalidInput(f"a {role.value} token needs scope.{needed}", field=f"scope.{needed}")
    job_id = data.scope.job_id
    if job_id is not None and session.get(JobRow, job_id) is None:
        raise InvalidInput(f"scope.job_id: no job {job_id}", field="scope.job_id")
    secret, row = tokens.issue_token(
        session,
        role,
        tenant=data.scope.tenant,
        node=data.scope.node,
        job_id=job_id,
        name=data.name,
        expires_at=_expiry(data.expires_in_s),
    )
    session.commit()
    session.refresh(row)
    return TokenCreated(**_public(row).model_dump(), token=secret)


@router.get(
    "",
    response_model=Page[TokenPublic],
    responses=PROBLEMS,
    summary="List tokens (never their secrets)",
    openapi_extra=ADMIN_ONLY,
)
def list_tokens(
    session: SessionDep,
    principal: CurrentPrincipal,
    settings: SettingsDep,
    page_size: Annotated[int | None, Query(ge=1, le=500)] = None,
    page_token: Annotated[str | None, Query(max_length=512)] = None,
    role: Role | None = None,
) -> Page[TokenPublic]:
    """Tokens ordered by id; job tokens (one per attempt) only with ``role=job``."""
    require(principal, Role.ADMIN)
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    rows, token = tokens.token_page(session, page_size=size, page_token=page_token, role=role)
    now = datetime.now(UTC)
    return Page[TokenPublic](items=[_public(row, now) for row in rows], next_page_token=token)


@router.post(
    "/{token_id}/revoke",
    response_model=TokenPublic,
    responses=PROBLEMS,
    summary="Revoke a token",
    openapi_extra=ADMIN_ONLY,
)
def revoke_token(
    token_id: TokenIdPath, session: SessionDep, principal: CurrentPrincipal
) -> TokenPublic:
    """The token stops working within the API's token-cache lifetime (10 s); revoking it
    again changes nothing."""
    require(principal, Role.ADMIN)
    row = tokens.revoke_token(session, token_id)
    session.commit()
    session.refresh(row)
    return _public(row)


@router.put(
    "/{token_id}/expiry",
    response_model=TokenPublic,
    responses=PROBLEMS,
    summary="Set a token's expiry",
    openapi_extra=ADMIN_ONLY,
)
def set_expiry(
    token_id: TokenIdPath, data: TokenExpiry, session: SessionDep, principal: CurrentPrincipal
) -> TokenPublic:
    """``expires_in_s`` from now; null: never expires. A revoked token: 409."""
    require(principal, Role.ADMIN)
    row = tokens.set_expiry(session, token_id, _expiry(data.expires_in_s))
    session.commit()
    session.refresh(row)
    return _public(row)
