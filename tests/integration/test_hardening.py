"""Issue 16, the second hardening round: each finding an attacker's probe found, replayed as a
regression test, on Postgres and SQLite (the stale agent's exit report is in
test_agent_api.py, ``test_a_superseded_attempt_cannot_finish_or_requeue_its_job``; the
planner's isolation of a job it cannot model in tests/unit/test_poison_jobs.py)."""

from __future__ import annotations

import json
import select
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlmodel import Session
from sqlmodel import select as sql_select

from api.auth import TOKENS
from solver_service.planning import plan_cluster
from store.cluster_version import DEFAULT_CLUSTER
from store.paging import page_token
from store.principals import Role
from store.tables import JobEventRow, JobRow
from store.tokens import create_token, set_expiry
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import TENANT_A, Database, Tokens
from tests.integration.driving import ROUND_S, driver_on, leases, register
from tests.integration.live_server import serving

POISON = {
    "name": "tiny",
    "gpus": 1,
    "epochs": 1,
    "samples_per_epoch": 2147483647,
    "initial_batch_size": 32,
    "throughput": {"32": 1e-300},
}
"""The submission that stopped the Shockwave planner for everyone (finding 2)."""


# 1. Header limits: in the HTTP server, before the app ---------------------------------------


def _send_head(base: str, head: bytes, total: int) -> bytes:
    """Send ``head`` then filler header bytes up to ``total`` bytes, stopping as soon as the
    server answers; the answer's first bytes (empty if the server said nothing)."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(head)
        sent, chunk = len(head), b"a" * 65536
        try:
            while sent < total:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            return sock.recv(4096)
        except ConnectionResetError:
            return b""


def test_a_50_mb_header_is_refused_with_431_before_the_app(app: FastAPI) -> None:
    with serving(app) as base:
        started = time.perf_counter()
        answer = _send_head(base, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", 50_000_000)
        elapsed = time.perf_counter() - started
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"application/problem+json" in head
        assert json.loads(body)["status"] == 431
        assert elapsed < 5.0, "refused as the head arrives, not after 50 MB"
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200


def test_too_many_headers_are_refused_and_a_large_body_is_not_a_large_head(
    app: FastAPI, tokens: Tokens
) -> None:
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    with serving(app) as base:
        answer = _send_head(base, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n", 0)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        with httpx.Client(base_url=base, headers=bearer(tokens.admin), timeout=10) as http:
            command = ["python"] + ["x" * 4000] * 15  # a 60 kB body, one connection
            for _ in range(3):
                submitted = http.post("/v1/jobs", json=job_body(command=command))
                assert submitted.status_code == 201, submitted.text


# 2. No poison job ----------------------------------------------------------------------------


def test_the_poison_submission_is_refused_naming_the_throughput(
    client: TestClient, tokens: Tokens
) -> None:
    response = client.post("/v1/jobs", json=POISON, headers=bearer(tokens.user_a))

    assert_problem(response, 422, field="throughput[32]", path="/v1/jobs")


def test_planning_goes_on_while_a_poison_job_is_pending(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A poison job stored before the bounds existed is left out of the plan and told why
    (once, however often it is left out); the other jobs are planned."""
    register(client, tokens.agent, gpus=4)
    good = [submit(client, tokens.admin) for _ in "ab"]
    poison = submit(client, tokens.admin)
    with Session(database.engine) as session:
        row = session.get(JobRow, poison)
        assert row is not None
        row.samples_per_epoch, row.throughput = 2147483647, {"32": 1e-300}
        session.add(row)
        session.commit()

        plan = plan_cluster(session, DEFAULT_CLUSTER, None, now=datetime.now(UTC))
        assert plan is not None
        assert sorted(plan.rounds[0]) == sorted(good)
        assert all(poison not in column for column in plan.rounds)

        good.append(submit(client, tokens.admin))
        again = plan_cluster(session, DEFAULT_CLUSTER, None, now=datetime.now(UTC))
        assert again is not None and again.state_version > plan.state_version
        assert sorted(again.rounds[0]) == sorted(good)
        excluded = session.exec(sql_select(JobEventRow).where(JobEventRow.kind == "excluded"))
        reasons = [(event.job_id, event.reason) for event in excluded]

    with driver_on(database) as (driver, _):
        for index in range(3):  # the plan's round, then rounds filled from the waiting jobs
            driver.step(time.time() + index * ROUND_S)
            leased = {lease.job_id for lease in leases(database)}
            assert poison not in leased and len(leased) == 3, "the rounds leave it out too"
    assert [job for job, _ in reasons] == [poison], "told once"
    assert "throughput[32]" in reasons[0][1]
    events = client.get(
        f"/v1/jobs/{poison}/events", params={"kind": "excluded"}, headers=bearer(tokens.admin)
    )
    assert events.status_code == 200 and len(events.json()["items"]) == 1


