"""A short-lived, per-process cache of token lookups, so that a request costs no database round
trip to find out who is calling.

A token's revocation, or a change of its expiry, reaches a process within ``ttl_s``; a token
that expires sooner than that is cached only until it expires, so expiry is exact.

Why: every request authenticates, and most requests are agents' heartbeats and lease polls,
each a few small queries; the token lookup was one of them. Tokens never change once stored
(a token is created, then at most revoked or given a new expiry), so a cached lookup can only
be wrong about a token revoked in the last ``ttl_s`` seconds: revoking a token takes effect
within ``ttl_s`` (10 s by default) in every API process, not at once. Unknown tokens are never
cached, so a new token works at once and guessing is never helped.

Entries are keyed by (engine identity, token hash): two databases served by one process (tests
do this) never see each other's tokens. The cache holds at most ``max_entries``; when full it
starts over (a refill costs one lookup per caller).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class TtlCache(Generic[V]):
    """``get(key)``: the value stored less than ``ttl_s`` ago, else None. Thread-safe (the API
    runs its sync routes in a thread pool)."""

    def __init__(
        self,
        ttl_s: float = 10.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self.clock() >= entry[0]:
                del self._entries[key]
                return None
            return entry[1]

    def put(self, key: Hashable, value: V, ttl_s: float | None = None) -> None:
        """Keep ``value`` for ``ttl_s`` (at most the cache's lifetime; default: that)."""
        lifetime = self.ttl_s if ttl_s is None else min(ttl_s, self.ttl_s)
        if lifetime <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (self.clock() + lifetime, value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
