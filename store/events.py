"""A job's client events (epoch progress, batch-size scaling), stored, and the state they fold into.

Training programs report through ``POST /v1/jobs/{id}/events``. Each event carries the client's
per-job sequence number ``seq``, unique per job in ``job_events``, so that retries and
reordering are harmless:

- a duplicate (same seq, same body) replays the stored event; the same seq with another body is
  a conflict;
- a new event is folded into the job's observed state, stored on its row, with the core's one
  rule (:func:`shockwave.domain.observed.fold`: constant work per event, the same state whatever
  order the events arrive in); the planner's snapshot reads that state back
  (:func:`observed_of`), never the events.

A job token handed to one attempt (:func:`api.agent.job_token`) speaks for that attempt only:
once the attempt is fenced (:func:`store.leases.fenced_reason`: lost with its node, stopped, or
revoked with a newer attempt under way) its events are refused with a 409 ``Attempt fenced``
problem (``fenced: true``, ``stop: true``), so a process that outlived its attempt (an orphan
of a dead agent) can neither move the job's progress nor take a seq from the attempt that
owns the job now; the SDK stops the process on that answer.

Writes happen in the caller's transaction; the job row is locked first (``FOR UPDATE`` on
Postgres; SQLite has one writer at a time) so concurrent posts to one job serialize, and the
unique (job_id, seq) constraint settles concurrent duplicates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import JobState
from shockwave.domain.model import JobSpec
from shockwave.domain.observed import ClientEvent, Observed, fold
from shockwave.domain.snapshot import ActiveJob
from store import jobs
from store.errors import Conflict, InvalidInput, NotFound
from store.leases import fenced_reason
from store.paging import cut, page_key
from store.principals import Principal, Role, require
from store.tables import INT4_MAX, JobEventRow, JobRow, utcnow

EventKind = Literal["progress", "scaling", "state", "excluded", "preemption"]
REPORTERS = (Role.ADMIN, Role.USER, Role.JOB)
"""Roles that may post and read a job's events (users of its tenant, the job's own token)."""


def observed_of(row: JobRow | jobs.PolledJob) -> Observed:
    """The job's observed state as its row stores it (see :mod:`store.tables`)."""
    return Observed(
        initial_batch_size=row.initial_batch_size,
        epochs_done=int(row.epochs_done),
        attained_s=row.attained_s,
        epoch_seconds={int(bs): (float(s), int(n)) for bs, (s, n) in row.epoch_seconds.items()},
        scalings=tuple((int(e), int(seq), int(bs)) for e, seq, bs in row.scalings),
        last_seq=row.last_seq,
    )


def spec_of_row(row: JobRow) -> JobSpec:
    """The core's model of a stored job; it arrived when it was submitted (seconds since the
    Unix epoch)."""
    return dataclasses.replace(jobs.spec_of(row, row.id), arrival_s=row.created_at.timestamp())


def active_job(row: JobRow, gpus: tuple[int, ...] = ()) -> ActiveJob:
    """The snapshot view of a job: its spec and what its events say (no future), on ``gpus``."""
    return ActiveJob(spec=spec_of_row(row), progress=observed_of(row).progress(gpus))


def record_event(
    session: Session, principal: Principal, job_id: str, event: ClientEvent
) -> tuple[int, JobEventRow]:
    """Store ``event`` for the job and update its observed state; (201, new event) or, for a
    duplicate, (200, the stored event). Raises :mod:`store.errors`: Forbidden, NotFound,
    Conflict (fenced attempt, conflicting duplicate, finished job) or InvalidInput (an epoch
    beyond the job's length)."""
    require(principal, *REPORTERS)
    row = jobs.locked_job(session, principal, job_id)
    _check_attempt(session, principal)
    payload = dict(event.payload)
    # every event stored for the job was folded into its row in the same transaction, so an
    # event past the row's last seq is new: only one at or below it may be a duplicate
    stored = _event_at(session, job_id, event.seq) if event.seq <= (row.last_seq or 0) else None
    if stored is not None:
        _same_or_conflict(stored.seq, (stored.kind, stored.payload), (event.kind, payload))
        return 200, stored
    _check_new(row, event)
    new = JobEventRow(**_event_row(job_id, event, payload))
    session.add(new)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        stored = _event_at(session, job_id, event.seq)
        if stored is None:
            raise
        _same_or_conflict(stored.seq, (stored.kind, stored.payload), (event.kind, payload))
        return 200, stored
    _apply(row, fold(observed_of(row), event))
    session.add(row)
    return 201, new


