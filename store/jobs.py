"""Jobs in the database: submit, see, list, cancel, move through the state machine, and the
idempotency record that makes a retried request apply once.

Every write that a request makes happens in the caller's one transaction, so a request either
applies fully or not at all. Refusals are :mod:`store.errors` (the API maps them to problems).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import Connection, and_, bindparam, or_, text, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import load_only
from sqlmodel import Session, SQLModel, col, select

from shockwave.domain.lifecycle import JobState, transition
from shockwave.domain.model import AdaptationMode, ElasticRange, JobSpec, ThroughputProfile
from store import tenants
from store.errors import Conflict, Forbidden, InvalidInput, NotFound
from store.paging import MALFORMED, cut, page_key
from store.principals import Principal, Role
from store.tables import IdempotencyRow, JobEventRow, JobRow, utcnow

Response = tuple[int, dict[str, Any], str | None]


class SpecFields(Protocol):
    """What a job's spec is made of: a submission and a stored job both carry these."""

    @property
    def gpus(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def samples_per_epoch(self) -> int: ...
    @property
    def initial_batch_size(self) -> int: ...
    @property
    def mode(self) -> str: ...
    @property
    def batch_sizes(self) -> Sequence[int]: ...
    @property
    def throughput(self) -> dict[Any, float]: ...
    @property
    def budget(self) -> float | None: ...
    @property
    def model(self) -> str: ...
    @property
    def elastic(self) -> Any: ...


class Submission(SpecFields, Protocol):
    """A job as submitted: its spec, a name, an optional tenant (admins only) and what an
    agent runs for it (``command`` argv, in container ``image`` where Docker runs)."""

    @property
    def name(self) -> str: ...
    @property
    def tenant(self) -> str | None: ...
    @property
    def command(self) -> Sequence[str]: ...
    @property
    def image(self) -> str | None: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def priority(self) -> str | None: ...


def spec_of(source: SpecFields, job_id: str = "new", tenant: str | None = None) -> JobSpec:
    """The core's model of a submission or a stored job (the two carry the same fields; a
    stored job's throughput keys are strings). Raises ValidationError naming the field at
    fault, which only a submission can trigger: a stored job passed the same check.
    ``tenant``: the job's tenant where ``source`` does not say it (a submission's is resolved
    from its caller)."""
    return JobSpec(
        job_id=job_id,
        gpus=source.gpus,
        epochs=source.epochs,
        samples_per_epoch=source.samples_per_epoch,
        initial_batch_size=source.initial_batch_size,
        mode=AdaptationMode.parse(source.mode),
        batch_sizes=tuple(source.batch_sizes),
        throughput=ThroughputProfile({int(bs): float(v) for bs, v in source.throughput.items()}),
        budget=_stored_budget(source.budget),
        model=source.model,
        type_throughput={
            str(t).lower(): ThroughputProfile({int(bs): float(v) for bs, v in rates.items()})
            for t, rates in getattr(source, "type_throughput", {}).items()
        },
        elastic=elastic_of(source.elastic),
        tenant=tenant if tenant is not None else str(getattr(source, "tenant", None) or ""),
        priority=getattr(source, "priority", None),
    )


def _stored_budget(budget: float | None) -> float:
    return 1.0 if budget is None else budget


def elastic_of(value: Any) -> ElasticRange | None:
    """The core's range from a submission's ``elastic`` object or its stored JSON (None: a
    rigid job). Speed-up keys are strings in JSON; ValidationError names a bad field."""
    if value is None:
        return None
    data = value.model_dump() if hasattr(value, "model_dump") else dict(value)
    speedup = {
        int(gpus): {int(bs): float(f) for bs, f in rates.items()}
        for gpus, rates in (data.get("speedup") or {}).items()
    }
    return ElasticRange(int(data["min_gpus"]), int(data["max_gpus"]), speedup)


def elastic_json(spec: JobSpec) -> dict[str, Any] | None:
    """What ``jobs.elastic`` stores for ``spec`` (None for a rigid job)."""
    if spec.elastic is None:
        return None
    return {
        "min_gpus": spec.elastic.min_gpus,
        "max_gpus": spec.elastic.max_gpus,
        "speedup": {
            str(g): {str(bs): f for bs, f in rates.items()}
            for g, rates in spec.elastic.speedup.items()
        },
    }


def trained_since_change(row: JobRow | PolledJob, now: datetime) -> float:
    """Seconds a RUNNING job has trained since its row last changed (its last event, or its
    start); 0 for a job in any other state."""
    if row.state != JobState.RUNNING.value:
        return 0.0
    return max(0.0, (now - row.updated_at).total_seconds())


def bank_training(row: JobRow | PolledJob, now: datetime, *, kept: bool = True) -> None:
    """Before ``row`` changes at ``now``: bank the seconds a RUNNING job has trained since its
    row last changed (its last event, or its start) into ``carried_s``, the training since its
    last reported epoch that the planner's snapshot credits it with
    (:meth:`shockwave.domain.snapshot.ActiveJob.trained_for`). ``kept=False``: what it trained since
    that report is lost (it goes back to the queue with no checkpoint and starts over), so
    nothing is carried. A reported epoch clears the carry (``store.events``)."""
    if kept:
        row.carried_s += trained_since_change(row, now)
    else:
        row.carried_s = 0.0


JOBS = SQLModel.metadata.tables["jobs"]


@dataclass(slots=True)
class PolledJob:
    """A job's row as a poll folds its jobs' events into it (:data:`POLLED_COLUMNS`, read with
    Core by the statement that locks the job), without an ORM object: the
    poll writes back what its events changed (:data:`FOLDED_COLUMNS`) for all its jobs in one
    statement (:data:`WRITE_FOLDED`)."""

    id: str
    state: str
    epochs: int
    initial_batch_size: int
    epochs_done: float
    batch_size: int
    attained_s: float
    carried_s: float
    epoch_seconds: dict[str, list[float]]
    scalings: list[list[int]]
    last_seq: int
    created_at: datetime
    updated_at: datetime
    measured_epoch_seconds: dict[str, float] = field(default_factory=dict)
    """Written (whole, from the folded state), never read."""


POLLED_COLUMNS = tuple(f.name for f in fields(PolledJob) if f.name != "measured_epoch_seconds")
"""What an agent's poll reads of its jobs' rows (their events folded in, their attempts'
reports applied; :class:`PolledJob`'s fields but the one it only writes): not the launch
fields, the spec's profiles, nor what the API shows only, whose JSON a poll of 8 jobs decoded
about 60 times for nothing. A row read with these only (:data:`POLLED`) loads the rest on
first use (:func:`load_rest`)."""
POLLED = load_only(*(getattr(JobRow, name) for name in POLLED_COLUMNS))
"""The loader option that reads :data:`POLLED_COLUMNS` of a job's row (built once: building
it took as long as the read)."""


FOLDED_COLUMNS = (
    "epochs_done",
    "batch_size",
    "attained_s",
    "carried_s",
    "epoch_seconds",
    "scalings",
    "measured_epoch_seconds",
    "last_seq",
    "updated_at",
)
"""What folding an event changes on a job's row (:func:`store.events.record_held_event`)."""
WRITE_FOLDED = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("b_id"))
    .values({name: bindparam(f"b_{name}", type_=JOBS.c[name].type) for name in FOLDED_COLUMNS})
)
"""The :data:`FOLDED_COLUMNS` of job ``b_id``, each from its ``b_`` parameter."""


