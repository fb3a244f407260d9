"""Python's cycle collector, quiet for the length of a long simulation.

A simulation allocates millions of short-lived objects a run (views, predictions, plans) and
keeps many long-lived ones (the workload, the rounds' records, the policy's memos), which the
collector's default thresholds traverse again and again: 13% of the CPU of the first 3,000
rounds of 60 days of a production trace. Nothing a simulation computes depends on when garbage
is collected, so its results are the same either way.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

QUIET_THRESHOLDS = (50_000, 20, 100)
"""Generation thresholds while quiet: the youngest collected every 50,000 allocations net of
frees (the default is 700), the older generations as by default."""


@contextmanager
def quiet_collector() -> Iterator[None]:
    """Collect cycles rarely inside the block: what exists on entry (the loaded workload) is
    frozen out of every collection and the thresholds are :data:`QUIET_THRESHOLDS`; on exit
    the frozen objects are collectable again and the thresholds are restored, so a process
    that runs several simulations (a test session, a sweep's worker) keeps its own settings."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*QUIET_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
