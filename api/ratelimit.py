"""Per-caller request rate limits: one token bucket per token (per client IP without one).

Why in memory: the check runs on every request, including the polls of hundreds of agents, so it
must cost no database or network round trip. The price is that each API process keeps its own
buckets: with N processes behind a balancer a caller may get up to N times the limit. That bounds
a runaway client, which is the point; it is not a quota.

A bucket holds at most ``burst`` requests and refills at ``per_second``; a request takes one. An
empty bucket answers with the whole seconds until the next request may pass (the Retry-After of
a 429). Buckets are kept under one lock (the API serves sync routes from a thread pool), and
buckets are forgotten once there are ``max_keys`` (those refilled completely first), so a scan
from many addresses cannot grow memory without bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    level: float
    updated: float


class RateLimiter:
    """Token buckets keyed by caller (``"token:<id>"``, ``"ip:<address>"``).

    ``per_second`` <= 0 disables the limiter: :meth:`acquire` always answers 0.
    ``clock``: monotonic seconds (injected by tests)."""

    def __init__(
        self,
        per_second: float,
        burst: int,
        *,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second = per_second
        self.burst = max(1, burst)
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.per_second > 0

    def acquire(self, key: str) -> int:
        """Take one request from ``key``'s bucket: 0 when it passes, else the whole seconds
        (at least 1) to wait before the next one will."""
        if not self.enabled:
            return 0
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.max_keys:
                    self._forget_full(now)
                bucket = self._buckets[key] = _Bucket(level=float(self.burst), updated=now)
            else:
                elapsed = max(0.0, now - bucket.updated)
                bucket.level = min(float(self.burst), bucket.level + elapsed * self.per_second)
                bucket.updated = now
            if bucket.level >= 1.0:
                bucket.level -= 1.0
                return 0
            return max(1, math.ceil((1.0 - bucket.level) / self.per_second))

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled to ``burst`` (a fresh bucket is the same thing); if
        that is not enough, the oldest created (which then start full again)."""
        refill_s = self.burst / self.per_second
        stale = [key for key, b in self._buckets.items() if now - b.updated >= refill_s]
        for key in stale:
            del self._buckets[key]
        excess = len(self._buckets) - self.max_keys + 1
        for key in list(self._buckets)[: max(0, excess)]:
            del self._buckets[key]
