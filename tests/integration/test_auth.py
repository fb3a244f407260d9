"""Bearer tokens, roles and tenant isolation, on Postgres and SQLite.

The per-route checks are generated from ``app.openapi()``: a route added later is checked
without anyone remembering to list it here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import TENANT_A, TENANT_B, Database, Tokens
from tests.integration.openapi_requests import call, operations


def submit(client: TestClient, token: str, **overrides: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(token))
    assert response.status_code == 201, response.json()
    job: dict[str, Any] = response.json()
    return job


def test_every_v1_operation_refuses_a_request_without_token(
    client: TestClient, app: FastAPI
) -> None:
    checked, failures = [], []
    for operation in operations(app):
        if not operation.template.startswith("/v1/"):
            continue
        response = call(client, app, operation, {}, {})
        checked.append(operation.label)
        if response.status_code != 401:
            failures.append(f"{operation.label}: {response.status_code}")
            continue
        assert_problem(response, 401)
        assert response.headers.get("www-authenticate") == "Bearer", operation.label

    assert not failures, failures
    assert "POST /v1/jobs" in checked and "GET /v1/jobs/{job_id}" in checked, checked


def test_unknown_or_malformed_credentials_are_a_401_problem(client: TestClient) -> None:
    for headers in (
        bearer("swk_not-a-real-token"),
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer "},
    ):
        response = client.get("/v1/jobs", headers=headers)
        assert_problem(response, 401, path="/v1/jobs")
        assert response.headers.get("www-authenticate") == "Bearer"


def _event_id_of(database: Database, job_id: str) -> int:
    with database.engine.connect() as connection:
        found = connection.execute(
            text("SELECT min(id) FROM job_events WHERE job_id = :job"), {"job": job_id}
        ).scalar_one()
    assert found is not None, f"job {job_id} has no event"
    return int(found)


def _observed(client: TestClient, tokens: Tokens, job_id: str, database: Database) -> Any:
    job = client.get(f"/v1/jobs/{job_id}", headers=bearer(tokens.admin)).json()
    with database.engine.connect() as connection:
        events = connection.execute(
            text("SELECT count(*) FROM job_events WHERE job_id = :job"), {"job": job_id}
        ).scalar_one()
    return job, events


def test_a_user_gets_404_on_every_job_route_of_another_tenant(
    client: TestClient, app: FastAPI, database: Database, tokens: Tokens
) -> None:
    job_b = submit(client, tokens.user_b)["id"]
    values = {"job_id": job_b, "event_id": _event_id_of(database, job_b)}
    job_routes = [op for op in operations(app) if "{job_id}" in op.template]
    before = _observed(client, tokens, job_b, database)

    leaks = []
    for operation in job_routes:
        response = call(client, app, operation, values, bearer(tokens.user_a))
        missing = call(
            client, app, operation, {**values, "job_id": "no-such-job"}, bearer(tokens.user_a)
        )
        if response.status_code != 404:
            leaks.append(f"{operation.label}: {response.status_code} {response.text[:200]}")
            continue
        assert_problem(response, 404)
        assert missing.status_code == 404, operation.label
        assert response.json()["title"] == missing.json()["title"], operation.label
    assert not leaks, leaks
    assert _observed(client, tokens, job_b, database) == before, "a refused call wrote something"

    for operation in job_routes:
        owner = call(client, app, operation, values, bearer(tokens.user_b))
        assert owner.status_code not in (401, 403, 404, 422), (
            f"the owner's identical call to {operation.label} failed, so the check above "
            f"proved nothing: {owner.status_code} {owner.text[:300]}"
        )
    assert {"GET /v1/jobs/{job_id}", "POST /v1/jobs/{job_id}/cancel"} <= {
        op.label for op in job_routes
    }


def test_a_user_lists_only_its_own_tenants_jobs(client: TestClient, tokens: Tokens) -> None:
    own = {submit(client, tokens.user_a, name=f"a-{i}")["id"] for i in range(2)}
    other = submit(client, tokens.user_b, name="b-0")["id"]

    listed = client.get("/v1/jobs", headers=bearer(tokens.user_a)).json()
    assert {item["id"] for item in listed["items"]} == own
    assert {item["tenant"] for item in listed["items"]} == {TENANT_A}
    asked_for_b = client.get("/v1/jobs", params={"tenant": TENANT_B}, headers=bearer(tokens.user_a))
    assert asked_for_b.status_code == 200
    assert asked_for_b.json()["items"] == []
    assert other not in {item["id"] for item in asked_for_b.json()["items"]}


def test_a_user_cannot_submit_into_another_tenant(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    response = client.post(
        "/v1/jobs", json=job_body(tenant=TENANT_B), headers=bearer(tokens.user_a)
    )

    assert_problem(response, 403, field="tenant", path="/v1/jobs")
    own_tenant = client.post(
        "/v1/jobs", json=job_body(tenant=TENANT_A), headers=bearer(tokens.user_a)
    )
    assert own_tenant.status_code == 201
    assert own_tenant.json()["tenant"] == TENANT_A
    everyone = client.get("/v1/jobs", headers=bearer(tokens.admin)).json()["items"]
    assert [job["tenant"] for job in everyone] == [TENANT_A]


def test_agents_and_job_tokens_cannot_submit_jobs(client: TestClient, tokens: Tokens) -> None:
    job = submit(client, tokens.user_a)["id"]

    for token in (tokens.agent, tokens.job(job)):
        response = client.post("/v1/jobs", json=job_body(), headers=bearer(token))
        assert_problem(response, 403, path="/v1/jobs")
    everyone = client.get("/v1/jobs", headers=bearer(tokens.admin)).json()["items"]
    assert [item["id"] for item in everyone] == [job]


def test_an_admin_sees_and_cancels_every_tenants_jobs(client: TestClient, tokens: Tokens) -> None:
    a = submit(client, tokens.user_a)["id"]
    b = submit(client, tokens.user_b)["id"]
    by_admin = submit(client, tokens.admin, tenant="research")

    listed = client.get("/v1/jobs", headers=bearer(tokens.admin)).json()["items"]
    assert {item["id"] for item in listed} == {a, b, by_admin["id"]}
    assert by_admin["tenant"] == "research"
    assert client.get(f"/v1/jobs/{b}", headers=bearer(tokens.admin)).json()["tenant"] == TENANT_B
    cancelled = client.post(f"/v1/jobs/{a}/cancel", headers=bearer(tokens.admin))
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "CANCELLED"


def test_a_job_token_sees_only_its_job(client: TestClient, tokens: Tokens) -> None:
    mine = submit(client, tokens.user_a)["id"]
    sibling = submit(client, tokens.user_a)["id"]
    token = tokens.job(mine)

    assert client.get(f"/v1/jobs/{mine}", headers=bearer(token)).status_code == 200
    assert_problem(client.get(f"/v1/jobs/{sibling}", headers=bearer(token)), 404)
    listed = client.get("/v1/jobs", headers=bearer(token)).json()["items"]
    assert [item["id"] for item in listed] == [mine]


def test_tokens_are_stored_only_as_hashes(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    plain = [tokens.admin, tokens.user_a, tokens.user_b, tokens.agent]
    with database.engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(text("SELECT * FROM tokens"))]

    assert len(rows) == len(plain)
    stored = " ".join(str(value) for row in rows for value in row.values())
    for token in plain:
        assert token not in stored
        assert token.removeprefix("swk_") not in stored
    assert {row["token_hash"] for row in rows} == {
        hashlib.sha256(token.encode()).hexdigest() for token in plain
    }
    assert client.get("/v1/jobs", headers=bearer(rows[0]["token_hash"])).status_code == 401
