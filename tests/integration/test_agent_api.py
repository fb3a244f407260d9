"""/v1/agent on Postgres and SQLite: register, heartbeat, poll leases, report attempts, with the
round driver issuing the leases. Attempt fencing (a stale attempt is told to stop), the job
state machine driven by reports, and an agent never seeing another node's leases."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from api import admission
from api import agent as agent_api
from solver_service.driver import DriverSettings, RoundDriver
from store.tables import NodeRow, TokenRow
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import NODE, Database, RecordedPlanRequests, Tokens
from tests.integration.driving import (
    ROUND_S,
    agent_token,
    driver_on,
    job_state,
    leases,
    now,
    post_status,
    register,
    report,
    store_plan,
    submit,
    version,
)

LONG_ROUND_S = 30.0
"""A round no test outlasts: a step after another in the same round is a mid-round fill, never
a boundary that the clock may or may not have reached (a fill that finds the round over while
it waits for its locks starts nothing, and leaves the jobs to the boundary)."""


def poll(client: TestClient, token: str, **params: str) -> dict[str, Any]:
    response = client.get("/v1/agent/leases", params=params, headers=bearer(token))
    assert response.status_code == 200, response.json()
    body: dict[str, Any] = response.json()
    return body


def one_lease(client: TestClient, tokens: Tokens, database: Database) -> tuple[str, str]:
    """A registered node-1, one 1-GPU job and a round that leases it there: (job, attempt)."""
    register(client, tokens.agent)
    job = submit(client, tokens.admin)
    with driver_on(database) as (driver, _):
        driver.step(now())
    (lease,) = leases(database)
    return job, lease.id


def test_register_creates_a_ready_node_bumps_the_version_and_asks_for_a_plan(
    client: TestClient, tokens: Tokens, database: Database, plan_requests: RecordedPlanRequests
) -> None:
    before = version(database)
    node = register(client, tokens.agent, gpus=8)
    assert (node["id"], node["gpus"], node["gpu_type"], node["state"]) == (NODE, 8, "A100", "READY")
    assert node["last_heartbeat_at"] is not None
    assert node["state_version"] == version(database) == before + 1
    assert plan_requests.requests[-1] == ("default", before + 1)

    again = register(client, tokens.agent, gpus=4, hostname="renamed.local")
    assert (again["gpus"], again["hostname"]) == (4, "renamed.local")
    assert again["state_version"] == before + 2
    listed = client.get("/v1/nodes", headers=bearer(tokens.admin)).json()["items"]
    assert [(n["id"], n["gpus"]) for n in listed] == [(NODE, 4)]


def test_heartbeat_records_life_and_a_lost_node_comes_back_ready(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    unregistered = client.post("/v1/agent/heartbeat", headers=bearer(tokens.agent))
    assert_problem(unregistered, 404, path="/v1/agent/heartbeat")

    first = register(client, tokens.agent)
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None
        node.state = "LOST"
        session.add(node)
        session.commit()
    beat = client.post("/v1/agent/heartbeat", headers=bearer(tokens.agent))
    assert beat.status_code == 200, beat.json()
    assert beat.json()["state"] == "READY"
    assert beat.json()["last_heartbeat_at"] >= first["last_heartbeat_at"]
    assert beat.json()["state_version"] == first["state_version"] + 1, "capacity came back"


def test_admins_act_for_a_named_node_and_agents_only_for_their_own(
    client: TestClient, tokens: Tokens
) -> None:
    unnamed = client.post(
        "/v1/agent/register", json={"gpus": 2, "hostname": "h"}, headers=bearer(tokens.admin)
    )
    assert_problem(unnamed, 422, field="node")
    named = register(client, tokens.admin, node="node-9")
    assert named["id"] == "node-9"
    assert poll(client, tokens.admin, node="node-9")["leases"] == []

    other = client.post(
        "/v1/agent/register",
        json={"gpus": 2, "hostname": "h", "node": "node-9"},
        headers=bearer(tokens.agent),
    )
    assert_problem(other, 404)
    for token in (tokens.user_a, tokens.job(submit(client, tokens.admin))):
        refused = client.get("/v1/agent/leases", headers=bearer(token))
        assert_problem(refused, 403)


def test_a_poll_returns_the_lease_with_what_the_job_needs_to_start(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    body = poll(client, tokens.agent)
    assert (body["node"], body["current_round"], body["stop"]) == (NODE, 0, [])
    (lease,) = body["leases"]
    assert (lease["attempt_id"], lease["job_id"], lease["round_index"]) == (attempt, job, 0)
    assert lease["gpus"] == [0] and lease["state"] == "ISSUED"
    assert lease["ends_at"] == body["round_ends_at"]
    (row,) = leases(database)  # the first round begins when it is made: its issue
    assert datetime.fromisoformat(lease["began_at"]) == row.began_at == row.issued_at
    assert lease["batch_size"] == job_body()["initial_batch_size"]
    assert lease["env"] == {
        "CUDA_VISIBLE_DEVICES": "0",
        "SHOCKWAVE_JOB_ID": job,
        "SHOCKWAVE_ATTEMPT_ID": attempt,
        "SHOCKWAVE_BATCH_SIZE": "32",
        "SHOCKWAVE_CHECKPOINT_DIR": lease["checkpoint_dir"],
    }
    assert job in lease["checkpoint_dir"]


def test_an_agent_never_sees_or_touches_another_nodes_leases(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    _, attempt = one_lease(client, tokens, database)
    stranger = agent_token(database, "node-2")
    register(client, stranger)

    assert poll(client, stranger)["leases"] == []
    assert attempt in poll(client, stranger, running=attempt)["stop"], "not its attempt: stop"
    assert_problem(
        client.get("/v1/agent/leases", params={"node": NODE}, headers=bearer(stranger)), 404
    )
    assert_problem(post_status(client, stranger, attempt, "started"), 404)
    assert_problem(client.post(f"/v1/agent/leases/{attempt}/token", headers=bearer(stranger)), 404)
    assert job_state_of_lease(client, tokens, attempt) == "ISSUED"


def job_state_of_lease(client: TestClient, tokens: Tokens, attempt: str) -> str:
    (lease,) = [le for le in poll(client, tokens.agent)["leases"] if le["attempt_id"] == attempt]
    state: str = lease["state"]
    return state


def test_reports_drive_the_job_to_success_and_are_idempotent(
    client: TestClient, tokens: Tokens, database: Database, plan_requests: RecordedPlanRequests
) -> None:
    job, attempt = one_lease(client, tokens, database)
    started = report(client, tokens.agent, attempt, "started")
    assert (started["state"], started["job_state"], started["stop"]) == (
        "STARTED",
        "RUNNING",
        False,
    )
    assert report(client, tokens.agent, attempt, "running")["state"] == "RUNNING"
    assert report(client, tokens.agent, attempt, "started")["state"] == "RUNNING", "no way back"
    before = version(database)

    done = report(client, tokens.agent, attempt, "exited", 0)
    assert (done["state"], done["job_state"], done["stop"]) == ("EXITED", "SUCCEEDED", True)
    assert version(database) == before + 1 and plan_requests.requests[-1][1] == before + 1
    assert report(client, tokens.agent, attempt, "exited", 0) == done, "a retry, same answer"
    stale = post_status(client, tokens.agent, attempt, "running")
    assert_problem(stale, 409)
    assert stale.json()["stop"] is True
    assert poll(client, tokens.agent)["leases"] == []
    states = [
        e["payload"]["to"]
        for e in client.get(f"/v1/jobs/{job}/events", headers=bearer(tokens.admin)).json()["items"]
        if e["kind"] == "state"
    ]
    assert states == ["PENDING", "RUNNING", "SUCCEEDED"]


def test_a_report_that_changes_nothing_writes_nothing_and_is_still_scoped(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """``running`` on an extended lease already RUNNING (every agent sends one per lease and
    round) is answered from a read without locks: the same answer, no row written. It is still
    the caller's own attempt or a 404, and once the attempt must stop it is refused again."""
    job, attempt = one_lease(client, tokens, database)
    report(client, tokens.agent, attempt, "started")
    first = report(client, tokens.agent, attempt, "running")
    before = (lease_updated_at(database, attempt), event_count(database))

    assert report(client, tokens.agent, attempt, "running") == first
    assert report(client, tokens.agent, attempt, "started") == first, "no way back"
    assert (lease_updated_at(database, attempt), event_count(database)) == before, "no write"

    stranger = agent_token(database, "node-2")
    register(client, stranger)
    assert_problem(post_status(client, stranger, attempt, "running"), 404)

    cancelled = client.post(f"/v1/jobs/{job}/cancel", headers=bearer(tokens.admin))
    assert cancelled.status_code == 200
    stale = post_status(client, tokens.agent, attempt, "running")
    assert_problem(stale, 409)
    assert stale.json()["stop"] is True


