"""Admission control (api.admission, api.app): requests in progress and worker threads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio.to_thread
from fastapi.testclient import TestClient

from api.admission import InFlightLimit
from api.app import create_app
from api.settings import Settings


def test_the_app_bounds_requests_by_twice_its_worker_threads_and_sets_the_threads(
    tmp_path: Path,
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/a.db", worker_threads=3)
    app = create_app(settings)
    (admission,) = [m for m in app.user_middleware if m.cls == InFlightLimit]  # type: ignore[comparison-overlap]
    assert admission.kwargs == {"limit": 6, "threads": 3, "exempt": ("/v1/events",)}

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
