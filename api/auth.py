"""Bearer tokens: stored hashed, each with a role and a scope.

Roles: ``admin`` (everything), ``user`` (one tenant's jobs), ``agent`` (one node), ``job`` (one
job's events, for the training SDK). A caller who may not see a resource gets 404, as if it did
not exist, so existence never leaks across tenants. ``open_mode`` (embedded default, localhost
only) treats requests without a token as an admin.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass
from enum import StrEnum

from fastapi import HTTPException, Request
from sqlmodel import Session, select

from api.tables import TokenRow


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"
    AGENT = "agent"
    JOB = "job"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. ``key`` scopes idempotency keys (one caller's keys never clash with
    another's)."""

    role: Role
    key: str
    tenant: str | None = None
    node: str | None = None
    job_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    def sees_tenant(self, tenant: str) -> bool:
        return self.is_admin or (self.role is Role.USER and self.tenant == tenant)


OPEN = Principal(role=Role.ADMIN, key="open")


def new_token() -> str:
    return "swk_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session,
    role: Role,
    *,
    tenant: str | None = None,
    node: str | None = None,
    job_id: str | None = None,
    name: str = "",
) -> str:
    """Store a new token (hashed) and return it; the plain token is never stored."""
    if role is Role.USER and not tenant:
        raise ValueError("a user token needs a tenant")
    if role is Role.AGENT and not node:
        raise ValueError("an agent token needs a node")
    if role is Role.JOB and not job_id:
        raise ValueError("a job token needs a job id")
    token = new_token()
    session.add(
        TokenRow(
            token_hash=hash_token(token),
            role=role.value,
            tenant=tenant,
            node=node,
            job_id=job_id,
            name=name,
        )
    )
    session.commit()
    return token


def authenticate(request: Request, session: Session, open_mode: bool) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        if open_mode and _local(request):
            return OPEN
        raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            401, "expected 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"}
        )
    row = session.exec(
        select(TokenRow).where(TokenRow.token_hash == hash_token(token.strip()))
    ).first()
    if row is None:
        raise HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})
    return Principal(
        role=Role(row.role),
        key=f"token:{row.id}",
        tenant=row.tenant,
        node=row.node,
        job_id=row.job_id,
    )


def _local(request: Request) -> bool:
    """Whether the caller is on this machine: open mode never serves anyone else.

    A client that is not an IP address is an in-process caller (an ASGI test client)."""
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def require(principal: Principal, *roles: Role) -> None:
    """403 unless the caller has one of ``roles``."""
    if principal.role not in roles:
        allowed = ", ".join(r.value for r in roles)
        raise HTTPException(403, f"this operation needs one of the roles: {allowed}")
