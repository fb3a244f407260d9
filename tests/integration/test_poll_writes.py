"""The statements a poll writes its jobs and events with (:func:`store.jobs.write_folded`,
:func:`store.jobs.insert_events`): on Postgres one execution for any number of rows, which
must store exactly what the row-by-row statements store, in the same order."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlmodel import Session, col

from store.jobs import (
    JOB_EVENTS,
    JOBS,
    POLLED_COLUMNS,
    PolledJob,
    insert_events,
    state_event,
    write_folded,
)
from store.tables import JobEventRow, JobRow
from tests.integration.conftest import Database, Tokens
from tests.integration.driving import submit


def polled(session: Session, job_id: str) -> PolledJob:
    row = session.connection().execute(
        select(*(JOBS.c[name] for name in POLLED_COLUMNS)).where(JOBS.c.id == job_id)
    )
    return PolledJob(**row.one()._mapping)


def test_folded_rows_are_stored_exactly_as_written(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    first, second = submit(client, tokens.admin), submit(client, tokens.admin)
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    with Session(database.engine) as session:
        rows = [polled(session, first), polled(session, second)]
        changed = [
            dataclasses.replace(
                rows[0],
                epochs_done=0.1 + 0.2,
                batch_size=64,
                attained_s=1e-300,
                carried_s=12345.678901234567,
                epoch_seconds={"32": [1.5, 2.0], "64": [0.30000000000000004, 1.0]},
                scalings=[[1, 2, 64]],
                measured_epoch_seconds={"32": 0.75},
                last_seq=7,
                updated_at=at,
            ),
            dataclasses.replace(
                rows[1], carried_s=float("inf"), last_seq=3, updated_at=at + timedelta(seconds=1)
            ),
        ]
        write_folded(session, changed[:1])  # on Postgres: the rows as one JSON parameter
        write_folded(session, changed[1:])
        session.commit()
    with Session(database.engine) as session:
        stored = {job.id: polled(session, job.id) for job in changed}
    first_stored = stored[first]
    assert first_stored.epochs_done == 0.1 + 0.2
    assert first_stored.attained_s == 1e-300
    assert first_stored.carried_s == 12345.678901234567
    assert first_stored.batch_size == 64
    assert first_stored.epoch_seconds == {"32": [1.5, 2.0], "64": [0.30000000000000004, 1.0]}
    assert first_stored.scalings == [[1, 2, 64]]
    assert first_stored.last_seq == 7
    assert first_stored.updated_at == at
    assert stored[second].carried_s == float("inf")  # not JSON: written row by row
    assert stored[second].last_seq == 3
    with Session(database.engine) as session:
        row = session.get(JobRow, first)
        assert row is not None and row.measured_epoch_seconds == {"32": 0.75}


def test_events_are_inserted_in_their_order_state_events_without_a_seq(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job = submit(client, tokens.admin)
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    written = [
        {
            "job_id": job,
            "seq": 2,
            "kind": "progress",
            "payload": {"epoch": 1, "seconds": 0.1 + 0.2, "note": 'é "quoted"'},
            "reason": "",
            "created_at": at,
        },
        state_event(job, "PENDING", "RUNNING", "attempt a started on n", at),
        {
            "job_id": job,
            "seq": 1,
            "kind": "scaling",
            "payload": {"batch_size": 64},
            "reason": "",
            "created_at": at + timedelta(microseconds=1),
        },
    ]
    with Session(database.engine) as session:
        last = session.connection().execute(select(func.max(JOB_EVENTS.c.id))).scalar() or 0
        insert_events(session.connection(), written)
        insert_events(session.connection(), [])
        session.commit()
    with Session(database.engine) as session:
        events = (
            session.execute(
                select(JobEventRow)
                .where(col(JobEventRow.job_id) == job, col(JobEventRow.id) > last)
                .order_by(col(JobEventRow.id))
            )
            .scalars()
            .all()
        )
    assert [(e.seq, e.kind, e.payload, e.reason, e.created_at) for e in events] == [
        (w.get("seq"), w["kind"], w["payload"], w["reason"], w["created_at"]) for w in written
    ]
