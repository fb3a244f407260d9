"""Leases as both the agent endpoints and the round driver see them.

A lease is one attempt (its id) to run a job on one node's GPUs for a round. Its states:

- live: ``ISSUED`` (the driver issued it), ``STARTED`` and ``RUNNING`` (the agent reported the
  process up). A live lease holds its GPUs; at the next boundary the driver either extends it
  (same attempt, new round and end time) or revokes it.
- ``REVOKED``: the driver took it back; the agent must stop the process (SIGTERM, grace period
  to checkpoint, SIGKILL) and report ``checkpointed`` or ``exited``.
- ``CHECKPOINTED`` / ``EXITED``: the agent reported that the process stopped.
- ``LOST``: the node stopped heartbeating; whatever it still runs must stop.

An attempt that must no longer act for its job is fenced (:func:`fenced_reason`): the agent's
reports on it are answered with ``stop`` and its process's events are refused
(:mod:`store.events`), so a process that outlived its attempt cannot move its job's progress.

Job states follow from the leases (SPEC section 5): a job becomes RUNNING when an attempt
reports that it started; a preempted job stays RUNNING until its attempt reports that it
checkpointed (then SUSPENDED), or until a whole round has passed without that report (the
driver then suspends it); a job whose node is lost goes back to the queue: SUSPENDED when it
has a checkpoint to resume from (an earlier attempt checkpointed), else PENDING.
"""

from __future__ import annotations

from enum import StrEnum

from sqlmodel import Session, col, func, select

from shockwave.lifecycle import JobState
from store.jobs import record_state
from store.tables import JobRow, LeaseRow, utcnow


class LeaseState(StrEnum):
    ISSUED = "ISSUED"
    STARTED = "STARTED"
    RUNNING = "RUNNING"
    CHECKPOINTED = "CHECKPOINTED"
    EXITED = "EXITED"
    REVOKED = "REVOKED"
    LOST = "LOST"


LIVE = (LeaseState.ISSUED.value, LeaseState.STARTED.value, LeaseState.RUNNING.value)
"""States in which a lease holds its GPUs."""

STOPPED = (LeaseState.CHECKPOINTED.value, LeaseState.EXITED.value)
"""States in which the agent confirmed that the attempt's process is gone."""

STARTED_ONCE = (
    LeaseState.STARTED.value,
    LeaseState.RUNNING.value,
    LeaseState.CHECKPOINTED.value,
    LeaseState.EXITED.value,
)
"""States of an attempt whose process was reported up (and may have stopped since)."""


def fenced_reason(session: Session, attempt_id: str) -> str | None:
    """Why attempt ``attempt_id`` may no longer speak for its job (its process's events are
    refused), None while it may.

    An attempt is fenced once it is ``LOST`` (its node went silent: the job went back to the
    queue and may already run elsewhere), once its process was confirmed gone (``CHECKPOINTED``,
    ``EXITED``: whoever still uses its token is not that process), and once it is ``REVOKED``
    and a newer attempt of its job has started (the newer one resumed from the checkpoint as it
    was then and owns the job's progress; what the old one did since is lost work, and counting
    it would count it twice). A revoked attempt with no started successor is in its grace
    period: it may still report what it did before it stops. An unknown attempt is fenced.
    """
    lease = session.get(LeaseRow, attempt_id)
    if lease is None:
        return f"attempt {attempt_id} does not exist"
    if lease.state == LeaseState.LOST.value:
        return f"attempt {attempt_id} was lost with node {lease.node_id}"
    if lease.state in STOPPED:
        return f"attempt {attempt_id} has stopped ({lease.state.lower()})"
    if lease.state == LeaseState.REVOKED.value:
        successor = session.exec(
            select(LeaseRow.id).where(
                LeaseRow.job_id == lease.job_id,
                col(LeaseRow.issued_at) > lease.issued_at,
                col(LeaseRow.state).in_(STARTED_ONCE),
            )
        ).first()
        if successor is not None:
            return f"attempt {attempt_id} was revoked and attempt {successor} has taken over"
    return None


def checkpoint_dir(job_id: str) -> str:
    """Where every attempt of ``job_id`` keeps its checkpoints, relative to the agent's work
    directory (shared storage when a job may move between nodes)."""
    return f"checkpoints/{job_id}"


def has_other_live_lease(session: Session, job_id: str, except_attempt: str | None) -> bool:
    query = (
        select(func.count())
        .select_from(LeaseRow)
        .where(LeaseRow.job_id == job_id, col(LeaseRow.state).in_(LIVE))
    )
    if except_attempt is not None:
        query = query.where(LeaseRow.id != except_attempt)
    return int(session.exec(query).one()) > 0


def requeue_state(session: Session, job_id: str) -> JobState:
    """Where a job that stopped running goes back to: SUSPENDED if one of its attempts
    checkpointed (it resumes from there), else PENDING (it starts over)."""
    checkpointed = session.exec(
        select(func.count())
        .select_from(LeaseRow)
        .where(LeaseRow.job_id == job_id, LeaseRow.state == LeaseState.CHECKPOINTED.value)
    ).one()
    return JobState.SUSPENDED if int(checkpointed) > 0 else JobState.PENDING


def stop_running(session: Session, job: JobRow, reason: str, *, except_attempt: str | None) -> bool:
    """Move a RUNNING ``job`` that no longer runs anywhere (no live lease but
    ``except_attempt``) back to the queue (:func:`requeue_state`). Returns whether it moved."""
    if job.state != JobState.RUNNING.value:
        return False
    if has_other_live_lease(session, job.id, except_attempt):
        return False
    record_state(session, job, requeue_state(session, job.id), reason)
    return True


def revoke_live_leases(session: Session, job_id: str, *, except_attempt: str | None) -> int:
    """Revoke every live lease of ``job_id`` but ``except_attempt`` (a finished job's other
    attempts must stop). Returns how many were revoked."""
    query = select(LeaseRow).where(LeaseRow.job_id == job_id, col(LeaseRow.state).in_(LIVE))
    revoked = 0
    for lease in session.exec(query.with_for_update()).all():
        if lease.id == except_attempt:
            continue
        lease.state = LeaseState.REVOKED.value
        lease.updated_at = utcnow()
        session.add(lease)
        revoked += 1
    return revoked
