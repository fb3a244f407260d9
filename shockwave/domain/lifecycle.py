"""The state machines of jobs, leases and nodes, in one place.

Every state name and every set of states a rule depends on is defined here once; the shells
store the values and move jobs and leases only through :func:`transition` and
:func:`lease_transition`, so an illegal move is refused the same way everywhere.

Jobs. PENDING: admitted, waiting. RUNNING: holds a lease this round. SUSPENDED: was running,
was preempted and checkpointed. SUCCEEDED, FAILED, CANCELLED: terminal.

Leases. A lease is one attempt (its id) to run a job on one node's GPUs for a round:

- live: ``ISSUED`` (the round driver issued it), ``STARTED`` and ``RUNNING`` (the agent
  reported the process up). A live lease holds its GPUs; at the next boundary the driver
  either extends it (same attempt, new round and end time: no state change) or revokes it.
- ``REVOKED``: the driver took it back; the agent must stop the process (SIGTERM, grace period
  to checkpoint, SIGKILL) and report ``checkpointed`` or ``exited``.
- ``CHECKPOINTED`` / ``EXITED``: the agent reported that the process stopped.
- ``LOST``: the node stopped heartbeating; whatever it still runs must stop.

Nodes. READY (heartbeating) or LOST (silent for the TTL); a LOST node that heartbeats again is
READY again.
"""

from __future__ import annotations

from dataclasses import dataclass
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

ACTIVE: tuple[JobState, ...] = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)
"""Jobs that request GPUs: admitted and not finished."""

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
    """A move a state machine forbids; shells answer it with 409 Conflict."""

    def __init__(self, current: StrEnum, target: StrEnum, what: str = "job") -> None:
        super().__init__(f"a {current.value} {what} cannot become {target.value}")
        self.current = current
        self.target = target


def transition(current: JobState, target: JobState) -> JobState:
    """``target`` if the move is legal, else :class:`IllegalTransition`."""
    if target not in ALLOWED[current]:
        raise IllegalTransition(current, target)
    return target


class LeaseState(StrEnum):
    ISSUED = "ISSUED"
    STARTED = "STARTED"
    RUNNING = "RUNNING"
    CHECKPOINTED = "CHECKPOINTED"
    EXITED = "EXITED"
    REVOKED = "REVOKED"
    LOST = "LOST"

    @property
    def live(self) -> bool:
        return self in LIVE_LEASES


LIVE_LEASES: tuple[LeaseState, ...] = (LeaseState.ISSUED, LeaseState.STARTED, LeaseState.RUNNING)
"""States in which a lease holds its GPUs."""

STOPPED_LEASES: tuple[LeaseState, ...] = (LeaseState.CHECKPOINTED, LeaseState.EXITED)
"""States in which the agent confirmed that the attempt's process is gone."""

STARTED_LEASES: tuple[LeaseState, ...] = (
    LeaseState.STARTED,
    LeaseState.RUNNING,
    LeaseState.CHECKPOINTED,
    LeaseState.EXITED,
)
"""States of an attempt whose process was reported up (and may have stopped since)."""

TAKEN_BACK: tuple[LeaseState, ...] = (LeaseState.REVOKED, LeaseState.LOST)
"""States of an attempt the server took back before its process confirmed it stopped."""

_STOPPING = frozenset({LeaseState.CHECKPOINTED, LeaseState.EXITED, LeaseState.LOST})
LEASE_ALLOWED: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.ISSUED: frozenset(
        {LeaseState.STARTED, LeaseState.RUNNING, LeaseState.REVOKED} | _STOPPING
    ),
    LeaseState.STARTED: frozenset({LeaseState.RUNNING, LeaseState.REVOKED} | _STOPPING),
    LeaseState.RUNNING: frozenset({LeaseState.REVOKED} | _STOPPING),
    LeaseState.REVOKED: _STOPPING,
    LeaseState.CHECKPOINTED: frozenset(),
    LeaseState.EXITED: frozenset(),
    LeaseState.LOST: frozenset(),
}
"""Legal lease moves: a live lease moves on (ISSUED -> STARTED -> RUNNING), is revoked, lost or
reported stopped; a revoked one is reported stopped or lost; stopped and lost leases are final."""


def lease_transition(current: LeaseState, target: LeaseState) -> LeaseState:
    """``target`` if the lease move is legal, else :class:`IllegalTransition`."""
    if target not in LEASE_ALLOWED[current]:
        raise IllegalTransition(current, target, "lease")
    return target


class NodeState(StrEnum):
    READY = "READY"
    LOST = "LOST"


REPORTS_PER_GPU = 2
REPORTS_PER_POLL_MIN = 8


