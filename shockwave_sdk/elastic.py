"""Elastic jobs: how many GPUs this attempt has, and whether that changed (docs/elastic.md).

The scheduler may lease an elastic job a different GPU count from its last attempt's. The
agent starts the attempt with that many GPUs (``CUDA_VISIBLE_DEVICES``) and says so in
``SHOCKWAVE_WORLD_SIZE``; the program resumes from its checkpoint and re-shards for the new
world size (a data-parallel job keeps its global batch size: each of the ``world_size``
workers takes ``batch_size / world_size`` samples a step). :func:`world_size_change` tells it
the previous attempt's count, kept in the checkpoint directory, and records the current one.
"""

from __future__ import annotations

from dataclasses import dataclass

from shockwave_sdk.checkpoint import CheckpointStore
from shockwave_sdk.environment import JobEnvironment

WORLD_SIZE_FILE = "shockwave-world-size.json"


@dataclass(frozen=True, slots=True)
class WorldSizeChange:
    """``current``: this attempt's GPU count; ``previous``: the last attempt's (None on a first
    start, or when no attempt recorded one)."""

    current: int
    previous: int | None

    @property
    def changed(self) -> bool:
        return self.previous is not None and self.previous != self.current

    def describe(self) -> str:
        if self.previous is None:
            return f"world size {self.current}"
        if not self.changed:
            return f"world size {self.current} (unchanged)"
        return f"world size {self.previous} -> {self.current}"


def world_size_change(env: JobEnvironment, store: CheckpointStore | None) -> WorldSizeChange:
    """This attempt's world size (1 when nothing says) against the last recorded one; records
    the current one in ``store`` (atomically) for the next attempt."""
    current = env.world_size or 1
    previous = None
    if store is not None:
        saved = store.load_json(WORLD_SIZE_FILE)
        if isinstance(saved, dict) and isinstance(saved.get("world_size"), int):
            previous = int(saved["world_size"])
        store.save_json(WORLD_SIZE_FILE, {"world_size": current, "attempt": env.attempt_id})
    return WorldSizeChange(current=current, previous=previous)
