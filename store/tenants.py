"""Tenants in the database: the tree of shares and limits, its history, and the job limit.

A tenant is named by its path in the tree (``org/team``: segments joined by ``/``); jobs belong
to the tenant their ``tenant`` column names, a leaf of the tree. Each configured tenant has a
row (:class:`~store.tables.TenantRow`): its ``weight`` (its share among its siblings), and
optionally ``guaranteed_gpus``, ``max_gpus`` (the most GPUs its jobs may hold together) and
``max_jobs`` (the most jobs queued and running in its subtree). A tenant without a row has
weight 1 and no limits, so a deployment that configures none schedules as a single tenant does.

Every change writes a :class:`~store.tables.TenantChangeRow` with the settings after it, who
made it and when, in the same transaction. Only admins change tenants; a user sees its own
tenant only (another tenant is :class:`NotFound`, so names do not leak).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import ACTIVE, LIVE_LEASES, NodeState
from shockwave.domain.model import ValidationError
from shockwave.domain.tenancy import Tenant, entitlements
from store.errors import Conflict, Forbidden, InvalidInput, NotFound
from store.principals import Principal, Role
from store.tables import JobRow, LeaseRow, NodeRow, TenantChangeRow, TenantRow, utcnow

SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
PATH_PATTERN = rf"^{SEGMENT}(/{SEGMENT})*$"
"""A tenant's path: segments of letters, digits and ``. _ -`` (not first), joined by ``/``."""
MAX_PATH = 64
MAX_WEIGHT = 1e6
MAX_GPUS = 1_000_000
MAX_JOBS = 1_000_000
SETTINGS = ("weight", "guaranteed_gpus", "max_gpus", "max_jobs")
"""What an admin sets on a tenant."""


@dataclass(frozen=True, slots=True)
class TenantSettings:
    """A tenant's effective settings: its row's, or the defaults (``configured`` False)."""

    path: str
    weight: float = 1.0
    guaranteed_gpus: int | None = None
    max_gpus: int | None = None
    max_jobs: int | None = None
    configured: bool = False
    version: int = 0
    updated_at: datetime | None = None

    @property
    def parent(self) -> str | None:
        return parent_of(self.path)


class TenantAtLimit(Conflict):
    """A submission would take the tenant (or one above it) past its ``max_jobs``."""

    default_title = "Tenant at its job limit"


def parent_of(path: str) -> str | None:
    """``org`` for ``org/team``; None for a top-level tenant."""
    head, _, _ = path.rpartition("/")
    return head or None


def lineage(path: str) -> list[str]:
    """``path`` and every tenant above it, nearest first: ``a/b/c``, ``a/b``, ``a``."""
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]


def check_path(path: str, field: str = "path") -> str:
    """``path`` if it names a tenant, else :class:`InvalidInput` naming ``field``."""
    if len(path) > MAX_PATH or not re.fullmatch(PATH_PATTERN, path):
        raise InvalidInput(
            f"a tenant path is 1-{MAX_PATH} characters: segments of letters, digits and "
            "'. _ -' (not first) joined by '/'",
            field=field,
        )
    return path


def _of(row: TenantRow) -> TenantSettings:
    return TenantSettings(
        path=row.path,
        weight=row.weight,
        guaranteed_gpus=row.guaranteed_gpus,
        max_gpus=row.max_gpus,
        max_jobs=row.max_jobs,
        configured=True,
        version=row.version,
        updated_at=row.updated_at,
    )


def visible(principal: Principal, path: str) -> bool:
    """Whether ``principal`` may read tenant ``path``: an admin any, a user its own only."""
    if principal.role is Role.ADMIN:
        return True
    return principal.role is Role.USER and principal.tenant == path


def require_reader(principal: Principal) -> None:
    """:class:`Forbidden` for a role that reads no tenant (agents, job tokens)."""
    if principal.role not in (Role.ADMIN, Role.USER):
        raise Forbidden("only admins and users read tenants")


def get_tenant(session: Session, principal: Principal, path: str) -> TenantSettings:
    """The settings of ``path`` as ``principal`` may see them; :class:`NotFound` otherwise."""
    check_path(path, "tenant_path")
    if not visible(principal, path):
        raise NotFound(f"no tenant {path}")
    row = session.get(TenantRow, path)
    return _of(row) if row is not None else TenantSettings(path=path)


def list_tenants(session: Session, principal: Principal) -> list[TenantSettings]:
    """The tenants ``principal`` sees, by path: for an admin every configured tenant, every
    tenant that has jobs, and every tenant above those (the whole tree); for a user its own."""
    if principal.role is Role.USER and principal.tenant:
        return [get_tenant(session, principal, principal.tenant)]
    if principal.role is not Role.ADMIN:
        return []
    rows = {row.path: _of(row) for row in session.exec(select(TenantRow)).all()}
    with_jobs = session.exec(select(JobRow.tenant).distinct()).all()
    paths: set[str] = set()
    for path in [*rows, *with_jobs]:
        if path and re.fullmatch(PATH_PATTERN, path):
            paths.update(lineage(path))
    return [rows.get(path, TenantSettings(path=path)) for path in sorted(paths)]