def reports_per_poll(gpus: int) -> int:
    """The most attempt reports (and log tails) one agent poll of a node with ``gpus`` GPUs
    may carry: two per GPU (each GPU's attempt that ended and its successor's), at least
    ``REPORTS_PER_POLL_MIN``. It bounds the server's work per request by what the node can
    run, not by what the agent says; an agent with more owed sends the rest in its next
    polls."""
    return max(REPORTS_PER_POLL_MIN, REPORTS_PER_GPU * gpus)


class Report(StrEnum):
    """What an agent reports about an attempt: its process ``started``, is ``running``,
    ``checkpointed`` (saved its state and stopped) or ``exited`` with a code."""

    STARTED = "started"
    RUNNING = "running"
    CHECKPOINTED = "checkpointed"
    EXITED = "exited"


class JobEffect(StrEnum):
    """What a report does to the attempt's job: it ``run``s (RUNNING), goes back to the queue
    unless it runs elsewhere (``requeue``: SUSPENDED with a checkpoint, else PENDING), or ends
    (``succeed``, ``fail``: its other attempts are revoked)."""

    RUN = "run"
    REQUEUE = "requeue"
    SUCCEED = "succeed"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class ReportEffect:
    """What a report does: ``lease``, the attempt's new state (None: unchanged) and the
    ``exit_code`` it records; ``job``, what happens to the job (None: nothing); ``refused``,
    why the attempt must stop instead (None: the report is applied)."""

    lease: LeaseState | None = None
    exit_code: int | None = None
    job: JobEffect | None = None
    refused: str | None = None


def report_effect(
    attempt_id: str,
    lease: LeaseState,
    lease_exit_code: int | None,
    job_id: str,
    job: JobState,
    report: Report,
    exit_code: int | None = None,
    stop_requested: bool = False,
    superseded_by: str | None = None,
) -> ReportEffect:
    """The effect of ``report`` on attempt ``attempt_id`` (its lease in state ``lease``, which
    recorded ``lease_exit_code``) of job ``job_id`` (in state ``job``):

    - a ``LOST`` attempt's reports are refused: its job has already gone back to the queue;
    - on a stopped attempt, the same stop again changes nothing; any other report is refused;
    - ``started`` / ``running`` on a live lease: the lease moves on (ISSUED -> STARTED on
      ``started``; RUNNING on ``running``), the job runs; refused on a revoked lease, and on a
      live lease of a finished job, which is revoked;
    - ``checkpointed``: the lease is CHECKPOINTED; an unfinished job goes back to the queue;
    - ``exited`` (no code counts as 0): the lease is EXITED; an unfinished job succeeds on 0,
      goes back to the queue on a nonzero code or a signal when the process was asked to stop
      (the lease was revoked, or ``stop_requested``: the agent stopped it on its own), and
      fails otherwise;
    - a revoked attempt ``superseded_by`` a newer one that has started is fenced: whatever it
      reports is refused and changes nothing (the newer attempt owns the job; a stale exit 0
      must not finish a job that runs elsewhere).
    """
    if lease is LeaseState.LOST:
        return ReportEffect(
            refused=f"attempt {attempt_id} was lost with its node; its job went back to the queue"
        )
    if lease in STOPPED_LEASES:
        same = (report is Report.CHECKPOINTED and lease is LeaseState.CHECKPOINTED) or (
            report is Report.EXITED and lease is LeaseState.EXITED and lease_exit_code == exit_code
        )
        if same:
            return ReportEffect()
        return ReportEffect(refused=f"attempt {attempt_id} has already stopped ({lease.lower()})")
    revoked = lease is LeaseState.REVOKED
    if revoked and superseded_by is not None:
        return ReportEffect(
            refused=f"attempt {attempt_id} was revoked and attempt {superseded_by} has taken over"
        )
    if report in (Report.STARTED, Report.RUNNING):
        if revoked:
            return ReportEffect(refused=f"attempt {attempt_id} was revoked")
        if job.terminal:
            return ReportEffect(
                lease=LeaseState.REVOKED, refused=f"job {job_id} is {job.value.lower()}"
            )
        target: LeaseState | None = None
        if report is Report.RUNNING:
            target = LeaseState.RUNNING
        elif lease is LeaseState.ISSUED:
            target = LeaseState.STARTED
        return ReportEffect(lease=None if target is lease else target, job=JobEffect.RUN)
    if report is Report.CHECKPOINTED:
        return ReportEffect(
            lease=LeaseState.CHECKPOINTED, job=None if job.terminal else JobEffect.REQUEUE
        )
    code = exit_code if exit_code is not None else 0
    effect: JobEffect | None = None
    if not job.terminal:
        if code == 0:
            effect = JobEffect.SUCCEED
        elif revoked or stop_requested:
            effect = JobEffect.REQUEUE
        else:
            effect = JobEffect.FAIL
    return ReportEffect(lease=LeaseState.EXITED, exit_code=code, job=effect)