def lease_updated_at(database: Database, attempt: str) -> Any:
    (lease,) = [le for le in leases(database) if le.id == attempt]
    return lease.updated_at


def event_count(database: Database) -> int:
    with Session(database.engine) as session:
        return int(
            session.connection().exec_driver_sql("SELECT count(*) FROM job_events").scalar_one()
        )


def test_a_nonzero_exit_fails_the_job(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    report(client, tokens.agent, attempt, "started")
    failed = report(client, tokens.agent, attempt, "exited", 3)
    assert failed["job_state"] == "FAILED" == job_state(database, job)
    assert_problem(post_status(client, tokens.agent, attempt, "exited", 4), 409)


def test_a_revoked_attempt_is_fenced_and_its_checkpoint_suspends_the_job(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=1)
    first, second = submit(client, tokens.admin), submit(client, tokens.admin)
    store_plan(database, [[first], [second]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        (attempt,) = (le.id for le in leases(database))
        report(client, tokens.agent, attempt, "started")
        driver.step(t0 + ROUND_S)

    body = poll(client, tokens.agent, running=attempt)
    assert body["stop"] == [attempt]
    assert [le["job_id"] for le in body["leases"]] == [second]
    refused = post_status(client, tokens.agent, attempt, "running")
    problem = assert_problem(refused, 409)
    assert problem["stop"] is True and problem["attempt_id"] == attempt
    assert job_state(database, first) == "RUNNING", "until its attempt confirms a checkpoint"

    stopped = report(client, tokens.agent, attempt, "checkpointed")
    assert (stopped["state"], stopped["job_state"], stopped["stop"]) == (
        "CHECKPOINTED",
        "SUSPENDED",
        True,
    )
    assert attempt not in poll(client, tokens.agent)["stop"]


def test_a_revoked_attempt_killed_after_its_grace_period_does_not_fail_the_job(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=1)
    first, second = submit(client, tokens.admin), submit(client, tokens.admin)
    store_plan(database, [[first], [second]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        (attempt,) = (le.id for le in leases(database))
        report(client, tokens.agent, attempt, "started")
        driver.step(t0 + ROUND_S)
    killed = report(client, tokens.agent, attempt, "exited", -9)
    assert killed["job_state"] == "PENDING", "no checkpoint: back to the queue from the start"


def test_a_preempted_job_whose_agent_never_confirms_is_suspended_a_round_later(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=1)
    first, second = submit(client, tokens.admin), submit(client, tokens.admin)
    store_plan(database, [[first], [second], [second]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        (attempt,) = (le.id for le in leases(database))
        report(client, tokens.agent, attempt, "started")
        driver.step(t0 + ROUND_S)
        assert job_state(database, first) == "RUNNING"
        driver.step(t0 + 2 * ROUND_S)
    assert job_state(database, first) == "PENDING"


def test_a_cancelled_jobs_attempt_must_stop_at_once(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    report(client, tokens.agent, attempt, "started")
    cancelled = client.post(f"/v1/jobs/{job}/cancel", headers=bearer(tokens.admin))
    assert cancelled.status_code == 200

    body = poll(client, tokens.agent, running=attempt)
    assert (body["leases"], body["stop"]) == ([], [attempt])
    assert post_status(client, tokens.agent, attempt, "running").json()["stop"] is True
    assert report(client, tokens.agent, attempt, "checkpointed")["job_state"] == "CANCELLED"


def test_unknown_running_attempts_come_back_in_stop(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    _, attempt = one_lease(client, tokens, database)
    ghost = "0b5c3a4e-0000-4000-8000-000000000000"
    body = poll(client, tokens.agent, running=f"{attempt},{ghost}")
    assert body["stop"] == [ghost]
    assert_problem(post_status(client, tokens.agent, ghost, "running"), 404)


def test_exit_code_goes_with_exited_only(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    _, attempt = one_lease(client, tokens, database)
    for body in ({"state": "exited"}, {"state": "running", "exit_code": 0}):
        response = client.post(
            f"/v1/agent/leases/{attempt}/status", json=body, headers=bearer(tokens.agent)
        )
        assert_problem(response, 422, field="exit_code")
    assert_problem(
        client.post(
            f"/v1/agent/leases/{attempt}/status",
            json={"state": "paused"},
            headers=bearer(tokens.agent),
        ),
        422,
        field="state",
    )


def test_a_live_attempt_gets_a_token_scoped_to_its_job(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    other = submit(client, tokens.admin)
    issued = client.post(f"/v1/agent/leases/{attempt}/token", headers=bearer(tokens.agent))
    assert issued.status_code == 201, issued.json()
    token = issued.json()["token"]
    assert issued.json()["job_id"] == job

    event = {"seq": 1, "kind": "progress", "epoch": 1, "samples": 10, "seconds": 1.0}
    posted = client.post(
        f"/v1/jobs/{job}/events", json={**event, "batch_size": 32}, headers=bearer(token)
    )
    assert posted.status_code == 201, posted.json()
    assert_problem(client.get(f"/v1/jobs/{other}", headers=bearer(token)), 404)

    report(client, tokens.agent, attempt, "exited", 0)
    stale = client.post(f"/v1/agent/leases/{attempt}/token", headers=bearer(tokens.agent))
    assert_problem(stale, 409)


def attempt_token(client: TestClient, tokens: Tokens, attempt: str) -> str:
    issued = client.post(f"/v1/agent/leases/{attempt}/token", headers=bearer(tokens.agent))
    assert issued.status_code == 201, issued.json()
    token: str = issued.json()["token"]
    return token


def post_progress(client: TestClient, token: str, job: str, seq: int) -> Any:
    event = {"seq": seq, "kind": "progress", "epoch": min(seq, 3), "samples": 10, "seconds": 1.0}
    return client.post(
        f"/v1/jobs/{job}/events", json={**event, "batch_size": 32}, headers=bearer(token)
    )


def progress_seqs(client: TestClient, tokens: Tokens, job: str) -> list[int]:
    listed = client.get(
        f"/v1/jobs/{job}/events", params={"kind": "progress"}, headers=bearer(tokens.admin)
    )
    assert listed.status_code == 200, listed.json()
    return [e["seq"] for e in listed.json()["items"]]


def assert_fenced(response: Any, attempt: str) -> None:
    problem = assert_problem(response, 409)
    assert problem["title"] == "Attempt fenced", problem
    assert (problem["fenced"], problem["stop"], problem["attempt_id"]) == (True, True, attempt)


def test_a_lost_attempt_s_events_are_refused_and_leave_the_job_s_progress_alone(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    token = attempt_token(client, tokens, attempt)
    report(client, tokens.agent, attempt, "started")
    assert post_progress(client, token, job, 1).status_code == 201
    with driver_on(database, ttl_s=30.0) as (driver, _):
        driver.step(now() + 60.0)
    (lost,) = leases(database, states=("LOST",))
    assert lost.id == attempt

    assert_fenced(post_progress(client, token, job, 2), attempt)
    assert_fenced(post_progress(client, token, job, 1), attempt)
    assert progress_seqs(client, tokens, job) == [1]
    record = client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json()
    assert record["epochs_done"] == 1
    time.sleep(1.1)  # past the process's cache of attempt tokens (api.auth)
    gone = client.get(f"/v1/jobs/{job}", headers=bearer(token))
    assert_problem(gone, 401)  # the token lives as long as its attempt
    unscoped = tokens.job(job)
    assert post_progress(client, unscoped, job, 2).status_code == 201, "not an attempt's token"


def test_a_stopped_attempt_s_token_is_fenced(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    token = attempt_token(client, tokens, attempt)
    report(client, tokens.agent, attempt, "started")
    assert report(client, tokens.agent, attempt, "checkpointed")["job_state"] == "SUSPENDED"
    assert_fenced(post_progress(client, token, job, 1), attempt)
    assert progress_seqs(client, tokens, job) == []


def test_a_revoked_attempt_reports_in_its_grace_period_until_a_newer_one_starts(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=1)
    first, second = submit(client, tokens.admin), submit(client, tokens.admin)
    store_plan(database, [[first], [second], [first]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        (old,) = (le.id for le in leases(database))
        old_token = attempt_token(client, tokens, old)
        report(client, tokens.agent, old, "started")
        assert post_progress(client, old_token, first, 1).status_code == 201
        driver.step(t0 + ROUND_S)
        assert post_progress(client, old_token, first, 2).status_code == 201, "grace period"
        driver.step(t0 + 2 * ROUND_S)
    (new,) = (le.id for le in leases(database) if le.job_id == first)
    assert new != old
    assert post_progress(client, old_token, first, 3).status_code == 201, "newer one not up"

    new_token = attempt_token(client, tokens, new)
    report(client, tokens.agent, new, "started")
    assert_fenced(post_progress(client, old_token, first, 4), old)
    assert post_progress(client, new_token, first, 4).status_code == 201
    assert progress_seqs(client, tokens, first) == [1, 2, 3, 4]


def _superseded(client: TestClient, tokens: Tokens, database: Database) -> tuple[str, str, str]:
    """Job ``first`` ran as attempt ``old``, was revoked, and now runs as ``new``."""
    register(client, tokens.agent, gpus=1)
    first, second = submit(client, tokens.admin), submit(client, tokens.admin)
    store_plan(database, [[first], [second], [first]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        (old,) = (le.id for le in leases(database))
        report(client, tokens.agent, old, "started")
        driver.step(t0 + ROUND_S)
        driver.step(t0 + 2 * ROUND_S)
    (new,) = (le.id for le in leases(database) if le.job_id == first)
    report(client, tokens.agent, new, "started")
    return first, old, new


def test_a_superseded_attempt_cannot_finish_or_requeue_its_job(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Issue 16, finding 3: a revoked attempt whose job runs on as a newer attempt reports
    ``exited 0`` (status and poll) and ``checkpointed``: each is refused with 409 and stop, the
    job stays RUNNING and the newer attempt live."""
    job, old, new = _superseded(client, tokens, database)

    for state, code in (("exited", 0), ("checkpointed", None), ("exited", 1)):
        refused = post_status(client, tokens.agent, old, state, code)
        problem = assert_problem(refused, 409)
        assert problem["stop"] is True and new in problem["detail"], problem
    answer = contact(
        client, tokens.agent, reports=[{"attempt_id": old, "state": "exited", "exit_code": 0}]
    )
    assert [(r["status"], r["stop"]) for r in answer["reports"]] == [(409, True)]

    assert job_state(database, job) == "RUNNING"
    assert [le.id for le in leases(database) if le.job_id == job] == [new]
    assert report(client, tokens.agent, new, "running")["stop"] is False


def test_an_attempt_its_agent_stopped_goes_back_to_the_queue_whatever_its_exit(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """The agent asked the process to stop (its lease ran out, the agent drains) before any
    revoke reached the lease: SIGTERM before the program's handler (-15) or SIGKILL after the
    grace period (-9) is that stop, not a failure. The same exit unasked fails the job."""
    job, attempt = one_lease(client, tokens, database)
    report(client, tokens.agent, attempt, "started")
    body = {"state": "exited", "exit_code": -15, "stop_requested": True}
    response = client.post(
        f"/v1/agent/leases/{attempt}/status", json=body, headers=bearer(tokens.agent)
    )
    assert response.status_code == 200, response.json()
    stopped = response.json()
    assert (stopped["state"], stopped["job_state"]) == ("EXITED", "PENDING"), stopped
    again = client.post(
        f"/v1/agent/leases/{attempt}/status", json=body, headers=bearer(tokens.agent)
    )
    assert again.json() == stopped, "a retry, same answer"

    with driver_on(database) as (driver, _):
        # Each step lies past the end of the round before it, however fast the machine is.
        driver.step(now() + ROUND_S)
        (second,) = (le.id for le in leases(database))
        report(client, tokens.agent, second, "started")
        assert report(client, tokens.agent, second, "checkpointed")["job_state"] == "SUSPENDED"
        driver.step(now() + 2 * ROUND_S)
    (third,) = (le.id for le in leases(database))
    report(client, tokens.agent, third, "started")
    killed = client.post(
        f"/v1/agent/leases/{third}/status",
        json={"state": "exited", "exit_code": -9, "stop_requested": True},
        headers=bearer(tokens.agent),
    )
    assert killed.status_code == 200, killed.json()
    assert killed.json()["job_state"] == "SUSPENDED" == job_state(database, job), "checkpoint"

    unasked_job, unasked = one_lease_more(client, tokens, database)
    report(client, tokens.agent, unasked, "started")
    crashed = report(client, tokens.agent, unasked, "exited", -15)
    assert crashed["job_state"] == "FAILED" == job_state(database, unasked_job)


def one_lease_more(client: TestClient, tokens: Tokens, database: Database) -> tuple[str, str]:
    """One more job, leased in the next round: (job, attempt)."""
    job = submit(client, tokens.admin)
    with driver_on(database) as (driver, _):
        driver.step(now() + 10 * ROUND_S)
    (lease,) = (le for le in leases(database) if le.job_id == job)
    return job, lease.id


def test_stop_requested_goes_with_exited_only(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    _, attempt = one_lease(client, tokens, database)
    for state in ("running", "checkpointed"):
        response = client.post(
            f"/v1/agent/leases/{attempt}/status",
            json={"state": state, "stop_requested": True},
            headers=bearer(tokens.agent),
        )
        assert_problem(response, 422, field="stop_requested")


def contact(client: TestClient, token: str, **body: Any) -> dict[str, Any]:
    """``POST /v1/agent/poll``: a whole contact of an agent in one request."""
    response = client.post("/v1/agent/poll", json=body, headers=bearer(token))
    assert response.status_code == 200, response.json()
    answer: dict[str, Any] = response.json()
    return answer


def test_one_poll_acknowledges_a_started_attempt_and_heartbeats(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Listing a new lease in ``running`` is its start: the lease is RUNNING and so is the job,
    without a ``started`` report. Listing it again writes nothing."""
    job, attempt = one_lease(client, tokens, database)
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None
        beat_before = node.last_heartbeat_at

    first = contact(client, tokens.agent)
    ((lease,), stop) = (first["leases"], first["stop"])
    assert (lease["attempt_id"], lease["state"], stop) == (attempt, "ISSUED", [])
    assert (first["node_state"], first["current_round"], first["reports"]) == ("READY", 0, [])

    started = contact(client, tokens.agent, running=[attempt])
    assert [(le["attempt_id"], le["state"]) for le in started["leases"]] == [(attempt, "RUNNING")]
    assert started["stop"] == []
    assert job_state(database, job) == "RUNNING"
    events = client.get(f"/v1/jobs/{job}/events", headers=bearer(tokens.admin)).json()["items"]
    state_events = [e for e in events if e["kind"] == "state"]
    assert [e["payload"]["to"] for e in state_events] == ["PENDING", "RUNNING"]
    assert state_events[-1]["payload"]["from"] == "PENDING"
    assert state_events[-1]["reason"] == f"attempt {attempt} started on {NODE}"
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None and node.last_heartbeat_at is not None
        assert beat_before is not None and node.last_heartbeat_at > beat_before

    before = (lease_updated_at(database, attempt), event_count(database))
    again = contact(client, tokens.agent, running=[attempt], heartbeat=False)
    assert again["leases"] == started["leases"]
    assert (lease_updated_at(database, attempt), event_count(database)) == before, "no write"


def test_a_polls_reports_are_answered_each_as_alone_and_in_order(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """An unknown attempt's report is a 404 answer that does not undo the others; an exit
    after it is applied; a report on the finished attempt is then refused (409, stop)."""
    job, attempt = one_lease(client, tokens, database)
    ghost = "0b5c3a4e-0000-4000-8000-000000000000"
    answer = contact(
        client,
        tokens.agent,
        reports=[
            {"attempt_id": attempt, "state": "started"},
            {"attempt_id": ghost, "state": "checkpointed"},
            {"attempt_id": attempt, "state": "exited", "exit_code": 0},
            {"attempt_id": attempt, "state": "running"},
        ],
    )
    statuses = [(r["attempt_id"], r["status"], r["stop"]) for r in answer["reports"]]
    assert statuses == [
        (attempt, 200, False),
        (ghost, 404, False),
        (attempt, 200, True),
        (attempt, 409, True),
    ]
    assert answer["reports"][2]["lease"]["job_state"] == "SUCCEEDED" == job_state(database, job)
    assert answer["leases"] == [] and answer["stop"] == []


def test_a_poll_stops_what_must_stop_and_is_scoped_to_the_callers_node(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job, attempt = one_lease(client, tokens, database)
    ghost = "0b5c3a4e-0000-4000-8000-000000000000"
    assert contact(client, tokens.agent, running=[attempt, ghost])["stop"] == [ghost]

    stranger = agent_token(database, "node-2")
    register(client, stranger)
    theirs = contact(client, stranger, reports=[{"attempt_id": attempt, "state": "running"}])
    assert [(r["status"], r["stop"]) for r in theirs["reports"]] == [(404, False)]
    assert theirs["leases"] == []
    assert contact(client, stranger, running=[attempt])["stop"] == [attempt]
    refused = client.post("/v1/agent/poll", json={"node": NODE}, headers=bearer(stranger))
    assert_problem(refused, 404)

    cancelled = client.post(f"/v1/jobs/{job}/cancel", headers=bearer(tokens.admin))
    assert cancelled.status_code == 200
    assert contact(client, tokens.agent, running=[attempt])["stop"] == [attempt]
    assert job_state(database, job) == "CANCELLED"


def test_a_poll_from_an_unknown_node_is_a_404_and_bad_reports_name_the_field(
    client: TestClient, tokens: Tokens
) -> None:
    assert_problem(client.post("/v1/agent/poll", json={}, headers=bearer(tokens.agent)), 404)
    register(client, tokens.agent)
    bad = client.post(
        "/v1/agent/poll",
        json={"reports": [{"attempt_id": "a", "state": "exited"}]},
        headers=bearer(tokens.agent),
    )
    assert "exit_code" in str(assert_problem(bad, 422))
    too_many = client.post(
        "/v1/agent/poll", json={"running": ["a"] * 1025}, headers=bearer(tokens.agent)
    )
    assert "running" in str(assert_problem(too_many, 422))


def test_a_long_poll_is_held_while_nothing_is_new_and_answered_when_the_driver_commits(
    client: TestClient, tokens: Tokens, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait_s``: with nothing new for the node the answer waits (no news, the same answer
    after ``wait_s``); the round driver of the same process committing a round that leases a
    job to the node wakes a waiting poll at once, long before its ``wait_s``."""
    register(client, tokens.agent)
    with driver_on(database) as (driver, _):
        driver.step(now())
    idle = contact(client, tokens.agent)
    began = time.monotonic()
    held = contact(client, tokens.agent, wait_s=0.3, seen_round=idle["current_round"])
    assert time.monotonic() - began >= 0.28
    assert (held["current_round"], held["leases"]) == (idle["current_round"], [])

    job = submit(client, tokens.admin)
    answer, took = held_poll_woken_by_a_round(client, tokens, database, monkeypatch, 20.0)
    assert took < 5.0
    assert answer["current_round"] == idle["current_round"] + 1
    assert [lease["job_id"] for lease in answer["leases"]] == [job]
    assert set(answer["tokens"]) == {answer["leases"][0]["attempt_id"]}


def held_poll_woken_by_a_round(
    client: TestClient,
    tokens: Tokens,
    database: Database,
    monkeypatch: pytest.MonkeyPatch,
    wait_s: float,
) -> tuple[dict[str, Any], float]:
    """A long poll of ``wait_s`` from the current round, held (nothing new), then woken by a
    round driver of the API's process committing the next round; its answer and how long it
    took. Only the signal wakes it (no re-read on a timer)."""
    seen = contact(client, tokens.agent)["current_round"]
    state = client.app.state  # type: ignore[attr-defined]
    monkeypatch.setattr(state.settings, "poll_recheck_s", 60.0)
    answers: list[dict[str, Any]] = []
    body = {"wait_s": wait_s, "seen_round": seen, "tokens": True}
    waiting = threading.Thread(target=lambda: answers.append(contact(client, tokens.agent, **body)))
    began = time.monotonic()
    waiting.start()
    time.sleep(0.2)
    assert waiting.is_alive(), "held: the node has nothing new yet"
    settings = DriverSettings(
        database_url=database.url, database_schema=database.schema, round_seconds=ROUND_S
    )
    late = RoundDriver(database.engine, settings, leases_changed=state.lease_signal.notify)
    try:
        late.step(now() + 1.0)  # the next boundary: every held poll is woken
    finally:
        late.close()
    waiting.join(timeout=10.0)
    assert not waiting.is_alive()
    (answer,) = answers
    return answer, time.monotonic() - began


def test_a_long_poll_is_held_up_to_wait_s_after_it_arrived_not_after_its_turn(
    client: TestClient, tokens: Tokens, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long poll that waited for its turn (api.admission: one that reports nothing waits
    behind the agents' other requests) is held only for what is left of its ``wait_s``: here
    it arrived 19.7 s before the route read it, so with nothing new it is answered 0.3 s
    later, not 20 s."""
    register(client, tokens.agent)
    with driver_on(database) as (driver, _):
        driver.step(now())
    idle = contact(client, tokens.agent)
    stamped = admission.arrived_at
    monkeypatch.setattr(
        admission, "arrived_at", lambda scope: stamped(scope) - timedelta(seconds=19.7)
    )
    began = time.monotonic()
    held = contact(client, tokens.agent, wait_s=20.0, seen_round=idle["current_round"])
    assert 0.25 <= time.monotonic() - began < 5.0
    assert (held["current_round"], held["leases"]) == (idle["current_round"], [])


def test_a_held_polls_turn_to_read_a_round_out_early_ends_with_its_hold(
    client: TestClient, tokens: Tokens, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round out before it is due wakes every held poll, and each reads it in its turn
    (api.agent.stagger_s); a turn later than the poll's ``wait_s`` is cut to it: the agent's
    timeout allows for ``wait_s``, and an answer it gave up on loses the job tokens it
    minted. Here every turn is 30 s; the poll held for 1 s still answers within its hold,
    with the new round and its lease."""
    register(client, tokens.agent)
    with driver_on(database) as (driver, _):
        driver.step(now())
    seen = contact(client, tokens.agent)["current_round"]
    job = submit(client, tokens.admin)
    monkeypatch.setattr(agent_api, "stagger_s", lambda *_: 30.0)
    answer, took = held_poll_woken_by_a_round(client, tokens, database, monkeypatch, 1.0)
    assert took < 2.5, "answered within its hold, not after its turn"
    assert answer["current_round"] == seen + 1
    assert [lease["job_id"] for lease in answer["leases"]] == [job]
    assert set(answer["tokens"]) == {answer["leases"][0]["attempt_id"]}


def test_a_long_poll_with_news_answers_at_once_and_a_bad_wait_is_refused(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A lease the node does not run yet is news: no wait. ``wait_s`` is bounded."""
    _, attempt = one_lease(client, tokens, database)
    began = time.monotonic()
    answer = contact(client, tokens.agent, wait_s=20.0, seen_round=0)
    assert time.monotonic() - began < 5.0
    assert [lease["attempt_id"] for lease in answer["leases"]] == [attempt]
    too_long = client.post("/v1/agent/poll", json={"wait_s": 31}, headers=bearer(tokens.agent))
    assert "wait_s" in str(assert_problem(too_long, 422))


def test_a_long_poll_with_no_driver_in_its_process_rereads_the_leases_on_a_timer(
    client: TestClient, tokens: Tokens, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The distributed service: the driver runs elsewhere and wakes nobody; a held poll reads
    its leases again every ``poll_recheck_s`` and answers once the new round is there."""
    register(client, tokens.agent)
    with driver_on(database) as (driver, _):
        driver.step(now())
    seen = contact(client, tokens.agent)["current_round"]
    submit(client, tokens.admin)
    monkeypatch.setattr(client.app.state.settings, "poll_recheck_s", 0.05)  # type: ignore[attr-defined]
    answers: list[dict[str, Any]] = []
    body = {"wait_s": 20.0, "seen_round": seen, "tokens": True}
    waiting = threading.Thread(target=lambda: answers.append(contact(client, tokens.agent, **body)))
    began = time.monotonic()
    waiting.start()
    time.sleep(0.2)
    with driver_on(database) as (driver, _):  # notifies nobody
        driver.step(now() + 1.0)
    waiting.join(timeout=10.0)
    assert not waiting.is_alive() and time.monotonic() - began < 5.0
    assert answers[0]["current_round"] == seen + 1 and len(answers[0]["leases"]) == 1


def test_a_node_gets_leases_only_once_approved_and_never_for_more_gpus_than_approved(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A rogue agent token cannot attract jobs with made-up GPUs: its node, unapproved, gets
    no lease however many GPUs it reports; approved for 2, it is refused when it reports
    more (409, naming the field) or another GPU type, and leased within what was approved."""
    rogue = agent_token(database, "node-rogue", approved=None)
    register(client, rogue, gpus=1024)
    jobs = [submit(client, tokens.user_a) for _ in range(3)]
    with driver_on(database, round_s=LONG_ROUND_S) as (driver, _):
        driver.step(now())
    assert leases(database) == [], "an unapproved node gets no lease"

    approved = client.put(
        "/v1/nodes/node-rogue/approval", json={"gpus": 2}, headers=bearer(tokens.admin)
    )
    assert approved.status_code == 200, approved.json()
    assert (approved.json()["node"], approved.json()["gpus"]) == ("node-rogue", 2)
    more = client.post(
        "/v1/agent/register", json={"gpus": 1024, "hostname": "h"}, headers=bearer(rogue)
    )
    assert_problem(more, 409, field="gpus")
    typed = client.put(
        "/v1/nodes/node-rogue/approval",
        json={"gpus": 2, "gpu_type": "A100"},
        headers=bearer(tokens.admin),
    )
    assert typed.status_code == 200
    other_type = client.post(
        "/v1/agent/register",
        json={"gpus": 2, "gpu_type": "H100", "hostname": "h"},
        headers=bearer(rogue),
    )
    assert_problem(other_type, 409, field="gpu_type")
    for token in (tokens.user_a, rogue):
        refused = client.put(
            "/v1/nodes/node-rogue/approval", json={"gpus": 8}, headers=bearer(token)
        )
        assert_problem(refused, 403)

    register(client, rogue, gpus=2)
    with driver_on(database, round_s=LONG_ROUND_S) as (driver, _):
        driver.step(now())
    leased = leases(database)
    assert sorted(lease.job_id for lease in leased) != [] and len(leased) == 2
    assert {lease.job_id for lease in leased} < set(jobs)
    assert {lease.node_id for lease in leased} == {"node-rogue"}


def test_one_job_token_per_attempt_and_none_after_the_attempt_ends(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Polls with ``tokens: true`` mint one token per attempt, not one per poll; asking the
    token endpoint replaces it (the old one is revoked); once the attempt has ended and its
    job FAILED the token reads nothing (401), and its process is told to stop (409 fenced)."""
    job, attempt = one_lease(client, tokens, database)
    minted = []
    for _ in range(5):
        answer = client.post("/v1/agent/poll", json={"tokens": True}, headers=bearer(tokens.agent))
        assert answer.status_code == 200, answer.json()
        minted.append(answer.json()["tokens"])
    assert set(minted[0]) == {attempt} and minted[1:] == [{}] * 4
    first = minted[0][attempt]
    assert client.get(f"/v1/jobs/{job}", headers=bearer(first)).status_code == 200

    second = attempt_token(client, tokens, attempt)
    time.sleep(1.1)  # past the process's cache of attempt tokens (api.auth)
    assert_problem(client.get(f"/v1/jobs/{job}", headers=bearer(first)), 401)
    with Session(database.engine) as session:
        live = session.exec(
            select(TokenRow).where(
                TokenRow.attempt_id == attempt, col(TokenRow.revoked_at).is_(None)
            )
        ).all()
    assert len(live) == 1

    read = client.get(f"/v1/jobs/{job}", headers=bearer(second))
    assert read.status_code == 200 and "env" in read.json()
    report(client, tokens.agent, attempt, "started")
    report(client, tokens.agent, attempt, "exited", 1)
    assert job_state(database, job) == "FAILED"
    time.sleep(1.1)
    gone = assert_problem(client.get(f"/v1/jobs/{job}", headers=bearer(second)), 401)
    assert "ended" in gone["detail"]
    assert_fenced(post_progress(client, second, job, 1), attempt)
