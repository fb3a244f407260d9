"""What an agent's contact costs the server, and how its liveness is judged, on Postgres and
SQLite: a poll's reports are capped by the node's GPUs and cost one read however many name
unknown attempts, a poll is one transaction, a contact counts from its request's arrival, and
a server that answered nobody for a while never makes live nodes LOST."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api import agent
from api.agent_schemas import AgentPoll
from shockwave.domain.lifecycle import reports_per_poll
from store.principals import Principal, Role
from store.tables import NodeRow
from store.tokens import hash_token
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import NODE, Database, Tokens, migrated_postgres
from tests.integration.driving import (
    agent_token,
    driver_on,
    leases,
    now,
    register,
    report,
    submit,
)

GHOST = "0b5c3a4e-0000-4000-8000-{:012d}"


def ghosts(count: int) -> list[dict[str, Any]]:
    return [{"attempt_id": GHOST.format(i), "state": "checkpointed"} for i in range(count)]


def test_a_poll_carries_at_most_two_reports_per_gpu_of_its_node(
    client: TestClient, tokens: Tokens
) -> None:
    register(client, tokens.agent, gpus=8)
    most = reports_per_poll(8)
    assert most == 16
    fits = client.post(
        "/v1/agent/poll", json={"reports": ghosts(most)}, headers=bearer(tokens.agent)
    )
    assert fits.status_code == 200, fits.json()
    assert [r["status"] for r in fits.json()["reports"]] == [404] * most

    too_many = client.post(
        "/v1/agent/poll", json={"reports": ghosts(most + 1)}, headers=bearer(tokens.agent)
    )
    assert "16 reports" in assert_problem(too_many, 422, field="reports")["detail"]
    logs = {GHOST.format(i): "x" for i in range(most + 1)}
    too_many_logs = client.post("/v1/agent/poll", json={"logs": logs}, headers=bearer(tokens.agent))
    assert_problem(too_many_logs, 422, field="logs")

    register(client, tokens.agent, gpus=1)
    small = client.post("/v1/agent/poll", json={"reports": ghosts(9)}, headers=bearer(tokens.agent))
    assert_problem(small, 422, field="reports")
    assert reports_per_poll(1) == 8


@contextmanager
def counted(database: Database) -> Iterator[dict[str, int]]:
    """Statements and commits on ``database`` while the block runs."""
    seen = {"statements": 0, "commits": 0}

    def statement(*_: Any) -> None:
        seen["statements"] += 1

    def commit(*_: Any) -> None:
        seen["commits"] += 1

    event.listen(database.engine, "before_cursor_execute", statement)
    event.listen(database.engine, "commit", commit)
    try:
        yield seen
    finally:
        event.remove(database.engine, "before_cursor_execute", statement)
        event.remove(database.engine, "commit", commit)


def test_a_polls_reports_on_unknown_attempts_cost_one_read_and_the_poll_one_commit(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A poll of 16 reports on attempts the server does not know costs what a poll of one
    does: the same statements, one commit (a rogue agent cannot multiply the server's work
    by what it says)."""
    register(client, tokens.agent, gpus=8)
    client.post("/v1/agent/poll", json={}, headers=bearer(tokens.agent))  # the token is cached

    costs = []
    for count in (1, 16):
        with counted(database) as seen:
            answer = client.post(
                "/v1/agent/poll", json={"reports": ghosts(count)}, headers=bearer(tokens.agent)
            )
        assert answer.status_code == 200, answer.json()
        assert [r["status"] for r in answer.json()["reports"]] == [404] * count
        costs.append(dict(seen))
    assert costs[0] == costs[1], costs
    assert costs[1]["commits"] == 1, costs