def history(session: Session, path: str, limit: int = 100) -> list[TenantChangeRow]:
    """The latest ``limit`` changes to ``path``, newest first."""
    query = (
        select(TenantChangeRow)
        .where(TenantChangeRow.path == path)
        .order_by(col(TenantChangeRow.changed_at).desc(), col(TenantChangeRow.id).desc())
        .limit(limit)
    )
    return list(session.exec(query).all())


def create_tenant(
    session: Session, principal: Principal, path: str, settings: Mapping[str, Any]
) -> TenantRow:
    """A new configured tenant at ``path`` (:class:`Conflict` if it has a row already)."""
    _admin(principal)
    check_path(path)
    if session.get(TenantRow, path) is not None:
        raise Conflict(
            f"a tenant with path {path} exists already: change it with PATCH", field="path"
        )
    row = TenantRow(path=path, parent=parent_of(path), version=0)
    return _apply(session, principal, row, settings)


def update_tenant(
    session: Session, principal: Principal, path: str, changes: Mapping[str, Any]
) -> TenantRow:
    """Change ``path``'s settings (the ones in ``changes``; None clears a limit). A tenant
    without a row starts from the defaults, so this also configures one for the first time.
    The row is locked for the change, so concurrent changes apply one after the other."""
    _admin(principal)
    check_path(path, "tenant_path")
    row = session.exec(
        select(TenantRow).where(TenantRow.path == path).with_for_update()
    ).one_or_none()
    if row is None:
        row = TenantRow(path=path, parent=parent_of(path), version=0)
    return _apply(session, principal, row, changes)


def _admin(principal: Principal) -> None:
    if principal.role is not Role.ADMIN:
        raise Forbidden("only admins change tenants")


def _apply(
    session: Session, principal: Principal, row: TenantRow, changes: Mapping[str, Any]
) -> TenantRow:
    unknown = set(changes) - set(SETTINGS)
    if unknown:
        raise InvalidInput(f"unknown tenant settings {sorted(unknown)}", field=sorted(unknown)[0])
    for name, value in changes.items():
        if name == "weight" and value is None:
            raise InvalidInput("weight cannot be null: it is the tenant's share", field="weight")
        setattr(row, name, value)
    _check(row)
    now = utcnow()
    row.version += 1
    row.updated_at = now
    session.add(row)
    session.add(
        TenantChangeRow(
            path=row.path,
            version=row.version,
            weight=row.weight,
            guaranteed_gpus=row.guaranteed_gpus,
            max_gpus=row.max_gpus,
            max_jobs=row.max_jobs,
            changed_by=principal.key[:64],
            changed_at=now,
        )
    )
    session.flush()
    return row


def _check(row: TenantRow) -> None:
    """:class:`InvalidInput` naming the setting at fault (the API checks types and bounds
    first; these are the rules between settings)."""
    if not (math.isfinite(row.weight) and 0 < row.weight <= MAX_WEIGHT):
        raise InvalidInput(f"weight must be in (0, {MAX_WEIGHT:g}]", field="weight")
    bounds = (("guaranteed_gpus", MAX_GPUS), ("max_gpus", MAX_GPUS), ("max_jobs", MAX_JOBS))
    for name, bound in bounds:
        value = getattr(row, name)
        if value is not None and not 0 <= value <= bound:
            raise InvalidInput(f"{name} must be in [0, {bound}]", field=name)
    if (
        row.guaranteed_gpus is not None
        and row.max_gpus is not None
        and row.guaranteed_gpus > row.max_gpus
    ):
        raise InvalidInput(
            f"guaranteed_gpus ({row.guaranteed_gpus}) exceeds max_gpus ({row.max_gpus})",
            field="guaranteed_gpus",
        )


def admit_job(session: Session, tenant: str) -> None:
    """Refuse (:class:`TenantAtLimit`, naming ``max_jobs``) a new job of ``tenant`` when it, or
    a tenant above it, already has ``max_jobs`` jobs queued and running in its subtree. The
    limiting rows are locked until the caller's transaction ends, so concurrent submissions
    to one tenant are counted one after the other and never overshoot the limit."""
    paths = lineage(tenant) if re.fullmatch(PATH_PATTERN, tenant or "") else [tenant]
    limits = session.exec(
        select(TenantRow)
        .where(col(TenantRow.path).in_(paths), col(TenantRow.max_jobs).is_not(None))
        .order_by(col(TenantRow.path))
        .with_for_update()
    ).all()
    for row in limits:
        active = count_active(session, [row.path])[row.path]
        if row.max_jobs is not None and active >= row.max_jobs:
            raise TenantAtLimit(
                f"tenant {row.path} has {active} jobs queued and running, its limit max_jobs "
                f"is {row.max_jobs}: wait for one to finish or ask an admin to raise it",
                field="max_jobs",
                limit="max_jobs",
                tenant=row.path,
                max_jobs=row.max_jobs,
                active_jobs=active,
            )


