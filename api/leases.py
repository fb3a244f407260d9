"""Leases as both the agent endpoints and the round driver see them.

A lease is one attempt (its id) to run a job on one node's GPUs for a round. Its states:

- live: ``ISSUED`` (the driver issued it), ``STARTED`` and ``RUNNING`` (the agent reported the
  process up). A live lease holds its GPUs; at the next boundary the driver either extends it
  (same attempt, new round and end time) or revokes it.
- ``REVOKED``: the driver took it back; the agent must stop the process (SIGTERM, grace period
  to checkpoint, SIGKILL) and report ``checkpointed`` or ``exited``.
- ``CHECKPOINTED`` / ``EXITED``: the agent reported that the process stopped.
- ``LOST``: the node stopped heartbeating; whatever it still runs must stop.

Job states follow from the leases (SPEC section 5): a job becomes RUNNING when an attempt
reports that it started; a preempted job stays RUNNING until its attempt reports that it
checkpointed (then SUSPENDED), or until a whole round has passed without that report (the
driver then suspends it); a job whose node is lost goes back to the queue: SUSPENDED when it
has a checkpoint to resume from (an earlier attempt checkpointed), else PENDING.
"""

from __future__ import annotations

from enum import StrEnum

from sqlmodel import Session, col, func, select

from api.repository import record_state
from api.tables import JobRow, LeaseRow, utcnow
from shockwave.lifecycle import JobState


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
