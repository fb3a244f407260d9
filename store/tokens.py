"""Bearer tokens in the database: stored as SHA-256 hashes, each with a role and its scope, and
their lifecycle: an optional expiry, revocation, and when each was last used.

The plain token is returned once, when it is made, and never stored. A revoked token's row is
kept (the list shows when it was revoked); a revoked or expired token is no principal. The API
caches lookups (:mod:`api.token_cache`), so a revocation reaches every API process within the
cache's lifetime (10 s), and ``last_used_at`` is stamped when a lookup reaches the database
(at most that late).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import bindparam, func, insert, or_
from sqlmodel import Session, SQLModel, col, select, update
from typing_extensions import Unpack

from store.errors import Conflict, InvalidInput, NotFound
from store.leases import fenced_reason
from store.paging import MALFORMED, cut, page_key
from store.principals import Principal, Role
from store.tables import INT4_MAX, TokenRow, utcnow


def new_token() -> str:
    return "swk_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Scope(TypedDict, total=False):
    """What a token acts for: a user's ``tenant``, an agent's ``node``, a job token's
    ``job_id`` (and the ``attempt_id`` it speaks for), and a ``name`` to tell tokens apart;
    ``expires_at``: when it stops working (None: never)."""

    tenant: str | None
    node: str | None
    job_id: str | None
    attempt_id: str | None
    name: str
    expires_at: datetime | None


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
    return _add(session, role, scope)[0]


def _add(session: Session, role: Role, scope: Scope) -> tuple[str, TokenRow]:
    token, values = _values(role, scope)
    row = TokenRow(**values)
    session.add(row)
    return token, row


def _values(role: Role, scope: Scope) -> tuple[str, dict[str, Any]]:
    """A new plain token and the columns of its row (without ``id`` and ``created_at``).
    ValueError as :func:`add_token` says."""
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
    values: dict[str, Any] = {
        "token_hash": hash_token(token),
        "role": role.value,
        "tenant": tenant,
        "node": node,
        "job_id": job_id,
        "attempt_id": attempt_id,
        "name": scope.get("name", ""),
        "expires_at": scope.get("expires_at"),
    }
    return token, values


TOKENS = SQLModel.metadata.tables["tokens"]
_INSERT = insert(TOKENS)
_LIVE_ATTEMPT_TOKENS = select(TOKENS.c.attempt_id).where(
    TOKENS.c.attempt_id.in_(bindparam("ids", expanding=True)), TOKENS.c.revoked_at.is_(None)
)
"""The attempts among ``ids`` that have a job token not revoked."""
_STAMP = (
    update(TOKENS)
    .where(
        TOKENS.c.token_hash == bindparam("digest"),
        TOKENS.c.revoked_at.is_(None),
        or_(TOKENS.c.expires_at.is_(None), TOKENS.c.expires_at > bindparam("now")),
    )
    .values(last_used_at=bindparam("now"))
    .returning(
        TOKENS.c.id,
        TOKENS.c.role,
        TOKENS.c.tenant,
        TOKENS.c.node,
        TOKENS.c.job_id,
        TOKENS.c.attempt_id,
        TOKENS.c.expires_at,
    )
)
"""Find the token hashed to ``digest`` that is neither revoked nor expired by ``now``, and
stamp it used at ``now``, in one round trip."""
_STAMP_ASYNC = _STAMP.returning(func.set_config("synchronous_commit", "off", True))
""":data:`_STAMP` on Postgres, its transaction set not to wait for the WAL's flush at commit
(it wrote a ``last_used_at`` stamp only)."""


def add_attempt_tokens(session: Session, attempts: Mapping[str, str]) -> dict[str, str]:
    """A job token for each of ``attempts`` (attempt id -> its job's id), named after its
    attempt, as :func:`add_token` stores one, in one ``INSERT`` on the session's connection
    (no ORM object a token: a round's new attempts ask for theirs all at once); attempt id ->
    plain token. Not committed: the caller commits once for all it adds."""
    if not attempts:
        return {}
    now = utcnow()
    tokens: dict[str, str] = {}
    rows = []
    for attempt, job_id in sorted(attempts.items()):
        scope: Scope = {"job_id": job_id, "attempt_id": attempt, "name": f"attempt {attempt}"}
        tokens[attempt], values = _values(Role.JOB, scope)
        rows.append({**values, "created_at": now})
    session.connection().execute(_INSERT, rows)
    return tokens


def issue_token(session: Session, role: Role, **scope: Unpack[Scope]) -> tuple[str, TokenRow]:
    """:func:`add_token`, also returning the stored row (flushed: it has its id)."""
    token, row = _add(session, role, scope)
    session.flush()
    return token, row


def principal_of(session: Session, digest: str, now: datetime | None = None) -> Principal | None:
    """The principal of the token hashed to ``digest``; None when no such token exists, or it
    was revoked, or it expired by ``now`` (default: the clock). A job token of an attempt that
    has ended or is fenced (:func:`store.leases.fenced_reason`) comes back with ``fenced`` set:
    it lives as long as its attempt, and is good for nothing after but being told so (the API
    refuses it everywhere but where its process learns that it must stop: 409 ``fenced``).
    A token found is stamped ``last_used_at`` (committed at once, apart from the caller's
    work).

    One statement finds and stamps it (``UPDATE ... RETURNING``), and on Postgres the commit
    does not wait for the WAL's flush: a lookup reaches the database on every request of an
    agent whose long poll outlasts the API's token cache, and a database crash may forget
    only the last fraction of a second of ``last_used_at`` stamps."""
    now = now or utcnow()
    connection = session.connection()
    lookup = _STAMP_ASYNC if connection.dialect.name == "postgresql" else _STAMP
    row = connection.execute(lookup, {"digest": digest, "now": now}).first()
    if row is None:
        session.commit()
        return None
    fenced = None if row.attempt_id is None else fenced_reason(session, row.attempt_id)
    principal = Principal(
        role=Role(row.role),
        key=f"token:{row.id}",
        tenant=row.tenant,
        node=row.node,
        job_id=row.job_id,
        attempt_id=row.attempt_id,
        expires_at=row.expires_at,
        fenced=fenced,
    )
    session.commit()
    return principal


def attempts_with_tokens(session: Session, attempt_ids: Sequence[str]) -> set[str]:
    """Those of ``attempt_ids`` that have a job token not revoked (a Core read on the
    session's connection: a poll asks before it mints)."""
    if not attempt_ids:
        return set()
    rows = session.connection().execute(_LIVE_ATTEMPT_TOKENS, {"ids": list(attempt_ids)})
    return {attempt for (attempt,) in rows if attempt is not None}


def revoke_attempt_tokens(session: Session, attempt_ids: Sequence[str]) -> None:
    """Revoke the job tokens of ``attempt_ids`` not yet revoked (the caller commits)."""
    if attempt_ids:
        session.exec(
            update(TokenRow)
            .where(
                col(TokenRow.attempt_id).in_(list(attempt_ids)), col(TokenRow.revoked_at).is_(None)
            )
            .values(revoked_at=utcnow())
        )


def token_page(
    session: Session, *, page_size: int, page_token: str | None, role: Role | None = None
) -> tuple[Sequence[TokenRow], str | None]:
    """One page of tokens ordered by id (of ``role`` only, if given), and the next page's
    token. Job tokens, minted per attempt, are listed only when asked for by role."""
    query = select(TokenRow)
    if role is not None:
        query = query.where(TokenRow.role == role.value)
    else:
        query = query.where(TokenRow.role != Role.JOB.value)
    if page_token:
        key = page_key("token", page_token)
        if not key.isdigit() or int(key) > INT4_MAX:
            raise InvalidInput(MALFORMED, field="page_token")
        query = query.where(col(TokenRow.id) > int(key))
    rows = session.exec(query.order_by(col(TokenRow.id)).limit(page_size + 1)).all()
    return cut(rows, page_size, lambda row: str(row.id or 0), "token")


def stored_token(session: Session, token_id: int) -> TokenRow:
    """The token row ``token_id``, or :class:`NotFound`."""
    row = session.get(TokenRow, token_id) if 0 < token_id <= INT4_MAX else None
    if row is None:
        raise NotFound(f"no token {token_id}")
    return row


def revoke_token(session: Session, token_id: int, now: datetime | None = None) -> TokenRow:
    """Revoke token ``token_id`` (kept, stamped ``revoked_at``); revoking again changes
    nothing. The caller commits."""
    row = stored_token(session, token_id)
    if row.revoked_at is None:
        row.revoked_at = now or utcnow()
        session.add(row)
    return row


def set_expiry(session: Session, token_id: int, expires_at: datetime | None) -> TokenRow:
    """Give token ``token_id`` a new expiry (None: never); :class:`Conflict` on a revoked
    token (revocation is final). The caller commits."""
    row = stored_token(session, token_id)
    if row.revoked_at is not None:
        raise Conflict(f"token {token_id} was revoked; revocation is final")
    row.expires_at = expires_at
    session.add(row)
    return row