def _beat(database: Database, node: str) -> datetime:
    with Session(database.engine) as session:
        row = session.get(NodeRow, node)
        assert row is not None and row.last_heartbeat_at is not None
        stamp = row.last_heartbeat_at
        return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def test_a_contact_counts_from_when_its_request_arrived_and_never_moves_back(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A poll served 20 s after it arrived (a queue in front of a slow server) is a sign of
    life from its arrival; one that arrived earlier but was served later does not move the
    node's last contact back."""
    register(client, tokens.agent)
    principal = Principal(role=Role.AGENT, key="test", node=NODE)
    arrived = datetime.now(UTC) + timedelta(seconds=20)
    with Session(database.engine) as session:
        agent.poll(session, principal, NODE, AgentPoll(), arrived=arrived)
    assert abs((_beat(database, NODE) - arrived).total_seconds()) < 1e-3
    with Session(database.engine) as session:
        agent.poll(session, principal, NODE, AgentPoll(), arrived=arrived - timedelta(seconds=5))
        agent.heartbeat(session, NODE, arrived - timedelta(seconds=3))
    assert abs((_beat(database, NODE) - arrived).total_seconds()) < 1e-3

    before = datetime.now(UTC)
    assert client.post("/v1/agent/heartbeat", headers=bearer(tokens.agent)).status_code == 200
    assert _beat(database, NODE) == max(arrived, _beat(database, NODE))
    assert before - timedelta(seconds=1) < _beat(database, NODE)


def _silent_since(database: Database, seconds: float, *nodes: str) -> None:
    with Session(database.engine) as session:
        for node in nodes:
            row = session.get(NodeRow, node)
            assert row is not None
            row.last_heartbeat_at = datetime.now(UTC) - timedelta(seconds=seconds)
            session.add(row)
        session.commit()


def _states(database: Database, *nodes: str) -> list[str]:
    with Session(database.engine) as session:
        rows = [session.get(NodeRow, node) for node in nodes]
        return [row.state if row is not None else "-" for row in rows]


def test_a_server_that_answered_nobody_for_a_while_never_makes_live_nodes_lost(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Both nodes' last contacts are 40 s old (TTL 30 s) because the server got to none of
    their requests meanwhile: neither is LOST. Once the server answers again, a node that
    still says nothing is LOST a TTL after the other's contact moved past its own; when
    every node has been silent for more than two TTLs (the whole cluster down) all are."""
    other = agent_token(database, "node-2")
    register(client, tokens.agent)
    register(client, other)
    _silent_since(database, 40.0, NODE, "node-2")
    with driver_on(database, ttl_s=30.0) as (driver, _):
        driver.step(now())
        assert _states(database, NODE, "node-2") == ["READY", "READY"]

        assert client.post("/v1/agent/poll", json={}, headers=bearer(other)).status_code == 200
        driver.step(now())
        assert _states(database, NODE, "node-2") == ["LOST", "READY"]

    third = agent_token(database, "node-3")
    register(client, third)
    _silent_since(database, 61.0, "node-2", "node-3")
    with driver_on(database, ttl_s=30.0) as (driver, _):
        driver.step(now())
    assert _states(database, NODE, "node-2", "node-3") == ["LOST", "LOST", "LOST"]


def test_a_nodes_poll_carries_its_jobs_events_as_their_tokens_would_post_them(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Events in a poll are recorded as the attempt's job token would record them: stored
    (201), a duplicate replayed (200), another node's attempt unknown (404), and once the
    attempt is fenced refused with ``stop`` (409); a refused one undoes nothing else."""
    register(client, tokens.agent)
    job = client.post("/v1/jobs", json=job_body(epochs=10), headers=bearer(tokens.admin)).json()[
        "id"
    ]
    with driver_on(database) as (driver, _):
        driver.step(now())
    (lease,) = leases(database)
    attempt = lease.id
    progress = {"kind": "progress", "samples": 100, "seconds": 10.0, "batch_size": 32}
    events = [
        {"attempt_id": attempt, "seq": 1, "epoch": 1, **progress},
        {"attempt_id": attempt, "seq": 1, "epoch": 1, **progress},
        {"attempt_id": GHOST.format(0), "seq": 2, "epoch": 2, **progress},
        {"attempt_id": attempt, "seq": 3, "epoch": 2, **progress},
    ]
    answer = client.post(
        "/v1/agent/poll",
        json={"running": [attempt], "events": events},
        headers=bearer(tokens.agent),
    )
    assert answer.status_code == 200, answer.json()
    assert [e["status"] for e in answer.json()["events"]] == [201, 200, 404, 201]
    shown = client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json()
    assert shown["epochs_done"] == 2, shown

    stranger = agent_token(database, "node-2")
    register(client, stranger)
    theirs = client.post(
        "/v1/agent/poll",
        json={"events": [{"attempt_id": attempt, "seq": 4, "epoch": 3, **progress}]},
        headers=bearer(stranger),
    )
    assert [e["status"] for e in theirs.json()["events"]] == [404]

    report = {"attempt_id": attempt, "state": "checkpointed"}
    client.post("/v1/agent/poll", json={"reports": [report]}, headers=bearer(tokens.agent))
    late = client.post(
        "/v1/agent/poll",
        json={"events": [{"attempt_id": attempt, "seq": 5, "epoch": 3, **progress}]},
        headers=bearer(tokens.agent),
    )
    ((refused,),) = (late.json()["events"],)
    assert (refused["status"], refused["stop"]) == (409, True), refused
    shown = client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json()
    assert shown["epochs_done"] == 2, shown


def test_registering_again_unchanged_is_a_heartbeat_and_bumps_nothing(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A thousand agents retrying their registers must not bump the cluster's version (and ask
    for a plan) once per retry: a READY node registering as it was is a heartbeat."""
    first = register(client, tokens.agent, gpus=8)
    again = register(client, tokens.agent, gpus=8)
    assert again["state_version"] == first["state_version"]
    assert again["last_heartbeat_at"] >= first["last_heartbeat_at"]
    changed = register(client, tokens.agent, gpus=4)
    assert changed["state_version"] == first["state_version"] + 1


def test_no_node_is_lost_for_a_ttl_after_an_api_process_said_it_was_overloaded(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """An API process that sheds requests says so (store.lease_signal.OVERLOAD): for a TTL
    the driver marks no node LOST, though one node's contacts stopped while another's got
    through; then silence counts again."""
    other = agent_token(database, "node-2")
    register(client, tokens.agent)
    register(client, other)
    _silent_since(database, 40.0, NODE)
    with driver_on(database, ttl_s=30.0) as (driver, _):
        driver.servers_overloaded()
        driver.step(now())
        assert _states(database, NODE, "node-2") == ["READY", "READY"]
        assert client.post("/v1/agent/poll", json={}, headers=bearer(other)).status_code == 200
        driver.step(now() + 31.0)
        assert _states(database, NODE, "node-2") == ["LOST", "READY"]


def progress_event(attempt: str, seq: int, epoch: int) -> dict[str, Any]:
    return {
        "attempt_id": attempt,
        "seq": seq,
        "kind": "progress",
        "epoch": epoch,
        "samples": 10,
        "seconds": 1.0,
        "batch_size": 32,
    }


def _round_started(client: TestClient, tokens: Tokens, database: Database) -> dict[str, str]:
    """One boundary of the round driver, its leases acknowledged RUNNING by the node's poll;
    job id -> attempt id."""
    with driver_on(database) as (driver, _):
        driver.step(now())
    attempts = {lease.job_id: lease.id for lease in leases(database)}
    running = sorted(attempts.values())
    started = client.post("/v1/agent/poll", json={"running": running}, headers=bearer(tokens.agent))
    assert started.status_code == 200, started.json()
    return attempts


def test_a_polls_events_cost_one_read_one_insert_and_one_update_for_all(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Eight new progress events of eight jobs in one poll cost about the statements one event
    does (their leases and jobs read once, locked; on Postgres the events inserted in one
    statement and the jobs' rows updated together, a statement per set of columns changed),
    and each is recorded and folded into its job as if it came alone."""
    register(client, tokens.agent, gpus=8)
    jobs = [submit(client, tokens.admin, gpus=1) for _ in range(8)]
    attempts = _round_started(client, tokens, database)
    assert sorted(attempts) == sorted(jobs)
    running = sorted(attempts.values())

    costs = []
    for events in (
        [progress_event(attempts[jobs[0]], 1, 1)],
        [progress_event(attempts[jobs[0]], 2, 2)]
        + [progress_event(attempts[job], 1, 1) for job in jobs[1:]],
    ):
        with counted(database) as seen:
            answer = client.post(
                "/v1/agent/poll",
                json={"running": running, "events": events},
                headers=bearer(tokens.agent),
            )
        assert answer.status_code == 200, answer.json()
        assert [e["status"] for e in answer.json()["events"]] == [201] * len(events)
        costs.append(dict(seen))
    if database.kind == "postgres":
        assert costs[1]["statements"] <= costs[0]["statements"] + 2, costs
    assert costs[1]["commits"] == 1, costs
    done = {
        job: client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json()["epochs_done"]
        for job in jobs
    }
    assert done == {job: (2 if job == jobs[0] else 1) for job in jobs}, done


def test_a_statement_prepared_on_an_empty_table_is_planned_again_once_the_table_grows(
    postgres_server: Engine,
) -> None:
    """psycopg prepares a statement at its fifth execution on a connection, and Postgres would
    keep the generic plan it chose after five more: a node's view prepared while no lease
    existed read every lease at each later poll. The store's connections plan each execution
    for the tables as they are then (no statistics here: no ANALYZE), so the prepared view of a
    node estimates the leases a node now has, not the none it had."""
    with migrated_postgres(postgres_server) as database, database.engine.connect() as connection:
        connection.execute(text("CREATE TEMP TABLE n (id text PRIMARY KEY)"))
        connection.execute(text("CREATE TEMP TABLE l (id text PRIMARY KEY, node text, r int)"))
        connection.execute(text("CREATE INDEX ON l (node)"))
        connection.execute(text("INSERT INTO n SELECT 'n' || g FROM generate_series(1, 1000) g"))
        view = text("SELECT n.id, l.r FROM n LEFT JOIN l ON l.node = n.id WHERE n.id = :id")
        for _ in range(20):
            connection.execute(view, {"id": "n1"}).all()
        connection.execute(
            text(
                "INSERT INTO l SELECT 'l' || g, 'n' || g % 1000, g FROM generate_series(1, 50000) g"
            )
        )
        name = connection.execute(
            text("SELECT name FROM pg_prepared_statements WHERE statement LIKE '%LEFT JOIN l %'")
        ).scalar_one()
        plan = [row[0] for row in connection.execute(text(f"EXPLAIN EXECUTE {name}('n7')"))]
    scans = [line for line in plan if "Scan on l " in line or line.strip().startswith("->  Seq")]
    estimates = [int(line.split("rows=")[1].split()[0]) for line in scans if "rows=" in line]
    assert estimates and min(estimates) >= 25, plan


def _revoke(database: Database, attempts: list[str]) -> None:
    """Take ``attempts`` back as a round boundary does (their jobs stay RUNNING until each
    attempt reports that it stopped)."""
    with database.engine.begin() as connection:
        for attempt in attempts:
            connection.execute(
                text("UPDATE leases SET state = 'REVOKED' WHERE id = :id"), {"id": attempt}
            )


def _state_events(database: Database, job: str) -> list[tuple[int, dict[str, Any], str]]:
    """(id, payload, reason) of the job's state events, oldest first."""
    with database.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, payload, reason FROM job_events "
                "WHERE job_id = :job AND kind = 'state' ORDER BY id"
            ),
            {"job": job},
        ).all()
    return [
        (
            row.id,
            row.payload if isinstance(row.payload, dict) else json.loads(row.payload),
            row.reason,
        )
        for row in rows
    ]


