"""Admission control (api.admission, api.app): requests in progress and worker threads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio.to_thread
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlmodel import Session

from api.admission import InFlightLimit, close_session
from api.app import STATIC_PAGES, create_app
from api.settings import Settings


def test_the_app_bounds_requests_by_twice_its_worker_threads_and_sets_the_threads(
    tmp_path: Path,
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/a.db", worker_threads=3)
    app = create_app(settings)
    (admission,) = [m for m in app.user_middleware if m.cls == InFlightLimit]  # type: ignore[comparison-overlap]
    bounds = {
        k: admission.kwargs[k]
        for k in ("limit", "threads", "exempt", "exempt_prefixes", "queue_timeout_s")
    }
    assert bounds == {
        "limit": 6,
        "threads": 3,
        "exempt": ("/v1/events", *STATIC_PAGES),
        "exempt_prefixes": ("/static/",),
        "queue_timeout_s": 5.0,
    }
    assert callable(admission.kwargs["on_shed"])

    @app.get("/threads")
    async def threads() -> int:
        return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    with TestClient(app) as client:
        assert client.get("/threads").json() == 3


def test_no_more_requests_than_the_limit_run_at_once() -> None:
    running = 0
    most = 0

    async def app(scope: object, receive: object, send: object) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    limited = InFlightLimit(app, limit=2, threads=1)

    async def main() -> int:
        async def nothing() -> None:
            return None

        scope = {"type": "http"}
        await asyncio.gather(*(limited(scope, nothing, nothing) for _ in range(8)))  # type: ignore[arg-type]
        return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    assert asyncio.run(main()) == 1
    assert most == 2


def test_a_session_holding_locks_closes_while_every_request_thread_is_taken(
    tmp_path: Path,
) -> None:
    """A route that fails inside its transaction (a 409 under a job's row lock) leaves its
    locks to the session's close; the requests waiting on those locks may hold every request
    thread. The close must not wait for one of them (the distributed replay hung so)."""
    engine = create_engine(f"sqlite:///{tmp_path}/a.db")
    limiter = anyio.to_thread.current_default_thread_limiter

    async def main() -> bool:
        limiter().total_tokens = 1
        holder = object()
        await limiter().acquire_on_behalf_of(holder)  # the only request thread, blocked
        session = Session(engine)
        session.execute(text("SELECT 1"))
        assert session.in_transaction()
        try:
            with anyio.fail_after(5):
                await close_session(session)
        finally:
            limiter().release_on_behalf_of(holder)
        return session.in_transaction()

    assert asyncio.run(main()) is False
    engine.dispose()