_FOLDED_TYPES = {
    "epochs_done": "float8",
    "batch_size": "int4",
    "attained_s": "float8",
    "carried_s": "float8",
    "epoch_seconds": "json",
    "scalings": "json",
    "measured_epoch_seconds": "json",
    "last_seq": "int4",
    "updated_at": "timestamptz",
}
"""The Postgres type of each of :data:`FOLDED_COLUMNS`."""
assert tuple(_FOLDED_TYPES) == FOLDED_COLUMNS
_WRITE_FOLDED_JSON = text(
    "UPDATE jobs SET "
    + ", ".join(f"{name} = v.{name}" for name in FOLDED_COLUMNS)
    + " FROM json_to_recordset(CAST(:rows AS json)) AS v(id varchar, "
    + ", ".join(f"{name} {kind}" for name, kind in _FOLDED_TYPES.items())
    + ") WHERE jobs.id = v.id"
)
""":data:`WRITE_FOLDED` for any number of jobs in one execution of one parameter (Postgres:
the rows as one JSON array), not an execution a job in a pipeline, nor an array parameter a
column, whose elements the driver encodes one by one (each of those took twice the CPU at 8
jobs)."""


def write_folded(session: Session, rows: Sequence[PolledJob]) -> None:
    """Write the :data:`FOLDED_COLUMNS` of ``rows`` in one statement (none for no rows)."""
    if not rows:
        return
    connection = session.connection()
    if connection.dialect.name == "postgresql" and all(map(_finite, rows)):
        connection.execute(_WRITE_FOLDED_JSON, {"rows": json.dumps(list(map(_folded, rows)))})
        return
    connection.execute(
        WRITE_FOLDED,
        [
            {"b_id": row.id, **{f"b_{name}": getattr(row, name) for name in FOLDED_COLUMNS}}
            for row in rows
        ],
    )


