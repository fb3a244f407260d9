"""Idempotency-Key on POST /v1/jobs: retries replay the first answer, even when they overlap.

Concurrency runs against a real uvicorn server (the TestClient serves one request at a time);
the count of rows in ``jobs`` is the proof that exactly one job was created.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func
from sqlmodel import Session, col, select

from store.tables import JobRow
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import TENANT_A, Database, Tokens
from tests.integration.live_server import serving

CONCURRENT_RETRIES = 50


def jobs_of(database: Database, tenant: str) -> int:
    with Session(database.engine) as session:
        query = select(func.count()).select_from(JobRow).where(col(JobRow.tenant) == tenant)
        return int(session.exec(query).one())


def test_fifty_concurrent_retries_create_one_job(
    app: FastAPI, database: Database, tokens: Tokens
) -> None:
    body = job_body(name="concurrent")
    headers = {**bearer(tokens.user_a), "Idempotency-Key": "submit-once"}
    start = threading.Barrier(CONCURRENT_RETRIES)

    with serving(app) as base_url, httpx.Client(base_url=base_url, timeout=60) as http:

        def post(_: int) -> httpx.Response:
            start.wait(timeout=30)
            return http.post("/v1/jobs", json=body, headers=headers)

        with ThreadPoolExecutor(max_workers=CONCURRENT_RETRIES) as pool:
            answers = list(pool.map(post, range(CONCURRENT_RETRIES)))

    statuses = sorted({answer.status_code for answer in answers})
    assert statuses == [201], [answer.text for answer in answers if answer.status_code != 201]
    ids = {answer.json()["id"] for answer in answers}
    assert len(ids) == 1
    assert {answer.headers["location"] for answer in answers} == {f"/v1/jobs/{ids.pop()}"}
    assert jobs_of(database, TENANT_A) == 1


def test_same_key_same_body_replays_the_first_answer(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    headers = {**bearer(tokens.user_a), "Idempotency-Key": "k-1"}
    first = client.post("/v1/jobs", json=job_body(), headers=headers)
    again = client.post("/v1/jobs", json=job_body(), headers=headers)

    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert jobs_of(database, TENANT_A) == 1


def test_same_key_other_body_is_a_422_and_creates_nothing(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    headers = {**bearer(tokens.user_a), "Idempotency-Key": "k-2"}
    first = client.post("/v1/jobs", json=job_body(epochs=3), headers=headers)
    assert first.status_code == 201

    other = client.post("/v1/jobs", json=job_body(epochs=4), headers=headers)

    assert_problem(other, 422, field="Idempotency-Key", path="/v1/jobs")
    assert jobs_of(database, TENANT_A) == 1


def test_principals_use_the_same_key_independently(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    key = {"Idempotency-Key": "shared-key"}
    a = client.post("/v1/jobs", json=job_body(), headers={**bearer(tokens.user_a), **key})
    b = client.post("/v1/jobs", json=job_body(), headers={**bearer(tokens.user_b), **key})
    admin = client.post("/v1/jobs", json=job_body(), headers={**bearer(tokens.admin), **key})

    assert a.status_code == b.status_code == admin.status_code == 201
    assert len({a.json()["id"], b.json()["id"], admin.json()["id"]}) == 3
    assert a.json()["tenant"] == TENANT_A
    assert b.json()["tenant"] == "tenant-b"


def test_refused_submission_does_not_burn_the_key(
    client: TestClient, database: Database, tokens: Tokens
) -> None:
    headers = {**bearer(tokens.user_a), "Idempotency-Key": "k-3"}
    refused = client.post("/v1/jobs", json=job_body(gpus=3), headers=headers)
    assert_problem(refused, 422, field="gpus")

    fixed = client.post("/v1/jobs", json=job_body(gpus=2), headers=headers)

    assert fixed.status_code == 201, fixed.json()
    assert jobs_of(database, TENANT_A) == 1


def test_overlong_key_is_a_422_problem(client: TestClient, tokens: Tokens) -> None:
    headers = {**bearer(tokens.user_a), "Idempotency-Key": "k" * 256}
    response = client.post("/v1/jobs", json=job_body(), headers=headers)

    assert_problem(response, 422, field="Idempotency-Key", path="/v1/jobs")