def test_a_polls_checkpoint_reports_write_what_a_report_each_would_in_one_batch(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Revoked attempts that report ``checkpointed`` in one poll move their leases and jobs
    and record the jobs' state events as a report each on the status endpoint does, the
    events in the order of the poll's reports; three such reports cost the statements one
    does."""
    register(client, tokens.agent, gpus=8)
    jobs = [submit(client, tokens.admin, gpus=1) for _ in range(8)]
    attempts = _round_started(client, tokens, database)
    running = sorted(attempts.values())
    _revoke(database, running)

    alone = jobs[:4]
    for job in alone:
        body = report(client, tokens.agent, attempts[job], "checkpointed")
        assert (body["state"], body["job_state"]) == ("CHECKPOINTED", "SUSPENDED"), body
    costs = []
    for batch in ([jobs[4]], [jobs[7], jobs[6], jobs[5]]):
        sent = [{"attempt_id": attempts[job], "state": "checkpointed"} for job in batch]
        with counted(database) as seen:
            answer = client.post(
                "/v1/agent/poll", json={"reports": sent}, headers=bearer(tokens.agent)
            )
        assert answer.status_code == 200, answer.json()
        answers = answer.json()["reports"]
        assert [(a["status"], a["lease"]["state"], a["lease"]["job_state"]) for a in answers] == [
            (200, "CHECKPOINTED", "SUSPENDED")
        ] * len(batch), answers
        costs.append(dict(seen))
    if database.kind == "postgres":
        assert costs[1]["statements"] == costs[0]["statements"], costs
    assert costs[1]["commits"] == 1, costs

    def shape(job: str) -> list[tuple[dict[str, Any], str]]:
        return [
            (payload, reason.replace(attempts[job], "<attempt>"))
            for _, payload, reason in _state_events(database, job)
        ]

    for job in jobs:
        assert shape(job) == shape(alone[0]), (job, shape(job))
        assert shape(job)[-1] == (
            {"from": "RUNNING", "to": "SUSPENDED"},
            f"attempt <attempt> on {NODE} checkpointed",
        )
    last = [_state_events(database, job)[-1][0] for job in (jobs[7], jobs[6], jobs[5])]
    assert last == sorted(last), "recorded in the order of the poll's reports"
    states = {
        job: client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json() for job in jobs
    }
    assert {s["state"] for s in states.values()} == {"SUSPENDED"}


def test_the_tokens_a_poll_mints_are_stored_as_the_token_endpoint_stores_one(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A poll asking for tokens mints one job token per new lease, in one statement, each
    stored as the token endpoint stores one (hashed, the job's role and scope, named after its
    attempt, live), and each reads its own job only."""
    register(client, tokens.agent, gpus=8)
    jobs = [submit(client, tokens.admin, gpus=1) for _ in range(3)]
    with driver_on(database) as (driver, _):
        driver.step(now())
    attempts = {lease.id: lease.job_id for lease in leases(database)}
    with counted(database) as seen:
        answer = client.post("/v1/agent/poll", json={"tokens": True}, headers=bearer(tokens.agent))
    assert answer.status_code == 200, answer.json()
    minted: dict[str, str] = answer.json()["tokens"]
    assert sorted(minted) == sorted(attempts)
    assert seen["commits"] == 1, seen

    one = sorted(attempts)[0]
    issued = client.post(f"/v1/agent/leases/{one}/token", headers=bearer(tokens.agent))
    assert issued.status_code == 201, issued.json()
    columns = "token_hash, role, tenant, node, job_id, attempt_id, name, expires_at, revoked_at"
    with database.engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT {columns}, created_at FROM tokens WHERE attempt_id IS NOT NULL")
        ).all()
    stored = {row.token_hash: row for row in rows}
    endpoint = stored[hash_token(issued.json()["token"])]
    for attempt, token in minted.items():
        row = stored[hash_token(token)]
        assert row.created_at is not None
        expected = (attempts[attempt], attempt, f"attempt {attempt}")
        assert (row.job_id, row.attempt_id, row.name) == expected
        same = ("role", "tenant", "node", "expires_at")
        assert [getattr(row, c) for c in same] == [getattr(endpoint, c) for c in same]
        assert (row.revoked_at is None) == (attempt != one), "the endpoint replaced its own"
    others = [a for a in sorted(attempts) if a != one]
    for attempt in others:
        token = minted[attempt]
        own = client.get(f"/v1/jobs/{attempts[attempt]}", headers=bearer(token))
        assert own.status_code == 200, own.json()
        other = next(job for job in jobs if job != attempts[attempt])
        assert client.get(f"/v1/jobs/{other}", headers=bearer(token)).status_code in (403, 404)