def submit(client: TestClient, token: str) -> str:
    response = client.post("/v1/jobs", json=job_body(), headers=bearer(token))
    assert response.status_code == 201, response.json()
    return str(response.json()["id"])


# 4. Bounded responses ------------------------------------------------------------------------


def test_a_1_mb_command_is_refused_and_lists_carry_no_heavy_fields(
    client: TestClient, tokens: Tokens
) -> None:
    huge = ["python"] + ["x" * 4000] * 240  # under the body limit, over the command's
    refused = client.post("/v1/jobs", json=job_body(command=huge), headers=bearer(tokens.user_a))
    assert_problem(refused, 422, field="command", path="/v1/jobs")

    command = ["python", "train.py", "--lr", "0.1"]
    sent = job_body(command=command, throughput={"32": 100.0}, image="img:1")
    job = client.post("/v1/jobs", json=sent, headers=bearer(tokens.user_a)).json()
    (listed,) = client.get("/v1/jobs", headers=bearer(tokens.user_a)).json()["items"]
    assert listed["id"] == job["id"] and listed["state"] == "PENDING"
    assert not {"command", "throughput", "batch_sizes", "image"} & set(listed)
    one = client.get(f"/v1/jobs/{job['id']}", headers=bearer(tokens.user_a)).json()
    assert one["command"] == command and one["image"] == "img:1"


# 5. Page tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "created",
    ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2026-01-01T00:00:00"],
    ids=["before-year-1-in-utc", "after-year-9999-in-utc", "no-zone"],
)
def test_an_edited_page_token_is_a_422_problem_not_a_500(
    client: TestClient, tokens: Tokens, created: str
) -> None:
    token = page_token("job", json.dumps([created, "a-job"]))
    response = client.get("/v1/jobs", params={"page_token": token}, headers=bearer(tokens.admin))

    assert_problem(response, 422, field="page_token", path="/v1/jobs")


# 6. Strict types, no control characters ------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpus": "2"}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"epochs": 3.0}, "epochs"),
        ({"budget": "1.0"}, "budget"),
        ({"model": "res\x1b[2Jnet"}, "model"),
        ({"model": "res\x9bnet"}, "model"),
    ],
    ids=["gpus-string", "gpus-bool", "epochs-float", "budget-string", "model-esc", "model-c1"],
)
def test_loose_types_and_control_characters_are_refused(
    client: TestClient, tokens: Tokens, overrides: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(tokens.user_a))

    assert_problem(response, 422, field=field, path="/v1/jobs")


# 7. /metrics needs a metrics (or admin) token ------------------------------------------------


