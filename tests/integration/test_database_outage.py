"""A database the API cannot reach answers 503 with Retry-After (a transient outage, retried by
well-behaved clients), not 500 (a bug): here a real Postgres URL whose port refuses
connections, as during a restart of the server."""

from __future__ import annotations

import socket

from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.integration.api_calls import assert_problem, bearer, job_body


def closed_port() -> int:
    """A localhost port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_database_is_503_with_retry_after() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/test"
    app = create_app(Settings(database_url=url))
    token = "swk_" + "a" * 40
    with TestClient(app, raise_server_exceptions=False) as client:
        listed = client.get("/v1/jobs", headers=bearer(token))
        submitted = client.post("/v1/jobs", json=job_body(), headers=bearer(token))
        ready = client.get("/readyz")
    for answer in (listed, submitted):
        assert_problem(answer, 503)
        assert answer.headers["retry-after"] == "2"
        assert "could not be reached" in answer.json()["detail"]
    assert ready.status_code == 503