def _prior(database: Database, tenant: str) -> tuple[int, Any]:
    with database.engine.connect() as connection:
        row = connection.execute(
            text("SELECT learnt, prior FROM population_priors WHERE tenant = :tenant"),
            {"tenant": tenant},
        ).one()
    prior = row.prior if isinstance(row.prior, dict) else json.loads(row.prior)
    return row.learnt, prior


def test_a_job_that_succeeds_in_a_poll_is_learnt_as_one_reported_alone(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A poll reads only part of its jobs' rows; a job whose progress and exit 0 come in one
    poll still succeeds with its whole row learnt into its tenant's prior, as the same job's
    events and exit posted one at a time are."""
    register(client, tokens.agent, gpus=8)
    body = job_body(epochs=2, model="resnet18")
    jobs = {
        tenant: client.post(
            "/v1/jobs", json={**body, "tenant": tenant}, headers=bearer(tokens.admin)
        ).json()["id"]
        for tenant in ("alone", "polled")
    }
    attempts = _round_started(client, tokens, database)
    running = sorted(attempts.values())

    alone = attempts[jobs["alone"]]
    for seq in (1, 2):
        sent = client.post(
            "/v1/agent/poll",
            json={"running": running, "events": [progress_event(alone, seq, seq)]},
            headers=bearer(tokens.agent),
        )
        assert [e["status"] for e in sent.json()["events"]] == [201]
    report(client, tokens.agent, alone, "exited", 0)

    polled = attempts[jobs["polled"]]
    answer = client.post(
        "/v1/agent/poll",
        json={
            "running": [polled],
            "events": [progress_event(polled, 1, 1), progress_event(polled, 2, 2)],
            "reports": [{"attempt_id": polled, "state": "exited", "exit_code": 0}],
        },
        headers=bearer(tokens.agent),
    )
    assert answer.status_code == 200, answer.json()
    assert [e["status"] for e in answer.json()["events"]] == [201, 201]
    ((done,),) = (answer.json()["reports"],)
    assert done["lease"]["job_state"] == "SUCCEEDED", done

    shown = {
        tenant: client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json()
        for tenant, job in jobs.items()
    }
    assert {s["state"] for s in shown.values()} == {"SUCCEEDED"}
    assert shown["polled"]["epochs_done"] == shown["alone"]["epochs_done"] == 2
    assert _prior(database, "polled") == _prior(database, "alone")
    assert _prior(database, "polled")[0] == 1


FOLDED = (
    "epochs_done, batch_size, attained_s, carried_s, epoch_seconds, scalings, "
    "measured_epoch_seconds, last_seq"
)


def _folded(database: Database, job: str) -> tuple[Any, ...]:
    """The job's folded columns (JSON decoded) and its client events (seq, kind, payload)."""
    with database.engine.connect() as connection:
        row = connection.execute(
            text(f"SELECT {FOLDED} FROM jobs WHERE id = :job"), {"job": job}
        ).one()
        events = connection.execute(
            text(
                "SELECT seq, kind, payload FROM job_events "
                "WHERE job_id = :job AND seq IS NOT NULL ORDER BY id"
            ),
            {"job": job},
        ).all()

    def decoded(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    return tuple(decoded(v) for v in row) + tuple(
        (seq, kind, decoded(payload)) for seq, kind, payload in events
    )


def test_a_polls_events_fold_into_their_jobs_rows_as_posted_one_at_a_time(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """The events a poll carries, folded into their jobs' rows in memory and written back in
    one statement, leave the job's row and its events as the same events posted one at a time
    with the attempt's job token do (a duplicate included)."""
    register(client, tokens.agent, gpus=8)
    posted, polled = (submit(client, tokens.admin, gpus=1, epochs=10) for _ in range(2))
    attempts = _round_started(client, tokens, database)
    running = sorted(attempts.values())

    sent = [
        {"seq": 1, "kind": "progress", "epoch": 1, "samples": 1000, "seconds": 2.0},
        {"seq": 2, "kind": "progress", "epoch": 2, "samples": 1000, "seconds": 3.0},
        {"seq": 2, "kind": "progress", "epoch": 2, "samples": 1000, "seconds": 3.0},
        {"seq": 3, "kind": "progress", "epoch": 3, "samples": 900, "seconds": 1.5},
    ]
    sizes = [32, 32, 32, 64]
    token = client.post(
        f"/v1/agent/leases/{attempts[posted]}/token", headers=bearer(tokens.agent)
    ).json()["token"]
    statuses = []
    for told, size in zip(sent, sizes, strict=True):
        answer = client.post(
            f"/v1/jobs/{posted}/events", json={**told, "batch_size": size}, headers=bearer(token)
        )
        statuses.append(answer.status_code)
    assert statuses == [201, 201, 200, 201]

    carried = [
        {**told, "batch_size": size, "attempt_id": attempts[polled]}
        for told, size in zip(sent, sizes, strict=True)
    ]
    answer = client.post(
        "/v1/agent/poll",
        json={"running": running, "events": carried},
        headers=bearer(tokens.agent),
    )
    assert [e["status"] for e in answer.json()["events"]] == [201, 201, 200, 201]

    theirs, ours = _folded(database, posted), _folded(database, polled)
    assert theirs[0] == 3 and len(theirs) == 8 + 3, theirs
    # carried_s depends on when each row last changed: compared apart, both none after an epoch
    assert ours[:3] + ours[4:] == theirs[:3] + theirs[4:]
    assert ours[3] == theirs[3] == 0.0