def test_metrics_need_a_metrics_token_which_opens_nothing_else(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    assert_problem(client.get("/metrics"), 401, path="/metrics")
    assert_problem(client.get("/metrics", headers=bearer(tokens.user_a)), 403, path="/metrics")
    with Session(database.engine) as session:
        scraper = create_token(session, Role.METRICS, name="prometheus")

    scraped = client.get("/metrics", headers=bearer(scraper))
    assert scraped.status_code == 200 and "shockwave_jobs" in scraped.text
    assert client.get("/metrics", headers=bearer(tokens.admin)).status_code == 200
    for path in ("/v1/jobs", "/v1/cluster", "/v1/tokens"):
        assert_problem(client.get(path, headers=bearer(scraper)), 403, path=path)


# 8. Token lifecycle --------------------------------------------------------------------------


def test_tokens_are_created_listed_without_secrets_revoked_and_expire(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    admin = bearer(tokens.admin)
    made = client.post(
        "/v1/tokens",
        json={"role": "user", "scope": {"tenant": TENANT_A}, "name": "ci", "expires_in_s": 3600},
        headers=admin,
    )
    assert made.status_code == 201, made.json()
    created = made.json()
    secret, token_id = created["token"], created["id"]
    assert created["state"] == "active" and created["expires_at"] is not None
    assert client.get("/v1/jobs", headers=bearer(secret)).status_code == 200

    listed = client.get("/v1/tokens", headers=admin).json()["items"]
    mine = next(t for t in listed if t["id"] == token_id)
    assert mine["last_used_at"] is not None and mine["name"] == "ci"
    assert secret not in json.dumps(listed) and all("token" not in t for t in listed)

    revoked = client.post(f"/v1/tokens/{token_id}/revoke", headers=admin)
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    TOKENS.clear()  # what the cache's lifetime (10 s) does in every API process
    assert_problem(client.get("/v1/jobs", headers=bearer(secret)), 401, path="/v1/jobs")
    expiry = client.put(f"/v1/tokens/{token_id}/expiry", json={"expires_in_s": 60}, headers=admin)
    assert_problem(expiry, 409)

    with Session(database.engine) as session:
        later = create_token(session, Role.USER, tenant=TENANT_A, name="short")
    assert client.get("/v1/jobs", headers=bearer(later)).status_code == 200
    later_id = max(t["id"] for t in client.get("/v1/tokens", headers=admin).json()["items"])
    with Session(database.engine) as session:
        set_expiry(session, later_id, datetime.now(UTC) - timedelta(seconds=1))
        session.commit()
    TOKENS.clear()
    assert_problem(client.get("/v1/jobs", headers=bearer(later)), 401, path="/v1/jobs")
    states = {t["id"]: t["state"] for t in client.get("/v1/tokens", headers=admin).json()["items"]}
    assert (states[token_id], states[later_id]) == ("revoked", "expired")


def test_only_admins_manage_tokens_and_scopes_are_checked(
    client: TestClient, tokens: Tokens
) -> None:
    body = {"role": "admin"}
    assert_problem(client.post("/v1/tokens", json=body, headers=bearer(tokens.user_a)), 403)
    for sent, field in (
        ({"role": "user"}, "scope.tenant"),
        ({"role": "admin", "scope": {"node": "n1"}}, "scope.node"),
        ({"role": "job", "scope": {"job_id": "0b5c3a4e-0000"}}, "scope.job_id"),
        ({"role": "metrics", "expires_in_s": "60"}, "expires_in_s"),
    ):
        response = client.post("/v1/tokens", json=sent, headers=bearer(tokens.admin))
        assert_problem(response, 422, field=field)


def test_a_jobs_folded_state_stays_bounded(client: TestClient, tokens: Tokens) -> None:
    """A job token cannot grow its job's stored state without bound: progress is measured at
    most at 64 batch sizes."""
    job = client.post("/v1/jobs", json=job_body(epochs=100), headers=bearer(tokens.admin))
    job_id = job.json()["id"]
    token = bearer(tokens.job(job_id))
    for seq in range(1, 66):
        event = {"seq": seq, "kind": "progress", "epoch": 1, "samples": 1, "seconds": 1.0}
        response = client.post(
            f"/v1/jobs/{job_id}/events", json={**event, "batch_size": seq}, headers=token
        )
        if seq <= 64:
            assert response.status_code == 201, response.json()
    assert_problem(response, 422, field="progress.batch_size")