def record_held_event(
    session: Session,
    principal: Principal,
    row: jobs.PolledJob,
    event: ClientEvent,
    pending: list[dict[str, Any]],
    fenced: str | None,
) -> int:
    """:func:`record_event` for a caller that records several events at once (the agent's
    poll) and holds the job's ``row`` (:data:`store.jobs.POLLED_COLUMNS`), read by the
    statement that locked it in this transaction, and the reason the speaking attempt is
    ``fenced`` (:func:`store.leases.fenced_reasons`, read under that lock too): the event is
    folded into the row in memory and its new row appended to ``pending`` (its columns but
    the id); neither is written here.
    The caller writes its rows that took a new event (:func:`store.jobs.write_folded`), then
    inserts the pending events (:func:`store.jobs.insert_events`), one statement each for
    all: a poll's events cost one read (the lock's), one
    ``UPDATE`` and one ``INSERT``, not a read and two writes each. 201 for a new event, 200
    for a duplicate of one stored or pending. Under the job's lock, with every stored event
    folded into its row, an event past the row's last seq cannot collide with a stored one."""
    require(principal, *REPORTERS)
    if principal.job_id not in (None, row.id):
        raise NotFound(f"no job {row.id}")
    if principal.role is Role.JOB and principal.attempt_id is not None:
        _refuse_fenced(principal, fenced)
    payload = dict(event.payload)
    key = (row.id, event.seq)
    if event.seq <= (row.last_seq or 0):
        same = [(p["kind"], p["payload"]) for p in pending if (p["job_id"], p["seq"]) == key]
        if same:
            _same_or_conflict(event.seq, same[0], (event.kind, payload))
            return 200
        stored = _event_at(session, row.id, event.seq)
        if stored is not None:
            _same_or_conflict(stored.seq, (stored.kind, stored.payload), (event.kind, payload))
            return 200
    _check_new(row, event)
    pending.append(_event_row(row.id, event, payload))
    _apply(row, fold(observed_of(row), event))
    return 201


def _event_row(job_id: str, event: ClientEvent, payload: dict[str, Any]) -> dict[str, Any]:
    """The ``job_events`` row (its columns but the id) of a client's new ``event``."""
    return {
        "job_id": job_id,
        "seq": event.seq,
        "kind": event.kind,
        "payload": payload,
        "reason": "",
        "created_at": utcnow(),
    }


def _check_new(row: JobRow | jobs.PolledJob, event: ClientEvent) -> None:
    """Whether the job in ``row`` takes ``event`` as a new one: Conflict for a finished job,
    InvalidInput for an epoch beyond it or a state grown past its bounds."""
    if JobState(row.state).terminal:
        raise Conflict(f"job {row.id} is {row.state}; it takes no more events")
    _check_epoch(row, event)
    _check_room(row, event)


def _check_attempt(session: Session, principal: Principal) -> None:
    """409 ``Attempt fenced`` when the caller is a job token of an attempt that is fenced.
    Checked under the job's lock, which the agent reports and the round driver take first too,
    so an event is never recorded after its attempt was fenced."""
    if principal.role is not Role.JOB or principal.attempt_id is None:
        return
    _refuse_fenced(principal, fenced_reason(session, principal.attempt_id))


def _refuse_fenced(principal: Principal, reason: str | None) -> None:
    """409 ``Attempt fenced`` for ``reason`` (None: the attempt is not fenced)."""
    if reason is not None:
        raise Conflict(
            f"{reason}: its events are refused; stop the process without checkpointing",
            title="Attempt fenced",
            fenced=True,
            stop=True,
            attempt_id=principal.attempt_id,
        )


def _event_at(session: Session, job_id: str, seq: int) -> JobEventRow | None:
    return session.exec(
        select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.seq == seq)
    ).first()


def _same_or_conflict(
    seq: int | None, stored: tuple[str, dict[str, Any]], sent: tuple[str, dict[str, Any]]
) -> None:
    """A conflict unless event ``seq`` was ``stored`` with what was ``sent`` again (kind,
    payload)."""
    if stored != sent:
        raise Conflict(f"event seq {seq} was already recorded with a different body", field="seq")


MAX_SCALINGS = 1024
"""Scaling events a job may post: its stored state (and every snapshot) holds them all."""
MAX_MEASURED_BATCH_SIZES = 64
"""Distinct batch sizes a job's progress events may measure (as many as a job may declare)."""


