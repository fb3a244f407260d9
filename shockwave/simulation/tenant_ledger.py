"""What each tenant was entitled to and what it received, hour by hour, over a run.

Entitlement: at every round boundary the jobs active then (their tenants and gang widths) are
the demand, and :func:`shockwave.domain.tenancy.entitlements` divides the cluster among their
tenants; when one of those jobs finishes its demand leaves at once (a tenant is never entitled to
more than it can use), and a job that arrives during a round counts from the next boundary (the
earliest a scheduler can give it its share: idle share is lent and reclaimed at boundaries).
Received: GPU-seconds the tenant's jobs held GPUs (restores included: the GPUs were theirs).
Both are integrated piecewise over time and added up in hours from time 0 (the trace's clock).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shockwave.domain.tenancy import Tenant, entitlements

HOUR_S = 3600.0


class TenantLedger:
    """Entitled and received GPU-seconds per tenant and hour (module docstring)."""

    def __init__(
        self, tenants: Mapping[str, Tenant], capacity: float, hour_s: float = HOUR_S
    ) -> None:
        self.tenants = tenants
        self.capacity = capacity
        self.hour_s = hour_s
        self.demand: dict[str, tuple[str, int]] = {}
        self.ends: dict[str, float] = {}
        self.since: float | None = None
        self.entitled: dict[str, dict[int, float]] = {}
        self.received: dict[str, dict[int, float]] = {}
        self._rates: dict[str, float] = {}

    def boundary(self, now: float, jobs: Mapping[str, tuple[str, int]]) -> None:
        """A round starts at ``now`` with ``jobs`` (job id -> (tenant, GPUs)) active."""
        self.advance(now)
        self.demand = dict(jobs)
        self.ends = {j: t for j, t in self.ends.items() if j in self.demand}
        self.since = now
        self._rates = self._entitled()

    def finish(self, job_id: str, at: float) -> None:
        """``job_id`` finishes at ``at``: its demand leaves then."""
        if job_id in self.demand:
            self.ends[job_id] = at

    def hold(self, tenant: str, start: float, end: float, gpus: int) -> None:
        """``tenant``'s job held ``gpus`` GPUs from ``start`` to ``end``."""
        self._spread(self.received, tenant, start, end, float(gpus))

    def advance(self, to: float) -> None:
        """Count entitlement up to ``to``, splitting at the finishes registered before it."""
        if self.since is None:
            return
        for job_id, at in sorted(self.ends.items(), key=lambda kv: kv[1]):
            if at > to:
                break
            self._count(self.since, max(self.since, at))
            self.since = max(self.since, at)
            del self.demand[job_id]
            del self.ends[job_id]
            self._rates = self._entitled()
        self._count(self.since, max(self.since, to))
        self.since = max(self.since, to)

    def hours(self) -> dict[str, tuple[tuple[int, float, float], ...]]:
        """Tenant -> (hour, entitled GPU-s, received GPU-s) for every hour with either, in
        order."""
        out: dict[str, tuple[tuple[int, float, float], ...]] = {}
        for tenant in sorted(set(self.entitled) | set(self.received)):
            ent = self.entitled.get(tenant, {})
            got = self.received.get(tenant, {})
            out[tenant] = tuple(
                (h, ent.get(h, 0.0), got.get(h, 0.0)) for h in sorted(set(ent) | set(got))
            )
        return out

    def _entitled(self) -> dict[str, float]:
        demand: dict[str, float] = {}
        for tenant, gpus in self.demand.values():
            demand[tenant] = demand.get(tenant, 0.0) + gpus
        return entitlements(self.tenants, demand, self.capacity)

    def _count(self, start: float, end: float) -> None:
        for tenant, gpus in self._rates.items():
            self._spread(self.entitled, tenant, start, end, gpus)

    def _spread(
        self, book: dict[str, dict[int, float]], tenant: str, start: float, end: float, rate: float
    ) -> None:
        """Add ``rate`` GPUs from ``start`` to ``end`` to ``tenant``'s hours in ``book``."""
        if end <= start or rate <= 0:
            return
        hours = book.setdefault(tenant, {})
        t = start
        while t < end:
            hour = math.floor(t / self.hour_s)
            stop = min(end, (hour + 1) * self.hour_s)
            hours[hour] = hours.get(hour, 0.0) + rate * (stop - t)
            t = stop