def _folded(row: PolledJob) -> dict[str, Any]:
    """The id and :data:`FOLDED_COLUMNS` of ``row`` as JSON values (a time as RFC 3339)."""
    return {
        "id": row.id,
        **{name: getattr(row, name) for name in FOLDED_COLUMNS if name != "updated_at"},
        "updated_at": row.updated_at.isoformat(),
    }


def _finite(row: PolledJob) -> bool:
    """Whether ``row``'s float columns are numbers JSON can carry (no NaN, no infinity)."""
    return all(math.isfinite(v) for v in (row.epochs_done, row.attained_s, row.carried_s))


_INSERT_EVENTS_JSON = text(
    "INSERT INTO job_events (job_id, seq, kind, payload, reason, created_at) "
    "SELECT e.row->>'job_id', CAST(e.row->>'seq' AS int4), e.row->>'kind', e.row->'payload', "
    "e.row->>'reason', CAST(e.row->>'created_at' AS timestamptz) "
    "FROM json_array_elements(CAST(:rows AS json)) WITH ORDINALITY AS e(row, n) ORDER BY e.n"
)
"""Any number of ``job_events`` rows in one execution of one parameter (Postgres: the rows as
one JSON array), inserted in their order."""
JOB_EVENTS = SQLModel.metadata.tables["job_events"]


