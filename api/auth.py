"""Authentication at the edge: bearer tokens in, a :class:`~store.principals.Principal` out, and
the access rules every route declares.

The roles and what each may see live in the data layer (:mod:`store.principals`), the tokens in
:mod:`store.tokens` (stored hashed). A caller who may not see a resource gets 404, as if it did
not exist, so existence never leaks across tenants. ``open_mode`` (embedded default, localhost
only) treats requests without a token as an admin.
"""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from fastapi import HTTPException, Request
from sqlmodel import Session

from api.token_cache import TtlCache
from store.principals import Principal
from store.tokens import hash_token, principal_of


class Access(StrEnum):
    """What one role may do with one operation, declared on every route (``access()``) and
    published as ``x-access`` in the OpenAPI document. The roles' checks in the code enforce
    it; tests/integration/test_security.py reads the declarations from the document and checks
    every operation for every role against them, so a route without one fails that test.

    A scope is a tenant (user), a node (agent) or a job (job token); an operation names one
    through its job, event or attempt id, or an agent's ``node``.

    - ``any``: allowed whatever it names.
    - ``own``: allowed in its own scope; another's is 404 (lists show only its own).
    - ``see-only``: it may see the resource but not do this: 403 in its own scope, 404 in
      another's.
    - ``hidden``: nothing of the kind exists for the role: 404.
    - ``denied``: 403 whatever it names (the role is checked first; existence does not leak).
    - ``token``: (anonymous callers only) 401, a token is needed.
    """

    ANY = "any"
    OWN = "own"
    SEE_ONLY = "see-only"
    HIDDEN = "hidden"
    DENIED = "denied"
    TOKEN = "token"


ANY, OWN, SEE_ONLY, HIDDEN, DENIED = (
    Access.ANY,
    Access.OWN,
    Access.SEE_ONLY,
    Access.HIDDEN,
    Access.DENIED,
)
"""Short names for the route declarations."""


def access(*, admin: Access, user: Access, agent: Access, job: Access) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that needs a token: ``{"x-access": {role: rule}}``,
    every role named (keyword-only, no defaults, so none is forgotten)."""
    rules = {"anonymous": Access.TOKEN, "admin": admin, "user": user, "agent": agent, "job": job}
    return {"x-access": {role: rule.value for role, rule in rules.items()}}


PUBLIC: dict[str, Any] = {
    "x-access": {role: Access.ANY.value for role in ("anonymous", "admin", "user", "agent", "job")}
}
"""The ``openapi_extra`` of a route anyone may call, with or without a token (probes)."""


TOKEN_CACHE_S = 10.0
"""How long a process trusts a token lookup: a revoked token keeps working for up to this long
(docs/api.md, "Tokens")."""
ATTEMPT_TOKEN_CACHE_S = 1.0
"""How long a process trusts a lookup of a job token bound to an attempt: such a token stops
working when its attempt ends or is fenced (:func:`store.tokens.principal_of`), and must not
outlive it by the whole :data:`TOKEN_CACHE_S`."""
TOKENS: TtlCache[Principal] = TtlCache(ttl_s=TOKEN_CACHE_S)
"""Known tokens' principals, per process (see :mod:`api.token_cache`)."""


def bearer_digest(request: Request, open_mode: bool) -> str | None:
    """The hash of the request's bearer token; None for an open-mode request from this machine
    without one (an admin); 401 otherwise. No I/O, so the event loop may call it."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        if open_mode and _local(request):
            return None
        raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            401, "expected 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"}
        )
    return hash_token(token.strip())


def cached_principal(session: Session, digest: str) -> Principal | None:
    """The principal of a token this process has seen in the last 10 s (and that has not
    expired since), if any (no I/O)."""
    return TOKENS.get(_cache_key(session, digest))


def stored_principal(session: Session, digest: str) -> Principal:
    """The principal of the token hashed to ``digest``, read from the database (and cached,
    no longer than until it expires); 401 when no such token exists, or it was revoked or has
    expired."""
    now = datetime.now(UTC)
    principal = principal_of(session, digest, now)
    if principal is None:
        raise HTTPException(
            401, "unknown, revoked or expired token", {"WWW-Authenticate": "Bearer"}
        )
    left = None if principal.expires_at is None else (principal.expires_at - now).total_seconds()
    if principal.attempt_id is not None:
        left = min(left if left is not None else ATTEMPT_TOKEN_CACHE_S, ATTEMPT_TOKEN_CACHE_S)
    TOKENS.put(_cache_key(session, digest), principal, left)
    return principal


def _cache_key(session: Session, digest: str) -> tuple[int, str]:
    """Tokens are cached per database (tests run several in one process)."""
    return (id(session.get_bind()), digest)


def _local(request: Request) -> bool:
    """Whether the caller is on this machine: open mode never serves anyone else.

    A client that is not an IP address is an in-process caller (an ASGI test client)."""
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True
