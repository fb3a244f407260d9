"""The agent's local state: the attempts it runs, the reports it still owes the server and the
attempts that ended, in a JSON file in its work directory.

The file is rewritten (atomically: write, fsync, rename) whenever something changes, before
the agent tells the server, so an agent killed at any point and started again finds every
process it had started (and re-attaches to it, or reports how it ended) and starts none twice.
One agent at a time uses a work directory: :func:`lock_work_dir` holds an exclusive ``flock``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.client import Report
from agent.runtime import Handle

log = logging.getLogger(__name__)

VERSION = 1
FINISHED_KEEP_S = 3600.0
"""How long an ended attempt is remembered, so a lease the server still lists for it (its
report not yet delivered) never starts it again."""


class WorkDirBusy(Exception):
    """Another agent holds the work directory."""


@dataclass
class AttemptRecord:
    """One attempt the agent started: its job, local GPUs, the lease's end (seconds since the
    epoch), the handle to its process or container, and, once asked to stop, when and why
    (``killed``: SIGKILL was sent after the grace period)."""

    attempt_id: str
    job_id: str
    gpus: list[int]
    ends_at: float
    handle: Handle
    started_at: float
    stop_requested_at: float | None = None
    stop_reason: str = ""
    killed: bool = False

    @property
    def stopping(self) -> bool:
        return self.stop_requested_at is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "job_id": self.job_id,
            "gpus": self.gpus,
            "ends_at": self.ends_at,
            "handle": self.handle.to_json(),
            "started_at": self.started_at,
            "stop_requested_at": self.stop_requested_at,
            "stop_reason": self.stop_reason,
            "killed": self.killed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptRecord:
        return cls(**{**data, "handle": Handle.from_json(data["handle"])})


@dataclass
class AgentState:
    """Everything the state file holds."""

    attempts: dict[str, AttemptRecord] = field(default_factory=dict)
    outbox: list[Report] = field(default_factory=list)
    finished: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "attempts": [record.to_json() for record in self.attempts.values()],
            "outbox": [
                {
                    "attempt_id": r.attempt_id,
                    "state": r.state,
                    "exit_code": r.exit_code,
                    "stop_requested": r.stop_requested,
                }
                for r in self.outbox
            ],
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentState:
        records = [AttemptRecord.from_json(item) for item in data.get("attempts", [])]
        return cls(
            attempts={record.attempt_id: record for record in records},
            outbox=[Report(**item) for item in data.get("outbox", [])],
            finished={str(k): float(v) for k, v in data.get("finished", {}).items()},
        )

    def forget_finished_before(self, moment: float) -> None:
        self.finished = {a: t for a, t in self.finished.items() if t >= moment}


def load(path: Path) -> AgentState:
    """The state in ``path``; empty if there is none. An unreadable file is kept aside
    (``.corrupt``) rather than silently overwritten."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return AgentState()
    try:
        return AgentState.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as error:
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.error("state file %s is unreadable (%s); kept as %s", path, error, aside)
        return AgentState()


def save(path: Path, state: AgentState) -> None:
    """Write ``state`` to ``path`` atomically and durably, readable by the agent alone (it
    names every attempt on the node)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(state.to_json(), handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


@contextmanager
def lock_work_dir(path: Path) -> Iterator[IO[str]]:
    """Hold an exclusive lock on ``path`` (the work directory's lock file) for the duration;
    :class:`WorkDirBusy` if another agent holds it."""
    handle = path.open("a")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkDirBusy(f"another agent uses {path.parent}") from None
        yield handle
    finally:
        handle.close()
