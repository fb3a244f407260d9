"""A poll that says ``defer_busy`` never waits for a job another transaction holds (the round
driver writing a boundary, for seconds on a large cluster): its reports and events on that job
are answered 503 with nothing recorded, its start is acknowledged by a later poll, and its
heartbeat and leases are answered at once. A poll without it (an agent that predates it) waits
for the lock as before. Postgres only: SQLite has no row locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from store import boundary_gate
from store.principals import Role
from store.tables import ClusterRow, JobEventRow, LeaseRow, NodeRow
from store.tokens import create_token
from tests.integration.api_calls import bearer
from tests.integration.conftest import NODE, Database, build_app, migrated_postgres
from tests.integration.driving import (
    ROUND_S,
    agent_token,
    driver_on,
    job_state,
    leases,
    now,
    submit,
)
from tests.integration.driving import register as register_node


@pytest.fixture(scope="module")
def busy_database(postgres_server: Engine) -> Iterator[Database]:
    with migrated_postgres(postgres_server, "it_busy") as database:
        yield database


@pytest.fixture
def setup(busy_database: Database) -> Iterator[tuple[TestClient, str, str, str, str]]:
    """A client, the admin's and node-1's agent tokens, and one job leased on node-1:
    (client, admin, agent, job, attempt)."""
    busy_database.empty()
    with Session(busy_database.engine) as session:
        admin = create_token(session, Role.ADMIN, name="admin")
    agent = agent_token(busy_database, NODE)
    with TestClient(build_app(busy_database), raise_server_exceptions=False) as client:
        register_node(client, agent)
        job = submit(client, admin)
        with driver_on(busy_database) as (driver, _):
            driver.step(now())
        (lease,) = leases(busy_database)
        yield client, admin, agent, job, lease.id


@contextmanager
def job_locked(database: Database, job: str) -> Iterator[None]:
    """The job's row held by another transaction (as the round driver holds every active job's
    while it writes a boundary)."""
    with database.engine.connect() as connection:
        connection.execute(text("SELECT id FROM jobs WHERE id = :job FOR UPDATE"), {"job": job})
        yield
        connection.rollback()


def contact(client: TestClient, token: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/agent/poll", json=body, headers=bearer(token))
    assert response.status_code == 200, response.json()
    answer: dict[str, Any] = response.json()
    return answer


def progress(attempt: str, seq: int) -> dict[str, Any]:
    return {
        "attempt_id": attempt,
        "seq": seq,
        "kind": "progress",
        "epoch": 1,
        "samples": 10,
        "seconds": 1.0,
        "batch_size": 32,
    }


def stored(database: Database, attempt: str, job: str) -> tuple[str, int]:
    """The lease's state and the job's progress events stored."""
    with Session(database.engine) as session:
        lease = session.get(LeaseRow, attempt)
        assert lease is not None
        events = session.exec(
            select(JobEventRow).where(JobEventRow.job_id == job, JobEventRow.kind == "progress")
        ).all()
        return lease.state, len(events)


def heartbeat_at(database: Database) -> Any:
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None
        return node.last_heartbeat_at


def test_a_poll_that_defers_is_answered_at_once_and_records_nothing_on_a_busy_job(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    client, _, agent, job, attempt = setup
    body = {
        "defer_busy": True,
        "running": [attempt],
        "reports": [{"attempt_id": attempt, "state": "running"}],
        "events": [progress(attempt, 1)],
    }
    before = heartbeat_at(busy_database)
    with job_locked(busy_database, job):
        began = time.monotonic()
        answer = contact(client, agent, **body)
        waited = time.monotonic() - began
        assert waited < 5.0, f"the poll waited {waited:.1f} s for the lock"
        assert [(r["attempt_id"], r["status"], r["stop"]) for r in answer["reports"]] == [
            (attempt, 503, False)
        ]
        assert [(e["seq"], e["status"]) for e in answer["events"]] == [(1, 503)]
        assert [lease["attempt_id"] for lease in answer["leases"]] == [attempt]
    assert stored(busy_database, attempt, job) == ("ISSUED", 0), "nothing recorded"
    assert job_state(busy_database, job) == "PENDING"
    assert heartbeat_at(busy_database) > before, "the heartbeat is not deferred"

    again = contact(client, agent, **body)  # the lock is gone: the same poll applies
    assert [(r["status"], r["lease"]["state"]) for r in again["reports"]] == [(200, "RUNNING")]
    assert [(e["seq"], e["status"]) for e in again["events"]] == [(1, 201)]
    assert stored(busy_database, attempt, job) == ("RUNNING", 1)
    assert job_state(busy_database, job) == "RUNNING"


def test_a_poll_without_defer_busy_waits_for_the_job_as_before(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    client, _, agent, job, attempt = setup
    answers: list[dict[str, Any]] = []
    with job_locked(busy_database, job):
        waiting = threading.Thread(
            target=lambda: answers.append(contact(client, agent, running=[attempt]))
        )
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive() and not answers, "it waits for the lock"
    waiting.join(30.0)
    ((lease,),) = [answer["leases"] for answer in answers]
    assert (lease["attempt_id"], lease["state"]) == (attempt, "RUNNING")


@contextmanager
def gate_held(database: Database, *, closed: bool) -> Iterator[None]:
    """The boundary gate held by another transaction, by the store's own calls: closed, as a
    boundary being written holds it, or passed, as a poll in flight does."""
    with Session(database.engine) as session:
        if closed:
            boundary_gate.close(session)
        else:
            assert boundary_gate.pass_through(session.connection(), wait=True)
        yield
        session.rollback()


def test_a_poll_during_a_boundary_defers_every_job_it_names(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    """While the driver writes a boundary (the gate closed), a poll that defers takes every job
    it names for busy, one the driver has not locked yet too: its reports and events are
    answered 503 at once, nothing recorded; once the boundary commits the same poll applies."""
    client, _, agent, job, attempt = setup
    body = {
        "defer_busy": True,
        "running": [attempt],
        "reports": [{"attempt_id": attempt, "state": "running"}],
        "events": [progress(attempt, 1)],
    }
    with gate_held(busy_database, closed=True):
        began = time.monotonic()
        answer = contact(client, agent, **body)
        assert time.monotonic() - began < 5.0, "the poll waited for the boundary"
        assert [(r["status"], r["stop"]) for r in answer["reports"]] == [(503, False)]
        assert [(e["seq"], e["status"]) for e in answer["events"]] == [(1, 503)]
    assert stored(busy_database, attempt, job) == ("ISSUED", 0), "nothing recorded"

    again = contact(client, agent, **body)
    assert [(r["status"], r["lease"]["state"]) for r in again["reports"]] == [(200, "RUNNING")]
    assert [(e["seq"], e["status"]) for e in again["events"]] == [(1, 201)]
    assert stored(busy_database, attempt, job) == ("RUNNING", 1)


def test_a_boundary_waits_at_the_gate_for_the_polls_in_flight(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    """A boundary begun while a poll that passed the gate is still in flight waits for it to end
    before it locks any job, then is written; a poll that arrives while the boundary waits
    defers (polls that keep arriving never hold the boundary off)."""
    client, _, agent, job, attempt = setup
    done: list[int] = []
    with driver_on(busy_database, ttl_s=3600.0) as (driver, _):
        with gate_held(busy_database, closed=False):
            due = now() + ROUND_S + 1.0
            boundary = threading.Thread(target=lambda: done.append(int(driver.step(due))))
            boundary.start()
            boundary.join(1.0)
            assert boundary.is_alive() and not done, "the boundary waits for the poll"
            later = contact(client, agent, defer_busy=True, events=[progress(attempt, 1)])
            assert [(e["seq"], e["status"]) for e in later["events"]] == [(1, 503)]
            assert boundary.is_alive() and not done
        boundary.join(30.0)
    assert done == [1]
    with Session(busy_database.engine) as session:
        cluster = session.get(ClusterRow, "default")
        assert cluster is not None and cluster.current_round == 1
    assert [(lease.job_id, lease.round_index) for lease in leases(busy_database)] == [(job, 1)]


@contextmanager
def row_locked(database: Database, table: str, key: str) -> Iterator[None]:
    """A row of ``table`` held by another transaction."""
    with database.engine.connect() as connection:
        connection.execute(text(f"SELECT id FROM {table} WHERE id = :key FOR UPDATE"), {"key": key})
        yield
        connection.rollback()


def started_events(database: Database, job: str) -> int:
    """The job's state events into RUNNING."""
    with Session(database.engine) as session:
        rows = session.exec(
            select(JobEventRow).where(JobEventRow.job_id == job, JobEventRow.kind == "state")
        ).all()
        return sum(1 for row in rows if row.payload.get("to") == "RUNNING")


