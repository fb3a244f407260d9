"""Property-based checks of every operation in the API's own OpenAPI document (Schemathesis).

For each operation Schemathesis generates requests that fit the schema (positive) and, where
the operation's input can be broken, requests that break it (negative). Every answer must not
be a server error, must match the response schema the API declares, and, when it is a 4xx or
5xx, must be a problem document. The API runs in open mode (no tokens) on SQLite and on
Postgres (which refuses values SQLite stores: NUL in text, integers beyond its column types).
A ``job_id`` path parameter names a fresh real job most of the time, so the routes get past
their 404s. POST /v1/jobs and event posts get the most cases (on Postgres; fewer on SQLite,
see ``HEAVY_EXAMPLES_SQLITE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from api.app import create_app
from api.settings import Settings
from tests.integration.api_calls import PROBLEM_MEMBERS, PROBLEM_TYPE, job_body
from tests.integration.conftest import Database, build_app

HEAVY = {("POST", "/v1/jobs"), ("POST", "/v1/jobs/{job_id}/events")}
HEAVY_EXAMPLES = 200
HEAVY_EXAMPLES_SQLITE = 60
"""The heavy operations on SQLite: the same requests as on Postgres (generation does not depend
on the database, nor does the API's validation), stored by the laxer database (Postgres also
refuses NUL in text and integers beyond its column types, where SQLite stores them). The full
count ran on both (50 s of the module's 178 s under a parallel run); a third of it on SQLite
still sends every part of the bodies malformed and well-formed."""
LIGHT_EXAMPLES = 25
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
STREAM = "/v1/events"


def _breakable(parameter: dict[str, Any]) -> bool:
    """Whether a request can break this parameter's schema. A string path parameter cannot be
    broken through a URL (whatever is sent arrives as a string), so negative generation finds
    nothing to send; test_jobs_api sends such routes NUL bytes and overlong ids instead."""
    return parameter.get("in") != "path" or parameter.get("schema", {}).get("type") != "string"


def _operations() -> list[tuple[str, str, bool]]:
    """(method, path, breakable input) of every operation the app declares, read from the app."""
    document = create_app(Settings(database_url="sqlite://")).openapi()
    found = []
    for path, item in document["paths"].items():
        for method in METHODS:
            spec = item.get(method.lower())
            if spec is not None:
                parameters = spec.get("parameters", [])
                breakable = "requestBody" in spec or any(map(_breakable, parameters))
                found.append((method, path, breakable))
    return found


OPERATIONS = _operations()
CASES = [
    pytest.param(method, path, mode, id=f"{mode.value}-{method} {path}")
    for method, path, breakable in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or breakable
]


@schemathesis.check
def problem_details(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx and 5xx is an RFC 9457 problem with its five members (SPEC section 5)."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert content_type.startswith(PROBLEM_TYPE), (response.status_code, content_type)
    body = response.json()
    missing = [member for member in PROBLEM_MEMBERS if member not in body]
    assert not missing, f"{response.status_code} problem lacks {missing}: {body}"
    assert body["status"] == response.status_code, body
    return True


@dataclass(frozen=True)
class FuzzTarget:
    app: FastAPI
    schema: Any


@pytest.fixture(scope="module")
def target(database: Database) -> FuzzTarget:
    database.empty()
    app = build_app(database, open_mode=True)
    return FuzzTarget(app=app, schema=schemathesis.openapi.from_asgi("/openapi.json", app))


@pytest.fixture
def job_ids(target: FuzzTarget) -> list[str]:
    """Fresh PENDING jobs for each operation (an earlier one may have cancelled others)."""
    with TestClient(target.app) as client:
        jobs = [client.post("/v1/jobs", json=job_body(name=f"seed-{i}")) for i in range(3)]
    assert all(job.status_code == 201 for job in jobs), [job.text for job in jobs]
    return [job.json()["id"] for job in jobs]


def test_the_heavily_fuzzed_operations_exist() -> None:
    """A renamed submit or events route must not quietly drop out of the heavy set."""
    declared = {(method, path) for method, path, _ in OPERATIONS}
    assert declared >= HEAVY, sorted(HEAVY - declared)


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_operation_answers_without_server_errors_and_as_declared(
    database: Database,
    target: FuzzTarget,
    job_ids: list[str],
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    operation = target.schema[path][method]
    heavy = HEAVY_EXAMPLES if database.kind == "postgres" else HEAVY_EXAMPLES_SQLITE
    examples = heavy if (method, path) in HEAVY else LIGHT_EXAMPLES
    statuses: list[int] = []
    real_job = st.sampled_from([None, *job_ids]) if "{job_id}" in path else st.none()

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(case=operation.as_strategy(generation_mode=mode), job_id=real_job)
    def answers_as_declared(case: Any, job_id: str | None) -> None:
        if job_id is not None and isinstance(case.path_parameters, dict):
            case.path_parameters["job_id"] = job_id
        if path == STREAM:  # a followed stream never ends: read what is stored, then stop
            case.query = {**(case.query or {}), "follow": "false"}
        response = case.call()
        case.validate_response(
            response,
            checks=[not_a_server_error, response_schema_conformance, problem_details],
        )
        statuses.append(response.status_code)

    answers_as_declared()

    assert statuses, f"no case was generated for {method} {path}"
    if (method, path) in HEAVY:
        assert len(statuses) >= heavy, len(statuses)
