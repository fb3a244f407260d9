"""/v1/jobs on Postgres and SQLite: submit, validate, get, list (pages and filters), cancel."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from store.paging import page_token
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import TENANT_A, TENANT_B, Tokens
from tests.integration.openapi_requests import call, operations

HUGE = 2**40


def submit(client: TestClient, token: str, **overrides: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(token))
    assert response.status_code == 201, response.json()
    body: dict[str, Any] = response.json()
    return body


def test_submit_answers_201_with_location_and_the_stored_job(
    client: TestClient, tokens: Tokens
) -> None:
    sent = job_body(
        name="bert-large",
        gpus=2,
        mode="custom",
        initial_batch_size=16,
        batch_sizes=[16, 32, 64],
        throughput={"16": 100.0, "32": 180.0},
        budget=2.5,
        model="bert",
    )
    response = client.post("/v1/jobs", json=sent, headers=bearer(tokens.user_a))

    assert response.status_code == 201
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["tenant"] == TENANT_A
    assert job["state"] == "PENDING"
    for key in ("name", "gpus", "epochs", "samples_per_epoch", "mode", "batch_sizes", "budget"):
        assert job[key] == sent[key], key
    assert job["throughput"] == {"16": 100.0, "32": 180.0}
    assert job["batch_size"] == 16
    assert job["epochs_done"] == 0.0

    fetched = client.get(response.headers["location"], headers=bearer(tokens.user_a))
    assert fetched.status_code == 200
    assert fetched.json() == job


@pytest.mark.parametrize("gpus", [16, 32, 64])
def test_a_gang_wider_than_a_node_is_accepted(
    client: TestClient, tokens: Tokens, gpus: int
) -> None:
    response = client.post("/v1/jobs", json=job_body(gpus=gpus), headers=bearer(tokens.user_a))

    assert response.status_code == 201, response.text
    assert response.json()["gpus"] == gpus
    fetched = client.get(response.headers["location"], headers=bearer(tokens.user_a))
    assert fetched.json()["gpus"] == gpus


INVALID_SUBMISSIONS = [
    pytest.param({"gpus": 3}, "gpus", id="gpus=3"),
    pytest.param({"gpus": 48}, "gpus", id="gpus=48"),
    pytest.param({"gpus": 2048}, "gpus", id="gpus=2048"),
    pytest.param({"epochs": 0}, "epochs", id="epochs=0"),
    pytest.param({"mode": "elastic"}, "mode", id="unknown-mode"),
    pytest.param({"budget": -1.0}, "budget", id="negative-budget"),
    pytest.param({"mode": "custom"}, "batch_sizes", id="custom-without-batch-sizes"),
    pytest.param({"priority": 7}, "priority", id="unknown-field"),
    pytest.param({"gpus": HUGE}, "gpus", id="huge-gpus"),
    pytest.param({"epochs": HUGE}, "epochs", id="huge-epochs"),
    pytest.param({"samples_per_epoch": HUGE}, "samples_per_epoch", id="huge-samples"),
    pytest.param({"initial_batch_size": HUGE}, "initial_batch_size", id="huge-batch-size"),
    pytest.param({"batch_sizes": [32, HUGE]}, "batch_sizes.1", id="huge-ladder-entry"),
    pytest.param({"budget": 1e300}, "budget", id="huge-budget"),
    pytest.param({"name": ""}, "name", id="empty-name"),
    pytest.param({"name": "x" * 129}, "name", id="long-name"),
    pytest.param({"gpus": "two"}, "gpus", id="string-gpus"),
    pytest.param(
        {"gpus": 4, "elastic": {"min_gpus": 1, "max_gpus": 2}},
        "elastic.max_gpus",
        id="elastic-below-request",
    ),
    pytest.param({"elastic": {"min_gpus": 3, "max_gpus": 8}}, "elastic.min_gpus", id="elastic-3"),
    pytest.param(
        {"elastic": {"min_gpus": 1, "max_gpus": 8, "speedup": {"2": {"32": -1.0}}}},
        "elastic.speedup[2][32]",
        id="elastic-negative-speedup",
    ),
]


@pytest.mark.parametrize(("overrides", "field"), INVALID_SUBMISSIONS)
def test_invalid_submission_is_a_422_problem_naming_the_field(
    client: TestClient, tokens: Tokens, overrides: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(tokens.user_a))

    assert_problem(response, 422, field=field, path="/v1/jobs")
    listed = client.get("/v1/jobs", headers=bearer(tokens.admin)).json()
    assert listed["items"] == [], "a refused submission must not be written"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"gpus": 1, "epochs": 1, "samples_per_epoch": 1', id="truncated-json"),
        pytest.param(b"[1, 2, 3]", id="array-body"),
        pytest.param(b"", id="empty-body"),
        pytest.param(
            b'{"gpus": 1, "epochs": 1, "samples_per_epoch": 10, "initial_batch_size": 8, '
            b'"budget": NaN}',
            id="nan-budget",
        ),
        pytest.param(
            b'{"gpus": 1, "epochs": 1, "samples_per_epoch": 10, "initial_batch_size": 8, '
            b'"budget": 1e999}',
            id="infinite-budget",
        ),
        pytest.param(
            b'{"gpus": 1, "epochs": 1, "samples_per_epoch": 10, "initial_batch_size": 8, '
            b'"throughput": {"1099511627776": 5.0}}',
            id="huge-throughput-key",
        ),
        pytest.param(
            b'{"gpus": 1, "epochs": 1, "samples_per_epoch": 10, "initial_batch_size": 8, '
            b'"epochs": 123456789012345678901234567890}',
            id="bigger-than-int64",
        ),
    ],
)
def test_malformed_body_is_a_422_problem_never_a_500(
    client: TestClient, tokens: Tokens, raw: bytes
) -> None:
    response = client.post(
        "/v1/jobs",
        content=raw,
        headers={**bearer(tokens.user_a), "Content-Type": "application/json"},
    )

    assert_problem(response, 422, path="/v1/jobs")


def test_get_unknown_job_is_a_404_problem(client: TestClient, tokens: Tokens) -> None:
    response = client.get("/v1/jobs/no-such-job", headers=bearer(tokens.admin))

    assert_problem(response, 404, path="/v1/jobs/no-such-job")


def test_cancel_moves_the_job_to_cancelled_once_then_409(
    client: TestClient, tokens: Tokens
) -> None:
    job = submit(client, tokens.user_a)
    path = f"/v1/jobs/{job['id']}/cancel"

    first = client.post(path, headers=bearer(tokens.user_a))
    assert first.status_code == 200
    assert first.json()["state"] == "CANCELLED"
    assert first.json()["updated_at"] >= job["updated_at"]
    stored = client.get(f"/v1/jobs/{job['id']}", headers=bearer(tokens.user_a)).json()
    assert stored["state"] == "CANCELLED"

    second = client.post(path, headers=bearer(tokens.user_a))
    assert_problem(second, 409, path=path)
    assert client.get(f"/v1/jobs/{job['id']}", headers=bearer(tokens.user_a)).json() == stored


def test_cancel_unknown_job_is_a_404_problem(client: TestClient, tokens: Tokens) -> None:
    response = client.post("/v1/jobs/nope/cancel", headers=bearer(tokens.user_a))

    assert_problem(response, 404, path="/v1/jobs/nope/cancel")


def test_pages_of_three_return_seven_jobs_exactly_once_in_order(
    client: TestClient, tokens: Tokens
) -> None:
    submitted = [submit(client, tokens.user_a, name=f"job-{i}")["id"] for i in range(7)]

    seen: list[str] = []
    sizes: list[int] = []
    token: str | None = None
    for _ in range(10):
        params: dict[str, Any] = {"page_size": 3}
        if token is not None:
            params["page_token"] = token
        page = client.get("/v1/jobs", params=params, headers=bearer(tokens.user_a))
        assert page.status_code == 200
        items = page.json()["items"]
        seen.extend(item["id"] for item in items)
        sizes.append(len(items))
        token = page.json()["next_page_token"]
        if token is None:
            break

    assert sizes == [3, 3, 1]
    assert seen == submitted


def test_malformed_page_token_is_a_422_problem(client: TestClient, tokens: Tokens) -> None:
    response = client.get(
        "/v1/jobs", params={"page_token": "not-a-token"}, headers=bearer(tokens.user_a)
    )

    assert_problem(response, 422, field="page_token", path="/v1/jobs")


@pytest.mark.parametrize("page_size", [0, 501, HUGE, -1])
def test_out_of_range_page_size_is_a_422_problem(
    client: TestClient, tokens: Tokens, page_size: int
) -> None:
    response = client.get("/v1/jobs", params={"page_size": page_size}, headers=bearer(tokens.admin))

    assert_problem(response, 422, field="page_size", path="/v1/jobs")


def _ids(client: TestClient, token: str, **params: Any) -> set[str]:
    response = client.get("/v1/jobs", params=params, headers=bearer(token))
    assert response.status_code == 200, response.json()
    return {item["id"] for item in response.json()["items"]}


def test_filters_by_state_name_and_tenant(client: TestClient, tokens: Tokens) -> None:
    a_train = submit(client, tokens.user_a, name="train")["id"]
    a_eval = submit(client, tokens.user_a, name="eval")["id"]
    b_train = submit(client, tokens.user_b, name="train")["id"]
    cancelled = client.post(f"/v1/jobs/{a_eval}/cancel", headers=bearer(tokens.user_a))
    assert cancelled.status_code == 200

    assert _ids(client, tokens.admin) == {a_train, a_eval, b_train}
    assert _ids(client, tokens.admin, state="CANCELLED") == {a_eval}
    assert _ids(client, tokens.admin, state="PENDING") == {a_train, b_train}
    assert _ids(client, tokens.admin, name="train") == {a_train, b_train}
    assert _ids(client, tokens.admin, tenant=TENANT_B) == {b_train}
    assert _ids(client, tokens.admin, tenant=TENANT_A, name="train") == {a_train}
    assert _ids(client, tokens.user_a, state="PENDING") == {a_train}
    assert _ids(client, tokens.user_a, tenant=TENANT_A) == {a_train, a_eval}
    assert _ids(client, tokens.admin, name="nothing-by-this-name") == set()


def test_unknown_state_filter_is_a_422_problem(client: TestClient, tokens: Tokens) -> None:
    response = client.get("/v1/jobs", params={"state": "SLEEPING"}, headers=bearer(tokens.admin))

    assert_problem(response, 422, field="state", path="/v1/jobs")


def test_oversized_body_is_a_413_problem(client: TestClient, tokens: Tokens) -> None:
    body = job_body(model="m" * 2_000_000)
    response = client.post("/v1/jobs", json=body, headers=bearer(tokens.user_a))

    assert_problem(response, 413, path="/v1/jobs")


def _page_token_naming(job_id: str) -> str:
    return page_token("job", json.dumps(["2026-01-01T00:00:00+00:00", job_id]))


@pytest.mark.parametrize(
    ("method", "path", "params", "body"),
    [
        pytest.param("POST", "/v1/jobs", None, job_body(model="re\x00snet"), id="body-model"),
        pytest.param("GET", "/v1/jobs", {"name": "a\x00b"}, None, id="query-name"),
        pytest.param("GET", "/v1/jobs", {"tenant": "a\x00b"}, None, id="query-tenant"),
        pytest.param(
            "GET", "/v1/jobs", {"page_token": _page_token_naming("a\x00b")}, None, id="page-token"
        ),
    ],
)
def test_nul_bytes_in_input_are_never_a_500(
    client: TestClient,
    tokens: Tokens,
    method: str,
    path: str,
    params: dict[str, str] | None,
    body: dict[str, Any] | None,
) -> None:
    """Postgres refuses NUL in text where SQLite stores it; either way the answer is a success or
    a 4xx problem, never a 500 (SPEC section 7)."""
    response = client.request(method, path, params=params, json=body, headers=bearer(tokens.admin))

    assert response.status_code < 500, response.json()
    if response.status_code >= 400:
        assert_problem(response, response.status_code)


def test_event_id_beyond_the_column_range_is_not_a_500(client: TestClient, tokens: Tokens) -> None:
    """job_events.id is int4 on Postgres: a larger id is no event (404) or out of range (422)."""
    job = submit(client, tokens.user_a)
    for event_id in (2**31, 2**63 - 1, 2**64):
        path = f"/v1/jobs/{job['id']}/events/{event_id}"
        response = client.get(path, headers=bearer(tokens.user_a))

        assert response.status_code in (404, 422), (event_id, response.json())
        assert_problem(response, response.status_code, path=path)


HOSTILE_JOB_IDS = {
    "nul": "a%00b",
    "overlong": "j" * 5000,
    "quote": "x'%3B%20DROP%20TABLE%20jobs%3B--",
    "encoded-slash": "..%2F..%2Fhealthz",
    "non-ascii": "%E2%98%83",
}


def test_hostile_job_ids_on_every_job_route_are_never_a_500(
    client: TestClient, app: FastAPI, tokens: Tokens
) -> None:
    """Generated from ``app.openapi()``: every route with a ``{job_id}``, called by an admin with
    job ids that databases or routers may choke on, answers a 4xx problem."""
    job_routes = [op for op in operations(app) if "{job_id}" in op.template]
    failures = []
    for operation in job_routes:
        for name, job_id in HOSTILE_JOB_IDS.items():
            response = call(client, app, operation, {"job_id": job_id}, bearer(tokens.admin))
            if not 400 <= response.status_code < 500:
                failures.append(f"{operation.label} job_id={name}: {response.status_code}")
            else:
                assert_problem(response, response.status_code)

    assert not failures, failures
    assert len(job_routes) >= 2
