"""The round driver's bulk writes and what it keeps between boundaries, on Postgres and SQLite:
a boundary's leases are extended, issued and revoked in chunks of statements with each
attempt's rows whole, and the jobs' fixed fields are read once and forgotten when the job
leaves the active set."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text
from sqlmodel import Session, col, select

from solver_service import leases as round_leases
from store.snapshot import free_gpus, gpu_layout
from store.tables import JobEventRow, JobRow, LeaseRow, NodeRow
from tests.integration.api_calls import bearer
from tests.integration.conftest import Database, Tokens
from tests.integration.driving import (
    ROUND_S,
    agent_token,
    driver_on,
    leases,
    now,
    register,
    round_row,
    store_plan,
    submit,
)


def gpus_held(database: Database) -> list[tuple[str, int]]:
    return [(lease.node_id, g) for lease in leases(database) for g in lease.gpus]


def test_a_boundary_in_chunks_extends_issues_and_revokes_every_lease_whole(
    client: TestClient, tokens: Tokens, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(round_leases, "BULK_ROWS", 3)  # 8 leases: chunks of 3, 3 and 2
    register(client, tokens.agent)
    register(client, agent_token(database, "node-2"))
    jobs = [submit(client, tokens.admin, gpus=1, name=f"j{i}") for i in range(12)]
    kept, dropped, joining = jobs[:4], jobs[4:8], jobs[8:]
    store_plan(database, [kept + dropped, kept + joining])

    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        first = {lease.job_id: lease for lease in leases(database)}
        assert sorted(first) == sorted(kept + dropped)
        assert driver.step(t0 + ROUND_S)

    second = {lease.job_id: lease for lease in leases(database)}
    row = round_row(database, 1)
    assert sorted(second) == sorted(kept + joining)
    assert (row.leases_extended, row.leases_issued, row.leases_revoked) == (4, 4, 4)
    for job in kept:  # extended: the same attempt on the same GPUs, moved to round 1
        lease, before = second[job], first[job]
        assert (lease.id, lease.node_id, lease.gpus) == (before.id, before.node_id, before.gpus)
        assert (lease.round_index, lease.ends_at) == (1, row.ends_at)
        assert lease.updated_at == row.started_at and lease.began_at == before.began_at
        assert lease.first_ends_at is not None and lease.first_ends_at == before.first_ends_at
        assert lease.first_ends_at < lease.ends_at
    for job in joining:  # issued: every column written
        lease = second[job]
        assert lease.id not in {old.id for old in first.values()}
        assert (lease.state, lease.round_index, lease.reason) == ("ISSUED", 1, "")
        assert lease.issued_at == lease.updated_at == row.started_at
        assert lease.ends_at == lease.first_ends_at == row.ends_at
        assert lease.began_at is not None and len(lease.gpus) == 1
    revoked = leases(database, states=("REVOKED",))
    assert sorted(lease.job_id for lease in revoked) == sorted(dropped)
    assert all(lease.reason.startswith("preempted in round 1") for lease in revoked)
    with Session(database.engine) as session:
        events = session.exec(
            select(JobEventRow.job_id).where(JobEventRow.kind == "preemption")
        ).all()
    assert sorted(events) == sorted(dropped), "one preemption event a revoked job"
    held = gpus_held(database)
    assert len(held) == len(set(held)) == 8, "each GPU leased once"


def test_the_driver_reads_a_jobs_fixed_fields_once_and_forgets_it_once_inactive(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent)
    jobs = [submit(client, tokens.admin, gpus=2, name=f"k{i}") for i in range(3)]
    store_plan(database, [jobs[:2]])

    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        assert driver._known.fixed == {job: (True, False) for job in jobs}
        # a stored spec is fixed at submission: what the first boundary read stands, so a
        # row changed behind the API's back is not read again
        with Session(database.engine) as session:
            row = session.get(JobRow, jobs[2])
            assert row is not None
            row.samples_per_epoch, row.throughput = 2147483647, {"32": 1e-300}
            session.add(row)
            session.commit()
        cancelled = client.post(f"/v1/jobs/{jobs[0]}/cancel", headers=bearer(tokens.admin))
        assert cancelled.status_code == 200, cancelled.json()
        assert driver.step(t0 + ROUND_S)
        assert driver._known.fixed == {job: (True, False) for job in jobs[1:]}, (
            "a cancelled job is forgotten"
        )
        assert {lease.job_id for lease in leases(database)} == set(jobs[1:])

    # a new driver (a takeover) reads the stored specs afresh: the changed row is refused
    with driver_on(database) as (driver, _):
        driver.step(t0 + 2 * ROUND_S)
        assert driver._known.fixed[jobs[2]] == (False, False)
        with Session(database.engine) as session:
            live = session.exec(
                select(LeaseRow.job_id).where(col(LeaseRow.state).in_(("ISSUED", "RUNNING")))
            ).all()
        assert jobs[2] not in live, "a job the model refuses is given no lease"


def test_a_fill_on_a_cluster_with_no_gpu_free_locks_no_job(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Every GPU leased: a change (a job submitted) asks for a fill, which can start nothing,
    so it takes no job's lock (on Postgres: an agent's poll holding one does not hold it up;
    the fill would fail on its lock timeout if it waited)."""
    register(client, tokens.agent)
    busy = [submit(client, tokens.admin, gpus=2, name=f"b{i}") for i in range(2)]
    store_plan(database, [busy])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        assert {lease.job_id for lease in leases(database)} == set(busy)
        waiting = submit(client, tokens.admin, gpus=1, name="w")
        with ExitStack() as stack:
            session = stack.enter_context(Session(database.engine))
            if database.kind == "postgres":  # SQLite has no row locks
                holder = stack.enter_context(database.engine.connect())
                stack.enter_context(holder.begin())
                held = text("SELECT id FROM jobs WHERE id = :id FOR UPDATE")
                holder.execute(held, {"id": busy[0]})
                session.execute(text("SET LOCAL lock_timeout = '500ms'"))
            fill = round_leases.fill_round(session, "default", now)
        assert fill.jobs == () and fill.issued == 0
        assert waiting not in {lease.job_id for lease in leases(database)}
        assert not driver.step(t0 + ROUND_S * 0.1), "nothing to start: the fill does nothing"
        assert driver.last_fill is None


