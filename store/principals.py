"""Who is calling, as the data layer scopes what it reads and writes.

Roles: ``admin`` (everything), ``user`` (one tenant's jobs), ``agent`` (one node), ``job`` (one
job's events, for the training SDK; the token an agent gets for an attempt also names that
attempt, so its events are refused once the attempt is fenced: see :mod:`store.events`), and
``metrics`` (scrapes ``/metrics``, nothing else: for Prometheus). How a
caller proves who it is (bearer tokens) is the API's business (:mod:`api.auth`); the tokens
themselves are stored by :mod:`store.tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from store.errors import Forbidden


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"
    AGENT = "agent"
    JOB = "job"
    METRICS = "metrics"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. ``key`` scopes idempotency keys (one caller's keys never clash with
    another's). ``attempt_id``: for a job token handed to one attempt, that attempt.
    ``expires_at``: when the token stops working (None: never). ``fenced``: for a job token
    whose attempt has ended or is fenced, why (it is then refused everywhere but where its
    process is told to stop)."""

    role: Role
    key: str
    tenant: str | None = None
    node: str | None = None
    job_id: str | None = None
    attempt_id: str | None = None
    expires_at: datetime | None = None
    fenced: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


OPEN = Principal(role=Role.ADMIN, key="open")
"""The caller of an open-mode request without a token: an admin (localhost only)."""


def require(principal: Principal, *roles: Role) -> None:
    """:class:`~store.errors.Forbidden` unless the caller has one of ``roles``."""
    if principal.role not in roles:
        allowed = ", ".join(r.value for r in roles)
        raise Forbidden(f"this operation needs one of the roles: {allowed}")
