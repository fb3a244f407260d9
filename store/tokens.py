"""Bearer tokens in the database: stored as SHA-256 hashes, each with a role and its scope.

The plain token is returned once, when it is made, and never stored. Tokens are created or
deleted, never updated, which is what lets the API cache lookups (:mod:`api.auth`).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TypedDict

from sqlmodel import Session, select
from typing_extensions import Unpack

from store.principals import Principal, Role
from store.tables import TokenRow


def new_token() -> str:
    return "swk_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Scope(TypedDict, total=False):
    """What a token acts for: a user's ``tenant``, an agent's ``node``, a job token's
    ``job_id`` (and the ``attempt_id`` it speaks for), and a ``name`` to tell tokens apart."""

    tenant: str | None
    node: str | None
    job_id: str | None
    attempt_id: str | None
    name: str


def create_token(session: Session, role: Role, **scope: Unpack[Scope]) -> str:
    """Store a new token (hashed), commit, and return it; the plain token is never stored.
    ``attempt_id`` (job tokens only) ties the token to one attempt of the job."""
    token = add_token(session, role, **scope)
    session.commit()
    return token


def add_token(session: Session, role: Role, **scope: Unpack[Scope]) -> str:
    """:func:`create_token` without the commit: the caller commits once for all it adds.
    ValueError when the role's scope is missing (a user needs a tenant, an agent a node, a job
    token a job) or an attempt is named on another role."""
    tenant, node = scope.get("tenant"), scope.get("node")
    job_id, attempt_id = scope.get("job_id"), scope.get("attempt_id")
    if role is Role.USER and not tenant:
        raise ValueError("a user token needs a tenant")
    if role is Role.AGENT and not node:
        raise ValueError("an agent token needs a node")
    if role is Role.JOB and not job_id:
        raise ValueError("a job token needs a job id")
    if attempt_id is not None and role is not Role.JOB:
        raise ValueError("only a job token names an attempt")
    token = new_token()
    session.add(
        TokenRow(
            token_hash=hash_token(token),
            role=role.value,
            tenant=tenant,
            node=node,
            job_id=job_id,
            attempt_id=attempt_id,
            name=scope.get("name", ""),
        )
    )
    return token


def principal_of(session: Session, digest: str) -> Principal | None:
    """The principal of the token hashed to ``digest``, None when no such token exists."""
    row = session.exec(select(TokenRow).where(TokenRow.token_hash == digest)).first()
    if row is None:
        return None
    return Principal(
        role=Role(row.role),
        key=f"token:{row.id}",
        tenant=row.tenant,
        node=row.node,
        job_id=row.job_id,
        attempt_id=row.attempt_id,
    )
