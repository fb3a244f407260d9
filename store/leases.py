"""Leases in the database, as both the agent endpoints and the round driver see them.

The lease state machine is the core's (:mod:`shockwave.domain.lifecycle`): its states, the sets of
them the rules below use, and the legal moves, which :func:`move_lease` enforces on every write.

An attempt that must no longer act for its job is fenced (:func:`fenced_reason`): the agent's
reports on it are answered with ``stop`` and its process's events are refused
(:mod:`store.events`), so a process that outlived its attempt cannot move its job's progress.

Job states follow from the leases: a job becomes RUNNING when an attempt
reports that it started; a preempted job stays RUNNING until its attempt reports that it
checkpointed (then SUSPENDED), or until a whole round has passed without that report (the
driver then suspends it); a job whose node is lost goes back to the queue: SUSPENDED when it
has a checkpoint to resume from (an earlier attempt checkpointed), else PENDING.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy import select as sa_select
from sqlalchemy.orm.util import identity_key
from sqlmodel import Session, SQLModel, col, func, select

from shockwave.domain.lifecycle import (
    LIVE_LEASES,
    STARTED_LEASES,
    STOPPED_LEASES,
    JobState,
    LeaseState,
    lease_transition,
)
from store.jobs import record_state
from store.tables import JobRow, LeaseRow, utcnow

LEASES = SQLModel.metadata.tables["leases"]
_JOB_LEASES = sa_select(LEASES.c.id, LEASES.c.job_id, LEASES.c.state, LEASES.c.issued_at).where(
    LEASES.c.job_id.in_(bindparam("ids", expanding=True))
)
"""The leases of the jobs ``ids``: what :class:`JobLeases` reads of them."""


def move_lease(
    session: Session,
    lease: LeaseRow,
    target: LeaseState,
    *,
    now: datetime | None = None,
    exit_code: int | None = None,
) -> None:
    """Move ``lease`` to ``target`` (:class:`~shockwave.domain.lifecycle.IllegalTransition` if the
    lease state machine forbids it), stamped ``now`` (default: the clock); an ``EXITED`` lease
    records ``exit_code``, a ``CHECKPOINTED`` one clears it."""
    lease.state = lease_transition(LeaseState(lease.state), target).value
    if target in STOPPED_LEASES:
        lease.exit_code = exit_code
    lease.updated_at = now or utcnow()
    session.add(lease)


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
    if lease is None or lease.state != LeaseState.REVOKED:
        return _fenced_unless_revoked(attempt_id, lease)
    successor = successor_of(session, lease)
    if successor is not None:
        return f"attempt {attempt_id} was revoked and attempt {successor} has taken over"
    return None


def _fenced_unless_revoked(attempt_id: str, lease: Any) -> str | None:
    """:func:`fenced_reason` of an attempt whose lease (anything with ``state`` and
    ``node_id``; None: unknown) is not REVOKED."""
    if lease is None:
        return f"attempt {attempt_id} does not exist"
    if lease.state == LeaseState.LOST:
        return f"attempt {attempt_id} was lost with node {lease.node_id}"
    if lease.state in STOPPED_LEASES:
        return f"attempt {attempt_id} has stopped ({lease.state.lower()})"
    return None


_FENCE_STATES = sa_select(col(LeaseRow.id), col(LeaseRow.state), col(LeaseRow.node_id)).where(
    col(LeaseRow.id).in_(bindparam("ids", expanding=True))
)


def fenced_reasons(session: Session, attempt_ids: Collection[str]) -> dict[str, str | None]:
    """:func:`fenced_reason` of each of ``attempt_ids``, by id: one read for all (the leases'
    states, no ORM object a lease), then, for each REVOKED one only, the look for its
    successor :func:`fenced_reason` makes. What the session changed and did not flush is not
    seen: call it before changing those leases."""
    if not attempt_ids:
        return {}
    states = {
        row.id: row
        for row in session.connection().execute(_FENCE_STATES, {"ids": sorted(attempt_ids)})
    }
    return {
        attempt: fenced_reason(session, attempt)
        if (row := states.get(attempt)) is not None and row.state == LeaseState.REVOKED
        else _fenced_unless_revoked(attempt, row)
        for attempt in attempt_ids
    }


class JobLeases:
    """The leases of some jobs, read in one statement (the jobs of a poll's reports, which the
    poll holds locked, so no other transaction moves their leases meanwhile): what
    :func:`successor_of`, :func:`stop_running` and :func:`requeue_state` read of those jobs,
    answered without a statement each. A lease the session holds counts in its state there
    (moved by the poll since the read, perhaps), so the answers follow the poll's own moves.
    """

    def __init__(self, session: Session, job_ids: Collection[str]) -> None:
        self._session = session
        self._leases: dict[str, list[tuple[str, str, datetime]]] = defaultdict(list)
        self.jobs = frozenset(job_ids)
        if not job_ids:
            return
        session.flush()  # a Core read (no ORM compilation): the session's moves written first
        rows = session.connection().execute(_JOB_LEASES, {"ids": sorted(job_ids)})
        for attempt, job_id, state, issued in rows:
            self._leases[job_id].append((attempt, state, issued))

    def _states(self, job_id: str) -> list[tuple[str, str, datetime]]:
        """(id, state now, issued at) of each of the job's leases."""
        held = self._session.identity_map
        states = []
        for attempt, state, issued in self._leases[job_id]:
            lease = held.get(identity_key(LeaseRow, attempt))
            states.append((attempt, state if lease is None else lease.state, issued))
        return states

    def successor(self, lease: LeaseRow) -> str | None:
        """As :func:`successor_of`."""
        return next(
            (
                attempt
                for attempt, state, issued in self._states(lease.job_id)
                if issued > lease.issued_at and state in STARTED_LEASES
            ),
            None,
        )

    def other_live(self, job_id: str, except_attempt: str | None) -> bool:
        """As :func:`has_other_live_lease`."""
        return any(
            state in LIVE_LEASES and attempt != except_attempt
            for attempt, state, _ in self._states(job_id)
        )

    def requeue_state(self, job_id: str) -> JobState:
        """As :func:`requeue_state`."""
        checkpointed = any(s == LeaseState.CHECKPOINTED for _, s, _ in self._states(job_id))
        return JobState.SUSPENDED if checkpointed else JobState.PENDING


