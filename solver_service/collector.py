"""Python's cycle collector, quiet while a long computation runs: a simulation (``shockwave
simulate``, ``bench.long_trace``), the driver writing a boundary, a worker reading its snapshot
and planning.

Each keeps many long-lived objects (the workload and the rounds' records, each active job's
fixed fields or spec, the policy's memos, the database layer's caches) and allocates
short-lived ones by the million (views, predictions, plans, rows, leases), so the collector's
default thresholds traverse the long-lived ones again and again: 13% of the CPU of the first
3,000 rounds of 60 days of a production trace, nearly half of a snapshot's at 10,000 active
jobs (0.75 -> 0.40 CPU-s quiet). Nothing any of them computes depends on when garbage is
collected, so results are the same either way.

Shared by the threads of a process (the API's request threads, the driver's and an embedded
solver's): the first block to enter quiets the collector and the last to leave restores it,
so one thread's exit never ends another's quiet or leaves the collector quiet; a process
that runs several simulations one after another (a test session, a sweep's worker) gets its
own settings back after each.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

QUIET_THRESHOLDS = (50_000, 20, 100)
"""Generation thresholds while quiet: the youngest collected every 50,000 allocations net of
frees (the default is 700), the older generations as by default."""

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, ...] = ()


@contextmanager
def quiet_collector() -> Iterator[None]:
    """Collect cycles rarely inside the block: what exists when the first block enters is
    frozen out of every collection and the thresholds are :data:`QUIET_THRESHOLDS`; when the
    last block leaves, the frozen objects are collectable again and the process's thresholds
    are restored."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(*QUIET_THRESHOLDS)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                gc.unfreeze()
