"""A job's client events (epoch progress, batch-size scaling) and the state observed from them.

Training programs report through ``POST /v1/jobs/{id}/events``. Each event carries the client's
per-job sequence number ``seq``, unique per job in ``job_events``, so that retries and
reordering are harmless:

- a duplicate (same seq, same body) replays the stored event; the same seq with another body is
  a conflict;
- the job's observed state is recomputed from all of its stored client events after every new
  one, so it does not depend on arrival order and a late, older event never moves it backwards:

  - ``epochs_done``: the highest finished epoch of any progress event;
  - ``batch_size``: that of the scaling event with the highest epoch (ties: the highest seq),
    else the job's initial batch size;
  - ``attained_s``: the sum of the progress events' seconds (one per seq);
  - ``measured_epoch_seconds``: the mean seconds of the progress events at each batch size;
  - ``observed_regimes``: the regimes the job has left behind, cut where its batch size changed.

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

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from shockwave.lifecycle import JobState
from shockwave.model import JobSpec, Regime
from shockwave.snapshot import ActiveJob, JobProgress
from store import jobs
from store.errors import Conflict, InvalidInput, NotFound
from store.leases import fenced_reason
from store.paging import cut, page_key
from store.principals import Principal, Role, require
from store.tables import INT4_MAX, JobEventRow, JobRow, utcnow

CLIENT_KINDS = ("progress", "scaling")
EventKind = Literal["progress", "scaling", "state"]
REPORTERS = (Role.ADMIN, Role.USER, Role.JOB)
"""Roles that may post and read a job's events (users of its tenant, the job's own token)."""


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """A stored client event: ``payload`` is its body without ``seq`` and ``kind``."""

    seq: int
    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ObservedState:
    """What a job's client events say about it (see the module docstring)."""

    epochs_done: int
    batch_size: int
    attained_s: float
    measured_epoch_seconds: Mapping[int, float]
    observed_regimes: tuple[Regime, ...]
    last_seq: int


def observe(initial_batch_size: int, events: Iterable[ClientEvent]) -> ObservedState:
    """The observed state of a job that started at ``initial_batch_size``, from its client
    events in any order."""
    epochs_done, attained, last_seq = 0, 0.0, 0
    seconds_at: dict[int, list[float]] = defaultdict(list)
    scalings: list[tuple[int, int, int]] = []
    for event in events:
        last_seq = max(last_seq, event.seq)
        if event.kind == "progress":
            epochs_done = max(epochs_done, int(event.payload["epoch"]))
            seconds = float(event.payload["seconds"])
            attained += seconds
            seconds_at[int(event.payload["batch_size"])].append(seconds)
        elif event.kind == "scaling":
            scalings.append(
                (int(event.payload["epoch"]), event.seq, int(event.payload["batch_size"]))
            )
    regimes, batch_size = regimes_of(initial_batch_size, scalings)
    return ObservedState(
        epochs_done=epochs_done,
        batch_size=batch_size,
        attained_s=attained,
        measured_epoch_seconds={bs: sum(s) / len(s) for bs, s in sorted(seconds_at.items())},
        observed_regimes=regimes,
        last_seq=last_seq,
    )


def regimes_of(
    initial_batch_size: int, scalings: Iterable[tuple[int, int, int]]
) -> tuple[tuple[Regime, ...], int]:
    """The finished regimes and the current batch size, from scaling events given as
    ``(epoch, seq, batch_size)``: a regime ends where the batch size changes; several changes
    at one epoch count as the last of them (highest seq)."""
    regimes: list[Regime] = []
    current, start = initial_batch_size, 0
    for epoch, _seq, batch_size in sorted(scalings):
        if batch_size == current:
            continue
        if epoch > start:
            regimes.append(Regime(current, epoch - start))
            start = epoch
        elif regimes and regimes[-1].batch_size == batch_size:
            start -= regimes.pop().epochs
        current = batch_size
    return tuple(regimes), current


def client_events(session: Session, job_id: str) -> list[ClientEvent]:
    rows = session.exec(
        select(JobEventRow)
        .where(JobEventRow.job_id == job_id, col(JobEventRow.kind).in_(CLIENT_KINDS))
        .order_by(col(JobEventRow.seq))
    ).all()
    return [ClientEvent(r.seq or 0, r.kind, r.payload) for r in rows]


def observed_state(session: Session, row: JobRow) -> ObservedState:
    return observe(row.initial_batch_size, client_events(session, row.id))


def spec_of_row(row: JobRow) -> JobSpec:
    """The core's model of a stored job."""
    return jobs.spec_of(row, row.id)


def active_job(row: JobRow, state: ObservedState) -> ActiveJob:
    """The snapshot view of a job: its spec and what its events say (no future, no GPUs)."""
    return ActiveJob(
        spec=spec_of_row(row),
        progress=JobProgress(
            batch_size=state.batch_size,
            epochs_done=float(state.epochs_done),
            observed_regimes=state.observed_regimes,
            measured_epoch_seconds=state.measured_epoch_seconds,
            attained_s=state.attained_s,
        ),
    )


def record_event(
    session: Session, principal: Principal, job_id: str, event: ClientEvent
) -> tuple[int, JobEventRow]:
    """Store ``event`` for the job and update its observed state; (201, new event) or, for a
    duplicate, (200, the stored event). Raises :mod:`store.errors`: Forbidden, NotFound,
    Conflict (fenced attempt, conflicting duplicate, finished job) or InvalidInput (an epoch
    beyond the job's length)."""
    require(principal, *REPORTERS)
    row = jobs.visible_job(session, principal, job_id)
    session.refresh(row, with_for_update=True)
    _check_attempt(session, principal)
    payload = dict(event.payload)
    stored = _event_at(session, job_id, event.seq)
    if stored is not None:
        return 200, _same_or_conflict(stored, event.kind, payload)
    if JobState(row.state).terminal:
        raise Conflict(f"job {job_id} is {row.state}; it takes no more events")
    _check_epoch(row, event)
    new = JobEventRow(job_id=job_id, seq=event.seq, kind=event.kind, payload=payload)
    session.add(new)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        stored = _event_at(session, job_id, event.seq)
        if stored is None:
            raise
        return 200, _same_or_conflict(stored, event.kind, payload)
    _apply(row, observed_state(session, row))
    session.add(row)
    return 201, new


def _check_attempt(session: Session, principal: Principal) -> None:
    """409 ``Attempt fenced`` when the caller is a job token of an attempt that is fenced.
    Checked under the job's lock, which the agent reports and the round driver take first too,
    so an event is never recorded after its attempt was fenced."""
    if principal.role is not Role.JOB or principal.attempt_id is None:
        return
    reason = fenced_reason(session, principal.attempt_id)
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


def _same_or_conflict(stored: JobEventRow, kind: str, payload: dict[str, Any]) -> JobEventRow:
    if stored.kind != kind or stored.payload != payload:
        raise Conflict(
            f"event seq {stored.seq} was already recorded with a different body", field="seq"
        )
    return stored


def _check_epoch(row: JobRow, event: ClientEvent) -> None:
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


def _apply(row: JobRow, state: ObservedState) -> None:
    row.epochs_done = float(state.epochs_done)
    row.batch_size = state.batch_size
    row.attained_s = state.attained_s
    row.measured_epoch_seconds = {str(bs): s for bs, s in state.measured_epoch_seconds.items()}
    row.last_seq = state.last_seq
    row.updated_at = utcnow()


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
