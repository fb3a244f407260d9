"""The job state machine, in one place (SPEC section 5).

PENDING: admitted, waiting. RUNNING: holds a lease this round. SUSPENDED: was running, was
preempted and checkpointed. SUCCEEDED, FAILED, CANCELLED: terminal. Every shell moves jobs only
through :func:`transition`, so an illegal move is refused the same way everywhere.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {
            JobState.SUSPENDED,
            JobState.PENDING,
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.SUSPENDED: frozenset(
        {JobState.RUNNING, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""Legal moves. RUNNING -> PENDING is a lost node: the job returns to the queue from its last
checkpoint. Terminal states have no way out."""


class IllegalTransition(ValueError):
    """A move the state machine forbids; shells answer it with 409 Conflict."""

    def __init__(self, current: JobState, target: JobState) -> None:
        super().__init__(f"a {current.value} job cannot become {target.value}")
        self.current = current
        self.target = target


def transition(current: JobState, target: JobState) -> JobState:
    """``target`` if the move is legal, else :class:`IllegalTransition`."""
    if target not in ALLOWED[current]:
        raise IllegalTransition(current, target)
    return target