def count_active(session: Session, paths: Iterable[str]) -> dict[str, int]:
    """Jobs queued and running (PENDING, RUNNING, SUSPENDED) in each tenant's subtree."""
    counts: dict[str, int] = {}
    for path in paths:
        query = select(func.count()).where(
            col(JobRow.state).in_(ACTIVE),
            or_(
                col(JobRow.tenant) == path,
                col(JobRow.tenant).startswith(path + "/", autoescape=True),
            ),
        )
        counts[path] = int(session.exec(query).one())
    return counts


def configured(session: Session) -> list[TenantSettings]:
    """Every configured tenant (rows only), by path: what the round driver plans with."""
    return [_of(row) for row in session.exec(select(TenantRow).order_by(col(TenantRow.path)))]


def core_tenants(session: Session) -> dict[str, Tenant]:
    """The configured tenants as the core's :class:`~shockwave.domain.tenancy.Tenant` by path, for
    the snapshot; a row the core refuses (it cannot be written through the API) is left out, with
    the defaults in its place, rather than stopping every plan."""
    found: dict[str, Tenant] = {}
    for settings in configured(session):
        try:
            found[settings.path] = Tenant(
                settings.path,
                weight=settings.weight,
                guaranteed_gpus=settings.guaranteed_gpus,
                max_gpus=settings.max_gpus,
                max_jobs=settings.max_jobs,
            )
        except ValidationError:
            continue
    return found


def children(tenants: Sequence[TenantSettings]) -> dict[str, list[str]]:
    """Each listed tenant's listed children, by path."""
    paths = {t.path for t in tenants}
    tree: dict[str, list[str]] = {t.path: [] for t in tenants}
    for tenant in tenants:
        parent = tenant.parent
        if parent is not None and parent in paths:
            tree[parent].append(tenant.path)
    return tree


@dataclass(frozen=True, slots=True)
class Share:
    """A tenant's place in the cluster now: ``entitled_gpus``, its water-filled share of the
    READY GPUs given every tenant's demand (:func:`shockwave.domain.tenancy.entitlements`; an inner
    tenant's is its subtree's), ``held_gpus``, the GPUs its jobs' live leases hold, and
    ``active_jobs``, its jobs queued and running (both of its subtree)."""

    entitled_gpus: float = 0.0
    held_gpus: int = 0
    active_jobs: int = 0


def shares_now(session: Session) -> dict[str, Share]:
    """Every tenant with active jobs or live leases, and every tenant above one, by path."""
    demand: dict[str, float] = {}
    jobs: dict[str, int] = {}
    rows = session.exec(
        select(JobRow.tenant, JobRow.gpus).where(col(JobRow.state).in_(ACTIVE))
    ).all()
    for tenant, width in rows:
        demand[tenant] = demand.get(tenant, 0.0) + width
        jobs[tenant] = jobs.get(tenant, 0) + 1
    held: dict[str, int] = {}
    leases = session.exec(
        select(JobRow.tenant, LeaseRow.gpus)
        .join(LeaseRow, col(LeaseRow.job_id) == col(JobRow.id))
        .where(col(LeaseRow.state).in_(LIVE_LEASES))
    ).all()
    for tenant, gpus in leases:
        held[tenant] = held.get(tenant, 0) + len(gpus)
    ready = session.exec(
        select(func.coalesce(func.sum(NodeRow.gpus), 0)).where(NodeRow.state == NodeState.READY)
    ).one()
    valid = {t: d for t, d in demand.items() if _is_path(t)}
    entitled = entitlements(core_tenants(session), valid, float(ready)) if valid else {}
    totals: dict[str, list[float]] = {}
    for tenant in set(demand) | set(held):
        for path in lineage(tenant) if _is_path(tenant) else [tenant]:
            sums = totals.setdefault(path, [0.0, 0.0, 0.0])
            sums[0] += entitled.get(tenant, 0.0)
            sums[1] += held.get(tenant, 0)
            sums[2] += jobs.get(tenant, 0)
    return {
        path: Share(entitled_gpus=e, held_gpus=int(h), active_jobs=int(n))
        for path, (e, h, n) in totals.items()
    }


def _is_path(tenant: str) -> bool:
    return bool(tenant) and re.fullmatch(PATH_PATTERN, tenant) is not None