def moved(database: Database, job: str) -> None:
    """The job RUNNING already, as one whose earlier attempt elsewhere is stopping while its
    new lease waits to be acknowledged."""
    with database.engine.begin() as connection:
        connection.execute(text("UPDATE jobs SET state = 'RUNNING' WHERE id = :job"), {"job": job})


GHOST = {"attempt_id": "0b5c3a4e-0000-4000-8000-000000000001", "state": "checkpointed"}


@pytest.mark.parametrize(
    "says", [{}, {"reports": [GHOST]}], ids=["nothing-else", "a-report-besides"]
)
def test_a_job_already_running_is_acknowledged_without_its_jobs_lock(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database, says: dict[str, Any]
) -> None:
    """An acknowledgement moves the node's own lease: a lease of a job that is RUNNING
    already becomes RUNNING while another transaction holds the job (a boundary being written
    holds every active job), and the job is left as it was, with no state event."""
    client, _, agent, job, attempt = setup
    moved(busy_database, job)
    with job_locked(busy_database, job):
        began = time.monotonic()
        answer = contact(client, agent, defer_busy=True, running=[attempt], **says)
        assert time.monotonic() - began < 5.0, "the poll waited for the job"
        assert [(lease["attempt_id"], lease["state"]) for lease in answer["leases"]] == [
            (attempt, "RUNNING")
        ]
    assert stored(busy_database, attempt, job) == ("RUNNING", 0)
    assert (job_state(busy_database, job), started_events(busy_database, job)) == ("RUNNING", 0)


