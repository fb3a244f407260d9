"""Tenants and their shares of the cluster: the tree, hierarchical water filling, job budgets.

Tenants form a tree named by paths: ``"org"`` is a child of the root ``""``, ``"org/team"`` a
child of ``"org"``. Jobs belong to tenants (the leaves, in practice; a job may name an inner
tenant, which then takes part among its children as one more child of weight 1 with no limits).
A tenant that no one configured has weight 1 and no limits, so a cluster whose jobs all belong
to the default tenant ``""`` is divided exactly as it was before tenants existed.

Each round, :func:`entitlements` divides the cluster among the tenants that have demand:
at every inner tenant, its share goes to the children with demand, first to fill their
guarantees (``guaranteed_gpus``, capped by their demand), then by weight up to their demand and
their ``max_gpus`` (water filling); a share a child cannot use goes to its siblings, and what no
child of a tenant can use is not claimed by it, so it goes to that tenant's siblings and so up
the tree. :func:`job_budgets` turns the leaves' entitlements into each job's weight in the
market (paper section 6.1, B_j): a tenant's entitlement is divided among its active jobs in
proportion to their priority multipliers (``priority_classes``, admin-defined), so a job's
priority moves it only within its own tenant's share.

Units: GPUs (fractions allowed: an entitlement is a share over time, not a gang).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from shockwave.domain.model import DEFAULT_TENANT, JobSpec, ValidationError, check_tenant_path

ROOT = DEFAULT_TENANT
"""The root tenant's path; the default tenant of a job that names none."""