def insert_events(connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (``job_events`` columns but the id; ``seq`` may be left out: a state
    event has none) in one statement, their ids in their order (none for no rows). On
    Postgres one execution of one parameter, not one execution a row in a pipeline."""
    if not rows:
        return
    if connection.dialect.name != "postgresql":
        connection.execute(JOB_EVENTS.insert(), [{"seq": None, **row} for row in rows])
        return
    rows_json = [
        {
            "job_id": row["job_id"],
            "seq": row.get("seq"),
            "kind": row["kind"],
            "payload": row["payload"],
            "reason": row.get("reason", ""),
            "created_at": row["created_at"].isoformat(),
        }
        for row in rows
    ]
    connection.execute(_INSERT_EVENTS_JSON, {"rows": json.dumps(rows_json)})


def load_rest(session: Session, row: JobRow) -> None:
    """Read the columns of ``row`` not loaded yet (:data:`POLLED`) in one statement, before a
    use that reads most of them (each would otherwise be a statement of its own); what the
    session changed on the row stays as it is."""
    unloaded = sa_inspect(row).unloaded
    if unloaded:
        session.refresh(row, attribute_names=sorted(unloaded))


def record_state(
    session: Session,
    row: JobRow,
    target: JobState,
    reason: str,
    *,
    events: list[dict[str, Any]] | None = None,
) -> None:
    """Move ``row`` through the state machine and record the change as an event. A job that
    stops running banks what it trained since its last report (:func:`bank_training`): kept
    when it is SUSPENDED (an attempt checkpointed), lost when it goes back PENDING.

    ``events``: the event's row is appended there (:func:`state_event`) for the caller to
    insert with its others in one statement, after its next flush, instead of added to the
    session as an ORM object (an agent's poll moves up to a node's jobs at once)."""
    current = JobState(row.state)
    transition(current, target)
    now = utcnow()
    bank_training(row, now, kept=target is not JobState.PENDING)
    row.state = target.value
    row.updated_at = now
    session.add(row)
    event = state_event(row.id, current, target, reason, now)
    if events is None:
        session.add(JobEventRow(**event))
    else:
        events.append(event)


def state_event(
    job_id: str, current: JobState | str, target: JobState | str, reason: str, now: datetime
) -> dict[str, Any]:
    """The ``job_events`` row (its columns but the id) that records job ``job_id`` moving from
    ``current`` to ``target`` at ``now``, for ``reason`` (cut to the column's 256 characters)."""
    return {
        "job_id": job_id,
        "kind": "state",
        "payload": {"from": JobState(current).value, "to": JobState(target).value},
        "reason": reason[:256],
        "created_at": now,
    }


def create_job(
    session: Session,
    principal: Principal,
    data: Submission,
    priority_classes: Mapping[str, float] | None = None,
) -> JobRow:
    """Store a new PENDING job (and its ``submitted`` event) for ``principal``'s tenant (an
    admin's: ``data.tenant``, default ``default``). ValidationError (core) for a spec that
    cannot run; :class:`Forbidden` for a role that does not submit, or a user naming another
    tenant; :class:`InvalidInput` for a ``budget`` from anyone but an admin (it is the job's
    weight in the market: a user who set it would take GPUs from every other job) or a
    ``priority`` not among ``priority_classes`` (class -> weight); :class:`TenantAtLimit` when
    the tenant has ``max_jobs`` jobs queued and running already.

    The job's weight inside its tenant's share is its ``budget`` (an admin's, else 1) times
    its priority class's multiplier, which the planner applies (:mod:`shockwave.domain.tenancy`)."""
    if principal.role not in (Role.ADMIN, Role.USER):
        raise Forbidden("only users and admins submit jobs")
    if principal.role is Role.USER:
        if data.tenant is not None and data.tenant != principal.tenant:
            raise Forbidden("a user submits jobs only to its own tenant", field="tenant")
        if data.budget is not None:
            raise InvalidInput(
                "budget is set by admins only: name a priority class instead",
                title="Budget not allowed",
                field="budget",
            )
        tenant = principal.tenant or ""
    else:
        tenant = data.tenant or "default"
    _check_priority(data.priority, priority_classes or {})
    spec = spec_of(data, tenant=tenant)
    tenants.admit_job(session, tenant)
    row = JobRow(
        id=str(uuid.uuid4()),
        tenant=tenant,
        name=data.name,
        state=JobState.PENDING.value,
        gpus=spec.gpus,
        epochs=spec.epochs,
        samples_per_epoch=spec.samples_per_epoch,
        initial_batch_size=spec.initial_batch_size,
        mode=spec.mode.value,
        batch_sizes=list(spec.batch_sizes),
        throughput={str(k): float(v) for k, v in spec.throughput.samples_per_second.items()},
        budget=spec.budget,
        model=spec.model,
        type_throughput={
            t: {str(k): float(v) for k, v in p.samples_per_second.items()}
            for t, p in spec.type_throughput.items()
        },
        batch_size=spec.initial_batch_size,
        command=list(data.command),
        image=data.image,
        env=dict(data.env),
        elastic=elastic_json(spec),
        priority=data.priority,
        submitted_by=principal.key[:64],
    )
    session.add(row)
    session.flush()
    session.add(
        JobEventRow(
            job_id=row.id, kind="state", payload={"to": JobState.PENDING.value}, reason="submitted"
        )
    )
    return row


def _check_priority(priority: str | None, classes: Mapping[str, float]) -> None:
    """:class:`InvalidInput` for a ``priority`` not among ``classes``."""
    if priority is not None and priority not in classes:
        known = ", ".join(sorted(classes)) or "none are defined"
        raise InvalidInput(
            f"unknown priority class {priority!r}: the classes are {known}", field="priority"
        )


def visible_job(session: Session, principal: Principal, job_id: str) -> JobRow:
    """The job if the caller may see it, else :class:`NotFound` (never Forbidden: existence
    must not leak)."""
    row = session.get(JobRow, job_id)
    if row is None or not _sees(principal, row):
        raise NotFound(f"no job {job_id}")
    return row


def locked_job(session: Session, principal: Principal, job_id: str) -> JobRow:
    """:func:`visible_job`, its row read again under a lock (``FOR UPDATE``). A caller whose
    sight of a job does not depend on its row (an admin; a job's token, which sees its own job
    only) reads it once, locked; a user reads it unlocked first, so another tenant's job is a
    404 that never waits for the job's lock."""
    if principal.role is Role.USER:
        seen = visible_job(session, principal, job_id)
        session.refresh(seen, with_for_update=True)
        return seen
    if principal.role is Role.JOB and principal.job_id != job_id:
        raise NotFound(f"no job {job_id}")
    row = session.get(JobRow, job_id, with_for_update=True, populate_existing=True)
    if row is None or not _sees(principal, row):
        raise NotFound(f"no job {job_id}")
    return row


def _sees(principal: Principal, row: JobRow) -> bool:
    if principal.role is Role.ADMIN:
        return True
    if principal.role is Role.USER:
        return principal.tenant == row.tenant
    if principal.role is Role.JOB:
        return principal.job_id == row.id
    return False


def _page_key(row: JobRow) -> str:
    return json.dumps([row.created_at.isoformat(), row.id])


def _after(token: str) -> tuple[datetime, str]:
    """The (created_at in UTC, id) a job page token carries. An edited token whose time has no
    zone, or does not fit in UTC (year 1 at +14:00 overflows), or whose id is not a short
    string, is :class:`InvalidInput`, never an overflow later in the query."""
    try:
        created, job_id = json.loads(page_key("job", token))
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not isinstance(job_id, str) or len(job_id) > 64:
            raise ValueError("not a job page key")
        return when.astimezone(UTC), job_id
    except (ValueError, TypeError, OverflowError) as error:
        raise InvalidInput(MALFORMED, field="page_token") from error


def list_jobs(
    session: Session,
    principal: Principal,
    *,
    page_size: int,
    page_token: str | None,
    state: JobState | None,
    tenant: str | None,
    name: str | None,
    id_prefix: str | None = None,
    columns: Sequence[Any] = (),
) -> tuple[list[Any], str | None]:
    """One page of the jobs the caller sees (oldest first), filtered by state, tenant, exact
    name and id prefix (``id_prefix``: the start of a job id, as the CLI accepts them): whole
    rows, or only ``columns`` of :class:`JobRow` (``created_at`` and ``id`` among them: the
    page's key) for a caller that shows a summary (a list then reads none of a job's JSON
    fields, which grow with its epochs)."""
    query: Any = select(*columns) if columns else select(JobRow)
    if principal.role is Role.USER:
        if tenant is not None and tenant != principal.tenant:
            return [], None
        query = query.where(JobRow.tenant == principal.tenant)
    elif principal.role is Role.ADMIN:
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
    elif principal.role is Role.JOB:
        query = query.where(JobRow.id == principal.job_id)
    else:
        return [], None
    if state is not None:
        query = query.where(JobRow.state == state.value)
    if name is not None:
        query = query.where(JobRow.name == name)
    if id_prefix:
        query = query.where(col(JobRow.id).startswith(id_prefix, autoescape=True))
    if page_token:
        created, last_id = _after(page_token)
        query = query.where(
            or_(
                col(JobRow.created_at) > created,
                and_(col(JobRow.created_at) == created, col(JobRow.id) > last_id),
            )
        )
    query = query.order_by(col(JobRow.created_at), col(JobRow.id)).limit(page_size + 1)
    return cut(session.exec(query).all(), page_size, _page_key, "job")


def cancel_job(session: Session, principal: Principal, job_id: str) -> JobRow:
    row = visible_job(session, principal, job_id)
    if principal.role not in (Role.ADMIN, Role.USER):
        raise Forbidden("only users and admins cancel jobs")
    record_state(session, row, JobState.CANCELLED, "cancelled by request")
    return row


def idempotent(
    session: Session,
    principal: Principal,
    key: str | None,
    body: Any,
    act: Callable[[], Response],
) -> Response:
    """Run ``act`` once per (caller, key); replay its response on retries with the same body.

    The key row is inserted in the same transaction as the action, so a concurrent retry blocks
    on the unique constraint until the first commits, then replays its response. A different
    body under the same key is a 422. Without a key, ``act`` simply runs.
    """
    if key is None:
        result = act()
        session.commit()
        return result
    if not 1 <= len(key) <= 255:
        raise InvalidInput("Idempotency-Key must be 1-255 characters", field="Idempotency-Key")
    digest = _digest(body)
    record = IdempotencyRow(principal=principal.key, key=key, request_hash=digest)
    session.add(record)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        return _replay(session, principal, key, digest)
    status, payload, location = act()
    record.status_code = status
    record.response = payload
    record.location = location
    session.add(record)
    session.commit()
    return status, payload, location


def _replay(session: Session, principal: Principal, key: str, digest: str) -> Response:
    row = session.exec(
        select(IdempotencyRow).where(
            IdempotencyRow.principal == principal.key, IdempotencyRow.key == key
        )
    ).first()
    if row is None or row.status_code is None or row.response is None:
        raise Conflict("a request with this Idempotency-Key is still in progress")
    if row.request_hash != digest:
        raise InvalidInput(
            "this Idempotency-Key was used with a different request body",
            title="Idempotency key reused",
            field="Idempotency-Key",
        )
    return row.status_code, row.response, row.location


def _digest(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
