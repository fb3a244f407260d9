"""What one client may hold of an API process, on Postgres and SQLite, against a real uvicorn
server: connections that request large responses and never read them (static files take no
request slot; a response not read within the send timeout is abandoned), requests pipelined
ahead of their answers, event streams per token, and the security headers on every page."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from solver_service import enqueue
from tests.integration.api_calls import assert_problem, bearer
from tests.integration.conftest import Database, Tokens
from tests.integration.driving import submit
from tests.integration.live_server import serving

SWAGGER = "/static/docs/swagger-ui-bundle.js"
PROMPT_S = 1.5
"""How long /healthz and a small list may take while the slow readers hold their sockets."""


def app_with(database: Database, **settings: Any) -> FastAPI:
    """The API on ``database`` (emptied by the ``tokens`` fixture's app) with ``settings``."""
    config = Settings(database_url=database.url, database_schema=database.schema, **settings)
    return create_app(config, engine=database.engine, request_plan=enqueue.request_plan)


@contextmanager
def slow_readers(base: str, path: str, connections: int = 4, pipelined: int = 4) -> Iterator[None]:
    """``connections`` sockets, each sending ``pipelined`` requests for ``path`` at once and
    never reading (a small receive buffer, so the server's sends block at once)."""
    address = urlsplit(base)
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    with ExitStack() as stack:
        for _ in range(connections):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            stack.enter_context(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((address.hostname, address.port))
            sock.sendall(request * pipelined)
        time.sleep(0.5)  # the server has started every first response and is blocked on it
        yield


def timed_get(base: str, path: str, token: str | None = None) -> tuple[int, float]:
    headers = bearer(token) if token else {}
    started = time.perf_counter()
    try:
        response = httpx.get(f"{base}{path}", headers=headers, timeout=PROMPT_S * 2)
    except httpx.TimeoutException:
        return 0, time.perf_counter() - started
    return response.status_code, time.perf_counter() - started


def test_slow_readers_of_the_swagger_bundle_leave_health_and_other_tenants_answered(
    database: Database, tokens: Tokens
) -> None:
    """Four connections each pipelining four requests for the 1.5 MB Swagger bundle, never
    reading: static files take no request slot, so /healthz and another tenant's job list
    answer at once."""
    app = app_with(database)  # the send timeout (10 s) is not what frees them here
    submit_app = TestClient(app)
    submit(submit_app, tokens.user_b)
    with serving(app) as base, slow_readers(base, SWAGGER):
        for path, token in (("/healthz", None), ("/v1/jobs", tokens.user_b)) * 3:
            status, took = timed_get(base, path, token)
            assert status == 200 and took < PROMPT_S, (path, status, took)


def test_a_response_the_client_does_not_read_is_abandoned_after_the_send_timeout(
    database: Database, tokens: Tokens
) -> None:
    """Requests that take a slot (a large API answer) and are never read: after the send
    timeout their connections are closed and the slots come back."""
    app = app_with(database, send_timeout_s=1.0)

    @app.get("/big")
    def big() -> StreamingResponse:
        """8 MB in 64 kB parts: each part waits until the client took the one before (a
        single-part answer goes to the socket's buffer at once and never blocks)."""
        return StreamingResponse(iter([b"x" * 65536] * 128), media_type="text/plain")

    with serving(app) as base, slow_readers(base, "/big", pipelined=1):
        status, took = timed_get(base, "/healthz")
        assert status == 200 and took < 1.0 + PROMPT_S, (status, took)
        status, took = timed_get(base, "/v1/jobs", tokens.user_b)
        assert status == 200 and took < PROMPT_S, (status, took)


def test_a_connection_pipelining_more_than_allowed_is_closed(database: Database) -> None:
    app = app_with(database, max_pipelined=4)
    with serving(app) as base:
        address = urlsplit(base)
        with socket.create_connection((address.hostname, address.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        assert 1 <= received.count(b"HTTP/1.1 200") < 50, received.count(b"HTTP/1.1 200")


def test_event_streams_are_capped_per_token_and_poll_no_faster_than_a_second(
    database: Database, tokens: Tokens
) -> None:
    app = app_with(database, max_streams_per_token=3)
    client = TestClient(app)
    fast = client.get(
        "/v1/events", params={"poll_s": 0.1, "follow": "false"}, headers=bearer(tokens.user_a)
    )
    assert_problem(fast, 422, field="poll_s")
    with serving(app) as base, ExitStack() as stack:
        http = stack.enter_context(httpx.Client(base_url=base, timeout=10))
        opened = [
            stack.enter_context(http.stream("GET", "/v1/events", headers=bearer(tokens.user_a)))
            for _ in range(3)
        ]
        assert [r.status_code for r in opened] == [200, 200, 200]
        refused = http.get("/v1/events", params={"follow": "false"}, headers=bearer(tokens.user_a))
        problem = assert_problem(refused, 429)
        assert "event streams" in problem["detail"] and refused.headers["Retry-After"]
        other = stack.enter_context(http.stream("GET", "/v1/events", headers=bearer(tokens.user_b)))
        assert other.status_code == 200, "the cap is per token"
        opened[0].close()
        deadline = time.monotonic() + 5
        while (
            again := http.get(
                "/v1/events", params={"follow": "false"}, headers=bearer(tokens.user_a)
            )
        ).status_code == 429:
            assert time.monotonic() < deadline, "a closed stream gives its place back"
            time.sleep(0.1)
        assert again.status_code == 200


@pytest.mark.parametrize("path", ["/", "/docs", "/redoc", "/healthz", "/v1/jobs", SWAGGER])
def test_every_response_carries_the_security_headers(
    database: Database, tokens: Tokens, path: str
) -> None:
    client = TestClient(app_with(database))
    response = client.get(path, headers=bearer(tokens.user_a))
    assert response.status_code == 200, response.text
    headers = response.headers
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    policy = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    script = next(d for d in policy.split("; ") if d.startswith("script-src"))
    assert "'unsafe-inline'" not in script and "'unsafe-eval'" not in script
    if path == "/docs":
        assert "'sha256-" in script, "the page's own inline script, by hash"
    elif path != "/redoc":
        assert script == "script-src 'self'"
    refused = client.get("/v1/jobs")
    assert refused.status_code == 401 and refused.headers["x-frame-options"] == "DENY"


def test_the_dashboard_keeps_its_token_for_the_session_only(database: Database) -> None:
    script = TestClient(app_with(database)).get("/static/dashboard/dashboard.js").text
    assert "localStorage" not in script and "sessionStorage.setItem" in script
    assert 'style="' not in script, "no inline style attribute: the policy refuses them"