MAX_WEIGHT = 1e6
"""The largest tenant weight or priority multiplier (both scale a job's market weight)."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant's settings: its ``weight`` among its siblings, the GPUs it is guaranteed when it
    has demand (``guaranteed_gpus``), the most GPUs it may hold, borrowing included
    (``max_gpus``), and the most jobs it may have queued and running (``max_jobs``; enforced at
    submission by the service). ``None``: no such limit."""

    path: str
    weight: float = 1.0
    guaranteed_gpus: int | None = None
    max_gpus: int | None = None
    max_jobs: int | None = None

    def __post_init__(self) -> None:
        check_tenant_path(self.path)
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
            raise ValidationError("weight", f"must be a positive number, got {w!r}")
        if not 0 < w <= MAX_WEIGHT:
            raise ValidationError("weight", f"must be in (0, {MAX_WEIGHT:g}], got {w!r}")
        for name in ("guaranteed_gpus", "max_gpus", "max_jobs"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(name, f"must be a whole number >= 0, got {value!r}")
        if (
            self.guaranteed_gpus is not None
            and self.max_gpus is not None
            and self.guaranteed_gpus > self.max_gpus
        ):
            raise ValidationError(
                "guaranteed_gpus",
                f"{self.guaranteed_gpus} is above max_gpus {self.max_gpus}",
            )

    @property
    def parent(self) -> str | None:
        """The parent's path; None for the root."""
        return parent_of(self.path)


def parent_of(path: str) -> str | None:
    """``"org/team"`` -> ``"org"``, ``"org"`` -> ``""``, ``""`` -> None."""
    if path == ROOT:
        return None
    head, _, _ = path.rpartition("/")
    return head


def ancestors(path: str) -> tuple[str, ...]:
    """``path`` and every tenant above it up to the root, nearest first."""
    chain = [path]
    up = parent_of(path)
    while up is not None:
        chain.append(up)
        up = parent_of(up)
    return tuple(chain)


def settings_of(tenants: Mapping[str, Tenant], path: str) -> Tenant:
    """The tenant at ``path``: its configured settings, else weight 1 and no limits."""
    found = tenants.get(path)
    return found if found is not None else Tenant(path)


def entitlements(
    tenants: Mapping[str, Tenant], demand_gpus: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Hierarchical water filling: the GPUs each tenant in ``demand_gpus`` is entitled to now.

    ``tenants``: configured tenants by path (any tenant not in it has the defaults).
    ``demand_gpus``: GPUs the active jobs of each tenant ask for (the sum of their gang widths),
    keyed by the jobs' tenant path. ``capacity``: the GPUs to divide.

    Returns one entry per key of ``demand_gpus``: never above its demand, nor above the
    ``max_gpus`` of it or of any tenant above it; the entries sum to ``min(capacity, what the
    demands and caps allow)``. At every tenant, guarantees (capped by demand and caps) come
    first (scaled down together when they do not fit), the rest goes by weight.
    """
    if capacity < 0 or not math.isfinite(capacity):
        raise ValidationError("capacity", f"must be a finite number >= 0, got {capacity!r}")
    for path, demand in demand_gpus.items():
        check_tenant_path(path)
        if not (math.isfinite(demand) and demand >= 0):
            raise ValidationError(f"demand[{path}]", f"must be >= 0, got {demand!r}")
    tree = _Tree(tenants, demand_gpus)
    shares: dict[str, float] = {path: 0.0 for path in demand_gpus}
    tree.divide(ROOT, min(float(capacity), tree.usable(ROOT)), shares)
    return shares


def job_budgets(
    job_tenants: Mapping[str, str],
    entitled: Mapping[str, float],
    multipliers: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Each job's market weight: its tenant's entitlement divided among the tenant's jobs.

    ``job_tenants``: job id -> tenant path, for the active jobs. ``entitled``: tenant path ->
    GPUs (:func:`entitlements`). ``multipliers``: job id -> its weight within its tenant (its
    priority class's multiplier times any budget of its own; 1 when absent).

    B_j = m_j * (E_t / E) * (M / M_t), where E_t is the job's tenant's entitlement, E the sum of
    the entitlements of the tenants with jobs, M_t the sum of the multipliers of the tenant's
    jobs and M that of all jobs: the budgets sum to M, each tenant's to its part of the
    entitlement, and with a single tenant every job's budget is its multiplier exactly.
    """
    mult = {job: float((multipliers or {}).get(job, 1.0)) for job in job_tenants}
    by_tenant: dict[str, float] = {}
    for job, tenant in job_tenants.items():
        by_tenant[tenant] = by_tenant.get(tenant, 0.0) + mult[job]
    total_mult = sum(by_tenant.values())
    total_entitled = sum(entitled.get(t, 0.0) for t in by_tenant)
    budgets: dict[str, float] = {}
    for job, tenant in job_tenants.items():
        if total_entitled <= 0 or by_tenant[tenant] <= 0:
            budgets[job] = mult[job]
            continue
        part = entitled.get(tenant, 0.0) / total_entitled
        budgets[job] = mult[job] * part * (total_mult / by_tenant[tenant])
    return budgets


def is_single_tenant(tenants: Mapping[str, Tenant], job_tenants: Iterable[str]) -> bool:
    """Whether one tenant holds every job and no tenant has a limit: then tenants change
    nothing (every job's budget is its own)."""
    paths = set(job_tenants)
    if len(paths) > 1:
        return False
    return all(
        t.max_gpus is None and t.guaranteed_gpus is None
        for path in paths
        for t in (settings_of(tenants, a) for a in ancestors(path))
    )


def freeze(tenants: Mapping[str, Tenant]) -> Mapping[str, Tenant]:
    """A read-only copy of ``tenants`` keyed by path, checking each key names its tenant."""
    for path, tenant in tenants.items():
        if tenant.path != path:
            raise ValidationError("tenants", f"key {path!r} holds tenant {tenant.path!r}")
    return MappingProxyType(dict(tenants))


class _Tree:
    """The tenants that have demand, with their usable GPUs (demand capped by ``max_gpus``)."""

    def __init__(self, tenants: Mapping[str, Tenant], demand: Mapping[str, float]) -> None:
        self.tenants = tenants
        self.children: dict[str, list[str]] = {}
        self.own: dict[str, float] = {}
        nodes: set[str] = set()
        for path, gpus in demand.items():
            if gpus <= 0:
                continue
            self.own[path] = self.own.get(path, 0.0) + float(gpus)
            nodes.update(ancestors(path))
        for path in sorted(nodes):
            up = parent_of(path)
            if up is not None:
                self.children.setdefault(up, []).append(path)
        self._usable: dict[str, float] = {}

    def usable(self, path: str) -> float:
        """GPUs the tenant at ``path`` could use: its own jobs' and its children's usable
        GPUs, capped by its ``max_gpus``."""
        if path in self._usable:
            return self._usable[path]
        total = self.own.get(path, 0.0) + sum(self.usable(c) for c in self.children.get(path, []))
        cap = settings_of(self.tenants, path).max_gpus
        value = total if cap is None else min(total, float(cap))
        self._usable[path] = value
        return value

    def divide(self, path: str, share: float, out: dict[str, float]) -> None:
        """Give ``share`` GPUs of the tenant at ``path`` to its own jobs and its children."""
        kids = [c for c in self.children.get(path, []) if self.usable(c) > 0]
        own = self.own.get(path, 0.0)
        if own > 0 and not kids:
            out[path] = share
            return
        claims: dict[str, tuple[float, float, float]] = {}
        for kid in kids:
            t = settings_of(self.tenants, kid)
            cap = self.usable(kid)
            floor = min(float(t.guaranteed_gpus or 0), cap)
            claims[kid] = (t.weight, floor, cap)
        if own > 0:
            claims[_OWN] = (1.0, 0.0, own)
        shares = water_fill_floors(claims, share)
        for kid, value in shares.items():
            if kid == _OWN:
                out[path] = value
            else:
                self.divide(kid, value, out)


_OWN = "\0own"
"""The claim of a tenant's own jobs among its children's (a job naming an inner tenant)."""


def water_fill_floors(
    claims: Mapping[str, tuple[float, float, float]], amount: float
) -> dict[str, float]:
    """Weighted water filling with floors and caps: ``claims[k] = (weight, floor, cap)``.

    Returns x_k = min(cap_k, max(floor_k, weight_k * L)) for the level L at which they sum to
    ``amount``; every claim its cap when the caps sum to no more; the floors scaled down in
    proportion when they alone exceed ``amount``. Exact (the level is solved on the piecewise
    linear sum between breakpoints, not searched).
    """
    if not claims:
        return {}
    caps_total = sum(cap for _, _, cap in claims.values())
    if caps_total <= amount:
        return {k: cap for k, (_, _, cap) in claims.items()}
    floors_total = sum(floor for _, floor, _ in claims.values())
    if floors_total >= amount:
        scale = amount / floors_total if floors_total > 0 else 0.0
        return {k: floor * scale for k, (_, floor, _) in claims.items()}

    def filled(level: float) -> float:
        return sum(min(c, max(f, w * level)) for w, f, c in claims.values())

    points = sorted(
        {0.0} | {f / w for w, f, _ in claims.values()} | {c / w for w, _, c in claims.values()}
    )
    low = 0.0
    for point in points:
        if filled(point) >= amount:
            break
        low = point
    else:  # unreachable: at the last breakpoint every claim is at its cap
        return {k: cap for k, (_, _, cap) in claims.items()}
    # Between low and point the sum is linear: the claims strictly inside (floor, cap) grow.
    rising = sum(w for w, f, c in claims.values() if f < w * low + 1e-15 and w * low < c - 1e-15)
    base = filled(low)
    level = low + (amount - base) / rising if rising > 0 else point
    return {k: min(c, max(f, w * level)) for k, (w, f, c) in claims.items()}


@dataclass(frozen=True, slots=True)
class TenantMarket:
    """The market of one round by tenant.

    ``entitled``: tenant path -> GPUs it is entitled to (:func:`entitlements`) for the tenants
    with active jobs. ``budgets``: job id -> its weight in the market (B_j,
    :func:`job_budgets`). ``contention``: job id -> its gang width over its fair share inside its
    tenant's share (the tenant's entitlement times the job's part of the tenant's multipliers;
    at least 1): how many times slower than alone it runs at that share, the N of its
    finish-time fairness. ``multipliers``: job id -> its weight
    among its tenant's jobs (its budget times its priority class's multiplier). ``single``:
    one tenant and no limits; then budgets are the jobs' own and a policy keeps its untenanted
    rule (the cluster's contention).
    """

    entitled: Mapping[str, float]
    budgets: Mapping[str, float]
    contention: Mapping[str, float]
    single: bool
    multipliers: Mapping[str, float]


def market(
    specs: Iterable[JobSpec],
    tenants: Mapping[str, Tenant],
    priority_classes: Mapping[str, float],
    capacity: float,
) -> TenantMarket:
    """The round's :class:`TenantMarket` for the active jobs ``specs`` on ``capacity`` GPUs.

    A job's multiplier within its tenant is its own ``budget`` times its priority class's
    multiplier (1 for no class or one not in ``priority_classes``); each tenant's demand is the
    sum of its jobs' gang widths.
    """
    jobs = list(specs)
    multipliers = {s.job_id: s.budget * _class_multiplier(s, priority_classes) for s in jobs}
    job_tenants = {s.job_id: s.tenant for s in jobs}
    demand: dict[str, float] = {}
    for s in jobs:
        demand[s.tenant] = demand.get(s.tenant, 0.0) + s.gpus
    entitled = entitlements(tenants, demand, capacity)
    single = is_single_tenant(tenants, job_tenants.values())
    budgets = multipliers if single else job_budgets(job_tenants, entitled, multipliers)
    by_tenant: dict[str, float] = {}
    for job, tenant in job_tenants.items():
        by_tenant[tenant] = by_tenant.get(tenant, 0.0) + multipliers[job]
    contention: dict[str, float] = {}
    width = {s.job_id: s.gpus for s in jobs}
    for job, tenant in job_tenants.items():
        fair = entitled.get(tenant, 0.0) * multipliers[job] / by_tenant[tenant]
        contention[job] = max(1.0, width[job] / fair) if fair > 0 else math.inf
    return TenantMarket(
        MappingProxyType(entitled),
        MappingProxyType(budgets),
        MappingProxyType(contention),
        single,
        MappingProxyType(multipliers),
    )


def _class_multiplier(spec: JobSpec, priority_classes: Mapping[str, float]) -> float:
    if spec.priority is None:
        return 1.0
    return float(priority_classes.get(spec.priority, 1.0))


AT_LIMIT = "tenant at its GPU limit"
"""Why a job waits when running it would put its tenant (or one above it) over ``max_gpus``."""


def has_limits(tenants: Mapping[str, Tenant]) -> bool:
    """Whether any tenant has a ``max_gpus`` or a ``guaranteed_gpus``: only then does the round
    engine apply tenant limits (without, it places exactly as it did before tenants)."""
    return any(t.max_gpus is not None or t.guaranteed_gpus for t in tenants.values())


class TenantUsage:
    """GPUs held per tenant, counted at every tenant above it too, against ``max_gpus``."""

    def __init__(self, tenants: Mapping[str, Tenant]) -> None:
        self.tenants = tenants
        self.held: dict[str, int] = {}

    def fits(self, tenant: str, gpus: int) -> bool:
        """Whether ``gpus`` more for ``tenant`` keep it and every tenant above it within
        ``max_gpus``."""
        for path in ancestors(tenant):
            cap = settings_of(self.tenants, path).max_gpus
            if cap is not None and self.held.get(path, 0) + gpus > cap:
                return False
        return True

    def add(self, tenant: str, gpus: int) -> None:
        for path in ancestors(tenant):
            self.held[path] = self.held.get(path, 0) + gpus


def limit_column(
    column: Sequence[str],
    arrival_order: Sequence[str],
    width: Mapping[str, int],
    tenant_of: Mapping[str, str],
    tenants: Mapping[str, Tenant],
    total_gpus: int,
) -> tuple[list[str], dict[str, str]]:
    """A round's jobs (``column``, highest priority first) within the tenants' limits.

    1. Guarantees: a tenant with ``guaranteed_gpus`` and waiting demand that the column gives
       fewer than ``min(guarantee, demand)`` GPUs gets its jobs (from ``arrival_order``, the
       active jobs in arrival order) put first, while they fit its guarantee; to make room,
       jobs of tenants that are not short of a guarantee leave the column from its end.
    2. Caps: walking the column in order, a job whose width would put its tenant or a tenant
       above it over ``max_gpus`` leaves it, with :data:`AT_LIMIT` as its reason.

    Returns the new column and the reasons of the jobs taken out by a cap.
    """
    shortfall = _guarantee_shortfall(column, arrival_order, width, tenant_of, tenants)
    chosen = list(column)
    if shortfall:
        front: list[str] = []
        for job in arrival_order:
            chain = ancestors(tenant_of[job])
            if job in chosen or not any(shortfall.get(p, 0) >= width[job] for p in chain):
                continue
            front.append(job)
            for path in chain:
                if path in shortfall:
                    shortfall[path] -= width[job]
        guaranteed = {p for p, t in tenants.items() if t.guaranteed_gpus}
        used = sum(width[j] for j in chosen) + sum(width[j] for j in front)
        for job in reversed(list(chosen)):
            if used <= total_gpus:
                break
            if not guaranteed.intersection(ancestors(tenant_of[job])):
                chosen.remove(job)
                used -= width[job]
        while used > total_gpus and front:  # guarantees over the cluster: the last ones wait
            used -= width[front.pop()]
        chosen = front + chosen
    return within_caps(chosen, {}, width, tenant_of, tenants)


def within_caps(
    candidates: Sequence[str],
    holding: Mapping[str, int],
    width: Mapping[str, int],
    tenant_of: Mapping[str, str],
    tenants: Mapping[str, Tenant],
) -> tuple[list[str], dict[str, str]]:
    """The ``candidates`` (in order) that may start on top of ``holding`` (job id -> GPUs held
    by jobs already running) without a tenant over its ``max_gpus``, and the reasons of the
    others (:data:`AT_LIMIT`)."""
    usage = TenantUsage(tenants)
    for job, gpus in holding.items():
        usage.add(tenant_of.get(job, ROOT), gpus)
    kept: list[str] = []
    refused: dict[str, str] = {}
    for job in candidates:
        if usage.fits(tenant_of[job], width[job]):
            usage.add(tenant_of[job], width[job])
            kept.append(job)
        else:
            refused[job] = AT_LIMIT
    return kept, refused


def _guarantee_shortfall(
    column: Sequence[str],
    arrival_order: Sequence[str],
    width: Mapping[str, int],
    tenant_of: Mapping[str, str],
    tenants: Mapping[str, Tenant],
) -> dict[str, int]:
    """Guaranteed tenant path -> GPUs its jobs need added to the column to reach
    ``min(guarantee, demand)``, for those short of it."""
    in_column: dict[str, int] = {}
    demand: dict[str, int] = {}
    for job in arrival_order:
        for path in ancestors(tenant_of[job]):
            demand[path] = demand.get(path, 0) + width[job]
    for job in column:
        for path in ancestors(tenant_of[job]):
            in_column[path] = in_column.get(path, 0) + width[job]
    short: dict[str, int] = {}
    for path, tenant in tenants.items():
        if tenant.guaranteed_gpus:
            need = min(tenant.guaranteed_gpus, demand.get(path, 0)) - in_column.get(path, 0)
            if need > 0:
                short[path] = need
    return short


MAX_OWED_GPUS = 8.0
"""The most GPU-rounds a tenant's balance carries to the next round, either way
(:func:`owed_after`): one widest gang, enough to even out a share that gangs cannot match
exactly (5.3 GPUs of 4-GPU jobs) without letting a long shortfall buy a burst."""

AT_SHARE = "its tenant holds its share; no idle GPUs to borrow"
"""Why a job waits when its tenant has its share this round and no GPU is left idle."""


def share_round(
    order: Sequence[str],
    width: Mapping[str, int],
    tenant_of: Mapping[str, str],
    quota: Mapping[str, float],
    total_gpus: int,
) -> tuple[list[str], dict[str, str]]:
    """A round's jobs with each tenant held to its share while others want theirs.

    ``order``: active job ids, the policy's preference first (its round, then its fillers,
    then the rest). First pass: a job runs when it fits the free GPUs and its tenant's GPUs stay
    within ``quota`` (its entitlement plus what it is owed), and no job of its tenant before it
    in ``order`` was held back for the quota (a tenant's later jobs do not take its share ahead
    of one that did not fit: they come after it in the second pass); second pass: the GPUs
    still free go to jobs of any tenant in the same order (idle share is lent; the next round
    takes it back). Returns the jobs in the order chosen and, for the others,
    :data:`AT_SHARE` where the first pass held them back. A quota below 0 (a tenant that owes
    GPUs) holds all of its jobs to the second pass.
    """
    free = total_gpus
    used: dict[str, float] = {}
    chosen: list[str] = []
    held_back: set[str] = set()
    blocked: set[str] = set()
    for job in order:
        tenant = tenant_of[job]
        if width[job] > free:
            continue
        if tenant in blocked or used.get(tenant, 0.0) + width[job] > quota.get(tenant, 0.0) + 1e-9:
            held_back.add(job)
            blocked.add(tenant)
            continue
        chosen.append(job)
        used[tenant] = used.get(tenant, 0.0) + width[job]
        free -= width[job]
    taken = set(chosen)
    for job in order:
        if job not in taken and width[job] <= free:
            chosen.append(job)
            taken.add(job)
            free -= width[job]
    return chosen, {j: AT_SHARE for j in held_back if j not in taken}


def share_order(
    planned: Sequence[str],
    whole_window: Collection[str],
    late: Mapping[str, float],
    running: Collection[str] = (),
) -> list[str]:
    """The order in which a round's ``planned`` jobs (the plan's order) take their tenants'
    shares in :func:`share_round`: the jobs the plan holds for its ``whole_window`` first (the
    plan's long jobs, whose every round counts for the makespan), then the ``late`` ones (job id
    -> fairness deadline: past it at full speed) by earliest deadline, then the jobs
    ``running`` now, then the rest, each group in the plan's order.

    A late job goes ahead of a running job that the plan does not hold for its whole window:
    each round it waits puts it further past its fair finish, while the running job can resume
    a round later at the cost of one restart."""
    first = [j for j in planned if j in whole_window]
    taken = set(first)
    first += sorted((j for j in planned if j in late and j not in taken), key=lambda j: late[j])
    taken = set(first)
    first += [j for j in planned if j in running and j not in taken]
    taken = set(first)
    return first + [j for j in planned if j not in taken]


def owed_after(
    owed: Mapping[str, float],
    entitled: Mapping[str, float],
    chosen: Sequence[str],
    width: Mapping[str, int],
    tenant_of: Mapping[str, str],
    slack_rounds: float = 0.0,
) -> dict[str, float]:
    """Each tenant's balance after a round (tenants with demand only): what it was owed plus
    its entitlement less the GPUs its jobs got, within +-(the larger of :data:`MAX_OWED_GPUS`
    and ``slack_rounds`` rounds of its entitlement). A tenant that got more than its share owes
    it back only as far as other tenants got less (GPUs that no one else could use were lent
    free); the balances of a round sum to 0 when it is full."""
    used: dict[str, float] = {}
    for job in chosen:
        used[tenant_of[job]] = used.get(tenant_of[job], 0.0) + width[job]
    delta = {t: gpus - used.get(t, 0.0) for t, gpus in entitled.items()}
    short = sum(d for d in delta.values() if d > 0)
    over = -sum(d for d in delta.values() if d < 0)
    scale = min(1.0, short / over) if over > 0 else 1.0
    balances: dict[str, float] = {}
    for t, d in delta.items():
        bound = max(MAX_OWED_GPUS, slack_rounds * entitled[t])
        balances[t] = min(bound, max(-bound, owed.get(t, 0.0) + (d if d > 0 else d * scale)))
    return balances


def share_quotas(
    entitled: Mapping[str, float], owed: Mapping[str, float], slack_rounds: float = 0.0
) -> dict[str, float]:
    """Each tenant's GPUs for the first pass of :func:`share_round`: its entitlement, plus its
    balance (:func:`owed_after`), plus ``slack_rounds`` times its entitlement: a tenant may run
    ahead of its share until its balance has used that slack up, and one behind gets it back
    first."""
    return {t: gpus * (1.0 + slack_rounds) + owed.get(t, 0.0) for t, gpus in entitled.items()}