def test_free_gpus_counts_each_ready_gpu_once_as_the_layout_lays_them_out(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """The driver's "is any GPU free" aggregate: a READY node's GPUs are what it reports,
    never more than approved; a GPU a live lease and a revoked attempt share counts once; a
    finished attempt, a lease off a READY node and a local index past the node's width hold
    nothing. It agrees with the GPU layout and the leases read in Python."""
    register(client, tokens.agent, gpus=8)  # approved for 64: 8 GPUs
    register(client, agent_token(database, "node-2", approved=4), gpus=4)
    register(client, agent_token(database, "node-3"), gpus=4)
    job = submit(client, tokens.admin, gpus=1, name="j")
    stamp = datetime.now(UTC)
    held = [
        ("node-1", [0, 1], "RUNNING"),
        ("node-1", [1, 2], "REVOKED"),
        ("node-1", [5], "EXITED"),
        ("node-2", [3, 5], "ISSUED"),
        ("node-3", [0, 1, 2, 3], "RUNNING"),
    ]
    with Session(database.engine) as session:
        for node, gpus, state in held:
            session.add(
                LeaseRow(
                    id=str(uuid.uuid4()),
                    job_id=job,
                    node_id=node,
                    round_index=0,
                    gpus=gpus,
                    state=state,
                    issued_at=stamp,
                    ends_at=stamp,
                )
            )
        session.commit()
        assert free_gpus(session) == 8 + 4 + 4 - 3 - 1 - 4
        lost = session.get(NodeRow, "node-3")
        assert lost is not None
        lost.state = "LOST"
        session.add(lost)
        session.commit()
        layout = gpu_layout(session)
        assert layout is not None
        used = {
            g
            for lease in session.exec(select(LeaseRow)).all()
            if lease.state in ("ISSUED", "STARTED", "RUNNING", "REVOKED")
            for g in layout.global_gpus(lease.node_id, lease.gpus)
        }
        assert free_gpus(session) == layout.cluster.total_gpus - len(used) == 8 + 4 - 3 - 1


def test_the_driver_reads_a_stored_plans_row_once_and_follows_it_from_what_it_kept(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A plan's row (a window of job ids: megabytes on a large cluster) is read by the first
    boundary that follows it; the boundaries after it that follow the same plan name it in a
    small read and use what the driver kept, and follow it exactly as the first did."""
    register(client, tokens.agent)
    jobs = [submit(client, tokens.admin, gpus=2, name=f"p{i}") for i in range(3)]
    plan = store_plan(database, [[jobs[0], jobs[1]], [jobs[1], jobs[2]], [jobs[2], jobs[0]]])
    rounds_read: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "plans.rounds" in statement.split("FROM")[0]:  # the row's rounds selected
            rounds_read.append(statement)

    event.listen(database.engine, "before_cursor_execute", seen)
    try:
        with driver_on(database) as (driver, _):
            t0 = now()
            for index in range(3):
                assert driver.step(t0 + index * ROUND_S)
                assert driver.last_round is not None
                assert (driver.last_round.source, driver.last_round.plan_id) == ("plan", plan)
                assert {lease.job_id for lease in leases(database)} == set(
                    [[jobs[0], jobs[1]], [jobs[1], jobs[2]], [jobs[2], jobs[0]]][index]
                )
            assert [ref[0] for ref in driver._known.plans] == [plan]
    finally:
        event.remove(database.engine, "before_cursor_execute", seen)
    assert len(rounds_read) == 1, rounds_read
