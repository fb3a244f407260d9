"""Memos of per-decision work that repeats from round to round.

A Shockwave decision predicts every active job's trajectory and builds the throughput model
from every measurement, though between two rounds most inputs do not change: a job that waits
has the same progress, and the population prior changes only when a job finishes. These memos
return the previous result when every input is the same, so a long simulation pays for a
prediction only when its job moved, a measurement arrived or a job finished.

They change no result: an entry is used only when each input it was computed from is the very
same object (the prior, the throughput model, the params, the job's spec) or an equal value
(the job's progress), and an entry keeps those objects alive, so that no other object can take
an identity while the entry stands.

Memos are bounded (cleared whole when full) and guarded by a lock: the service may decide for
several clusters from threads, each with its own objects, so they share the memo but never an
entry.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from shockwave.domain.snapshot import ActiveJob

V = TypeVar("V")

_LIMIT = 50_000
"""Entries a memo holds before it is cleared (a few times the active jobs of a large run)."""


def progress_key(job: ActiveJob) -> Hashable:
    """What a prediction reads of a job's progress: its batch size, epochs done, finished
    regimes and measured epoch times (reference type and per type)."""
    progress = job.progress
    return (
        progress.batch_size,
        progress.epochs_done,
        progress.observed_regimes,
        tuple(progress.measured_epoch_seconds.items()),
        tuple((t, tuple(m.items())) for t, m in progress.measured_by_type.items()),
    )


def moved_only(before: Hashable, now: Hashable) -> bool:
    """Whether two :func:`progress_key` values differ in the epochs done alone (a job that
    trained on at the same batch size, with the same measurements)."""
    if not (isinstance(before, tuple) and isinstance(now, tuple)):
        return False
    return before[0] == now[0] and before[1] != now[1] and before[2:] == now[2:]


class IdentityMemo(Generic[V]):
    """Values keyed by (objects compared by identity, a hashable value key).

    ``get(objects, key, compute)``: the value stored for the same ``objects`` (each the very
    object, ``is``) and an equal ``key``, else ``compute()``, stored with references to
    ``objects``."""

    def __init__(self, limit: int = _LIMIT) -> None:
        self._limit = limit
        self._entries: dict[Hashable, tuple[Sequence[object], V]] = {}
        self._lock = threading.Lock()

    def get(self, objects: Sequence[object], key: Hashable, compute: Callable[[], V]) -> V:
        full = (tuple(map(id, objects)), key)
        with self._lock:
            hit = self._entries.get(full)
        # equal ids of as many objects: each the very object while the entry holds it
        if hit is not None and all(map(operator.is_, hit[0], objects)):
            return hit[1]
        value = compute()
        with self._lock:
            if len(self._entries) >= self._limit:
                self._entries.clear()
            self._entries[full] = (tuple(objects), value)
        return value

    def find(self, objects: Sequence[object], key: Hashable) -> V | None:
        """What :meth:`get` would return without computing: the value stored for the same
        ``objects`` and an equal ``key``, else None (for a caller that computes the values it
        misses together, then stores each with :meth:`put`)."""
        with self._lock:
            hit = self._entries.get((tuple(map(id, objects)), key))
        if hit is not None and all(map(operator.is_, hit[0], objects)):
            return hit[1]
        return None

    def put(self, objects: Sequence[object], key: Hashable, value: V) -> None:
        """Store ``value`` for ``objects`` (held) and ``key``."""
        with self._lock:
            if len(self._entries) >= self._limit:
                self._entries.clear()
            self._entries[(tuple(map(id, objects)), key)] = (tuple(objects), value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