def successor_of(session: Session, lease: LeaseRow, known: JobLeases | None = None) -> str | None:
    """A newer attempt of ``lease``'s job that has started (it owns the job now), or None.
    ``known``: the job's leases, read already."""
    if known is not None and lease.job_id in known.jobs:
        return known.successor(lease)
    return session.exec(
        select(LeaseRow.id).where(
            LeaseRow.job_id == lease.job_id,
            col(LeaseRow.issued_at) > lease.issued_at,
            col(LeaseRow.state).in_(STARTED_LEASES),
        )
    ).first()


def checkpoint_dir(job_id: str) -> str:
    """Where every attempt of ``job_id`` keeps its checkpoints, relative to the agent's work
    directory (shared storage when a job may move between nodes)."""
    return f"checkpoints/{job_id}"


def has_other_live_lease(session: Session, job_id: str, except_attempt: str | None) -> bool:
    query = (
        select(func.count())
        .select_from(LeaseRow)
        .where(LeaseRow.job_id == job_id, col(LeaseRow.state).in_(LIVE_LEASES))
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
        .where(LeaseRow.job_id == job_id, LeaseRow.state == LeaseState.CHECKPOINTED)
    ).one()
    return JobState.SUSPENDED if int(checkpointed) > 0 else JobState.PENDING


def stop_running(
    session: Session,
    job: JobRow,
    reason: str,
    *,
    except_attempt: str | None,
    known: JobLeases | None = None,
    events: list[dict[str, Any]] | None = None,
) -> bool:
    """Move a RUNNING ``job`` that no longer runs anywhere (no live lease but
    ``except_attempt``) back to the queue (:func:`requeue_state`). Returns whether it moved.
    ``known``: the job's leases, read already. ``events``: where its state event goes
    (:func:`store.jobs.record_state`)."""
    if job.state != JobState.RUNNING.value:
        return False
    if known is not None and job.id in known.jobs:
        if known.other_live(job.id, except_attempt):
            return False
        record_state(session, job, known.requeue_state(job.id), reason, events=events)
        return True
    if has_other_live_lease(session, job.id, except_attempt):
        return False
    record_state(session, job, requeue_state(session, job.id), reason, events=events)
    return True


def revoke_live_leases(session: Session, job_id: str, *, except_attempt: str | None) -> int:
    """Revoke every live lease of ``job_id`` but ``except_attempt`` (a finished job's other
    attempts must stop). Returns how many were revoked."""
    query = select(LeaseRow).where(LeaseRow.job_id == job_id, col(LeaseRow.state).in_(LIVE_LEASES))
    revoked = 0
    for lease in session.exec(query.with_for_update()).all():
        if lease.id == except_attempt:
            continue
        move_lease(session, lease, LeaseState.REVOKED)
        revoked += 1
    return revoked
