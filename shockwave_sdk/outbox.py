"""The job's event sequence and its undelivered events, kept in the checkpoint directory.

The API deduplicates a job's events by their per-job ``seq`` (docs/api.md): the same seq with
the same body is a harmless replay, the same seq with another body is a conflict. So a seq must
never be given to two different events, across retries, attempts and nodes. The outbox numbers
each event and writes it to disk *before* it is sent; a resumed attempt (any node that mounts
the same checkpoint directory) continues the sequence and sends what the last attempt could not.

File ``shockwave-events.json``: ``{"job_id": str, "last_seq": int, "pending": [event, ...],
"attempt": str | null}``, each event the exact JSON body to post, ``seq`` included.

The directory is shared by every attempt of the job, and only the newest may write it: an
outbox made for an ``attempt`` claims the file at once (writes its attempt id into it), and
before every later write checks that the file is still its own. A process that finds another
attempt's claim is one the job has moved on from (the orphan of a dead agent, say, still
running after its node was declared lost): :class:`OutboxTaken` is raised and nothing is
written, so its events can neither overwrite the newer attempt's sequence nor be sent later in
that attempt's name.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from shockwave_sdk.checkpoint import CheckpointStore

OUTBOX_NAME = "shockwave-events.json"

Event = dict[str, Any]


class OutboxTaken(Exception):
    """A newer attempt of the job has claimed the outbox: this process must stop writing."""


class EventOutbox:
    """A monotonic per-job seq and the events not yet acknowledged by the API. ``attempt``:
    the attempt this process runs (None outside a managed job: no claim, no check)."""

    def __init__(
        self,
        store: CheckpointStore,
        job_id: str,
        name: str = OUTBOX_NAME,
        attempt: str | None = None,
    ) -> None:
        self._store = store
        self._name = name
        self._job_id = job_id
        self._attempt = attempt
        self._lock = threading.Lock()
        stored = store.load_json(name)
        if isinstance(stored, Mapping) and stored.get("job_id") == job_id:
            self._last_seq = int(stored.get("last_seq", 0))
            self._pending: list[Event] = [dict(e) for e in stored.get("pending", [])]
        else:
            self._last_seq, self._pending = 0, []
        if attempt is not None:
            self._write()

    @property
    def last_seq(self) -> int:
        """The highest seq given out so far (0: none)."""
        return self._last_seq

    def pending(self) -> list[Event]:
        """Copies of the undelivered events, lowest seq first."""
        with self._lock:
            return [dict(e) for e in sorted(self._pending, key=lambda e: int(e["seq"]))]

    def add(self, body: Mapping[str, Any]) -> Event:
        """Number ``body`` with the next seq and store it as pending; returns the numbered event."""
        with self._lock:
            self._last_seq += 1
            event = {**body, "seq": self._last_seq}
            self._pending.append(event)
            self._save()
            return dict(event)

    def delivered(self, seq: int) -> None:
        """Forget the event with ``seq``: the API has it (or refused it for good)."""
        with self._lock:
            self._pending = [e for e in self._pending if int(e["seq"]) != seq]
            self._save()

    def renumber(self, seq: int, at_least: int = 0) -> Event:
        """Give the pending event ``seq`` a fresh seq above both the last one given and
        ``at_least`` (the highest seq the API already holds): the old seq belongs to another
        event, because an earlier outbox was lost."""
        with self._lock:
            self._last_seq = max(self._last_seq, at_least) + 1
            for event in self._pending:
                if int(event["seq"]) == seq:
                    event["seq"] = self._last_seq
                    self._save()
                    return dict(event)
            raise KeyError(f"no pending event with seq {seq}")

    def owner(self) -> str | None:
        """The attempt whose claim the file holds now (None: no claim)."""
        stored = self._store.load_json(self._name)
        if isinstance(stored, Mapping) and stored.get("job_id") == self._job_id:
            owner = stored.get("attempt")
            return str(owner) if owner is not None else None
        return None

    def _save(self) -> None:
        """Write the file, unless another attempt has claimed it (:class:`OutboxTaken`)."""
        if self._attempt is not None:
            owner = self.owner()
            if owner is not None and owner != self._attempt:
                raise OutboxTaken(
                    f"attempt {owner} of job {self._job_id} has taken over its checkpoint "
                    f"directory from attempt {self._attempt}"
                )
        self._write()

    def _write(self) -> None:
        self._store.save_json(
            self._name,
            {
                "job_id": self._job_id,
                "last_seq": self._last_seq,
                "pending": self._pending,
                "attempt": self._attempt,
            },
        )