def test_a_starting_job_that_is_busy_is_acknowledged_by_a_later_poll(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    """A poll that only lists what it runs (a node's first poll after starting a round's new
    attempts) locks the jobs that start, without waiting: a busy one is acknowledged by the
    next poll, which starts the job once, with its state event."""
    client, _, agent, job, attempt = setup
    with job_locked(busy_database, job):
        answer = contact(client, agent, defer_busy=True, running=[attempt])
        assert [lease["state"] for lease in answer["leases"]] == ["ISSUED"]
    assert (stored(busy_database, attempt, job), job_state(busy_database, job)) == (
        ("ISSUED", 0),
        "PENDING",
    )
    again = contact(client, agent, defer_busy=True, running=[attempt])
    assert [lease["state"] for lease in again["leases"]] == ["RUNNING"]
    assert (job_state(busy_database, job), started_events(busy_database, job)) == ("RUNNING", 1)
    contact(client, agent, defer_busy=True, running=[attempt])
    assert started_events(busy_database, job) == 1, "acknowledged once"


def test_a_lease_another_transaction_holds_is_acknowledged_later_not_waited_for(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    client, _, agent, job, attempt = setup
    moved(busy_database, job)
    answers: list[dict[str, Any]] = []
    with row_locked(busy_database, "leases", attempt):
        polling = threading.Thread(
            target=lambda: answers.append(
                contact(client, agent, defer_busy=True, running=[attempt])
            )
        )
        polling.start()
        polling.join(5.0)
        assert answers, "the poll waited for the lease"
    polling.join(30.0)
    assert [lease["state"] for lease in answers[0]["leases"]] == ["ISSUED"]
    again = contact(client, agent, defer_busy=True, running=[attempt])
    assert [lease["state"] for lease in again["leases"]] == ["RUNNING"]


def test_a_long_poll_whose_acknowledgement_waits_is_answered_at_once(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    """A long poll that acknowledges what its node started is held like any other once the
    acknowledgement is recorded; one whose acknowledgement had to wait (a busy job) is answered
    at once instead, so that the node sends it again soon rather than after the hold."""
    client, _, agent, job, attempt = setup
    seen = contact(client, agent)["current_round"]
    body = {"defer_busy": True, "running": [attempt], "wait_s": 2.0, "seen_round": seen}
    with job_locked(busy_database, job):
        began = time.monotonic()
        answer = contact(client, agent, **body)
        assert time.monotonic() - began < 1.5, "held although its acknowledgement waits"
        assert [lease["state"] for lease in answer["leases"]] == ["ISSUED"]
    began = time.monotonic()
    answer = contact(client, agent, **body)
    assert time.monotonic() - began >= 1.5, "acknowledged, then held: nothing new"
    assert [lease["state"] for lease in answer["leases"]] == ["RUNNING"]


def test_a_long_poll_whose_event_waits_is_answered_at_once(
    setup: tuple[TestClient, str, str, str, str], busy_database: Database
) -> None:
    client, _, agent, job, attempt = setup
    contact(client, agent, defer_busy=True, running=[attempt])  # acknowledged: RUNNING
    seen = contact(client, agent)["current_round"]
    body = {
        "defer_busy": True,
        "running": [attempt],
        "events": [progress(attempt, 1)],
        "wait_s": 2.0,
        "seen_round": seen,
    }
    with job_locked(busy_database, job):
        began = time.monotonic()
        answer = contact(client, agent, **body)
        assert time.monotonic() - began < 1.5, "held although its event waits"
        assert [(e["seq"], e["status"]) for e in answer["events"]] == [(1, 503)]
    assert stored(busy_database, attempt, job) == ("RUNNING", 0)


def second_attempt(database: Database, attempt: str, state: str) -> str:
    """A newer lease of the attempt's job, in ``state`` (a copy of its row, issued later)."""
    newer = "0b5c3a4e-0000-4000-8000-0000000000aa"
    with database.engine.begin() as connection:
        connection.execute(
            text("CREATE TEMP TABLE newer ON COMMIT DROP AS SELECT * FROM leases WHERE id = :a"),
            {"a": attempt},
        )
        connection.execute(
            text(
                "UPDATE newer SET id = :b, state = :state, "
                "issued_at = issued_at + interval '1 second'"
            ),
            {"b": newer, "state": state},
        )
        connection.execute(text("INSERT INTO leases SELECT * FROM newer"))
    return newer


@pytest.mark.parametrize("via", ["poll", "status"])
@pytest.mark.parametrize(
    ("newer", "expected"),
    [
        (None, (200, "CHECKPOINTED", "SUSPENDED")),
        ("ISSUED", (200, "CHECKPOINTED", "RUNNING")),
        ("RUNNING", (409, "REVOKED", "RUNNING")),
    ],
    ids=["runs-nowhere-else", "issued-elsewhere", "successor-running"],
)
def test_a_checkpoint_report_in_a_poll_reads_its_jobs_other_leases_as_one_alone_does(
    setup: tuple[TestClient, str, str, str, str],
    busy_database: Database,
    via: str,
    newer: str | None,
    expected: tuple[int, str, str],
) -> None:
    """A poll's reports read their jobs' other leases once for all (store.leases.JobLeases),
    and answer as a report of its own does: a revoked attempt that checkpointed suspends its
    job only when no other lease of the job is live, and is refused (fenced) once a newer
    attempt of its job has started."""
    client, _, agent, job, attempt = setup
    with busy_database.engine.begin() as connection:
        connection.execute(
            text("UPDATE leases SET state = 'REVOKED' WHERE id = :a"), {"a": attempt}
        )
    moved(busy_database, job)
    if newer is not None:
        second_attempt(busy_database, attempt, newer)
    report = {"attempt_id": attempt, "state": "checkpointed"}
    if via == "poll":
        answer = contact(client, agent, defer_busy=True, heartbeat=False, reports=[report])
        (status,) = [r["status"] for r in answer["reports"]]
    else:
        status = client.post(
            f"/v1/agent/leases/{attempt}/status",
            json={"state": "checkpointed"},
            headers=bearer(agent),
        ).status_code
    assert (status, stored(busy_database, attempt, job)[0], job_state(busy_database, job)) == (
        expected
    )