def _check_room(row: JobRow | jobs.PolledJob, event: ClientEvent) -> None:
    """Keep a job's folded state bounded: 422 for a scaling event past :data:`MAX_SCALINGS`, or
    a progress event at a new batch size past :data:`MAX_MEASURED_BATCH_SIZES`."""
    if event.kind == "scaling" and len(row.scalings) >= MAX_SCALINGS:
        raise InvalidInput(
            f"scaling.seq: a job takes at most {MAX_SCALINGS} scaling events",
            title="Invalid event",
            field="scaling.seq",
        )
    measured = row.epoch_seconds
    new_size = str(event.payload.get("batch_size")) not in measured
    if event.kind == "progress" and new_size and len(measured) >= MAX_MEASURED_BATCH_SIZES:
        raise InvalidInput(
            f"progress.batch_size: a job is measured at most at {MAX_MEASURED_BATCH_SIZES} "
            "batch sizes",
            title="Invalid event",
            field="progress.batch_size",
        )


def _check_epoch(row: JobRow | jobs.PolledJob, event: ClientEvent) -> None:
    epoch = int(event.payload["epoch"])
    if event.kind == "progress" and epoch > row.epochs:
        raise InvalidInput(
            f"epoch {epoch} is beyond the job's {row.epochs} epochs",
            title="Invalid event",
            field=f"{event.kind}.epoch",
        )
    if event.kind == "scaling" and epoch >= row.epochs:
        raise InvalidInput(
            f"a batch size change must start before the job's last epoch ({row.epochs})",
            title="Invalid event",
            field=f"{event.kind}.epoch",
        )


def _apply(row: JobRow | jobs.PolledJob, state: Observed) -> None:
    """Store ``state`` on the job's row (its derived means too, which the API shows). A
    reported epoch clears the training carried since the last one; any other event banks the
    running job's time since its row last changed (:func:`store.jobs.bank_training`), as the
    row's new ``updated_at`` restarts that count."""
    now = utcnow()
    if state.epochs_done > row.epochs_done:
        row.carried_s = 0.0
    else:
        jobs.bank_training(row, now)
    row.epochs_done = float(state.epochs_done)
    row.batch_size = state.batch_size
    row.attained_s = state.attained_s
    row.epoch_seconds = {str(bs): [s, n] for bs, (s, n) in sorted(state.epoch_seconds.items())}
    row.scalings = [list(scaling) for scaling in state.scalings]
    row.measured_epoch_seconds = {str(bs): s for bs, s in state.measured_epoch_seconds.items()}
    row.last_seq = state.last_seq
    row.updated_at = now


def visible_event(
    session: Session, principal: Principal, job_id: str, event_id: int
) -> JobEventRow:
    require(principal, *REPORTERS)
    jobs.visible_job(session, principal, job_id)
    row = session.get(JobEventRow, event_id)
    if row is None or row.job_id != job_id:
        raise NotFound(f"no event {event_id} of job {job_id}")
    return row


def list_events(
    session: Session,
    principal: Principal,
    job_id: str,
    *,
    page_size: int,
    page_token: str | None,
    kind: EventKind | None,
) -> tuple[list[JobEventRow], str | None]:
    """One page of the job's events (client and state changes) in the order they were stored."""
    require(principal, *REPORTERS)
    jobs.visible_job(session, principal, job_id)
    query = select(JobEventRow).where(JobEventRow.job_id == job_id)
    if kind is not None:
        query = query.where(JobEventRow.kind == kind)
    if page_token:
        query = query.where(col(JobEventRow.id) > _after(page_token))
    query = query.order_by(col(JobEventRow.id)).limit(page_size + 1)
    return cut(session.exec(query).all(), page_size, lambda row: str(row.id or 0), "event")


def _after(token: str) -> int:
    """The event id a page token carries (at most the id column's largest value)."""
    key = page_key("event", token)
    if not key.isdigit() or int(key) > INT4_MAX:
        raise InvalidInput("malformed page_token", field="page_token")
    return int(key)


def record_exclusions(session: Session, excluded: Mapping[str, str]) -> int:
    """Tell each job the planner left out why (an ``excluded`` event with the reason), once per
    distinct reason: every plan that leaves it out again adds nothing. Returns how many events
    were added. Jobs that no longer exist are skipped."""
    added = 0
    for job_id, reason in excluded.items():
        said = session.exec(
            select(JobEventRow.id).where(
                JobEventRow.job_id == job_id,
                JobEventRow.kind == "excluded",
                JobEventRow.reason == reason[:256],
            )
        ).first()
        if said is None and session.get(JobRow, job_id) is not None:
            session.add(
                JobEventRow(job_id=job_id, kind="excluded", payload={}, reason=reason[:256])
            )
            added += 1
    return added
