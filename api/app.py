"""The application factory: build the FastAPI app for given settings (no work at import)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Request
from sqlalchemy.engine import Engine
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import errors
from api.admission import InFlightLimit, pool_capacity
from api.db import make_engine
from api.observability import ApiMetrics, HttpMetricsMiddleware
from api.ratelimit import RateLimiter
from api.routes import agent, cluster, events, health, jobs, metrics, prediction
from api.settings import Settings

LIMITED: dict[int | str, dict[str, Any]] = errors.openapi_problems(
    (413, "Request body too large"),
    (429, "Too many requests from this token (or address); Retry-After says when to retry"),
)
"""Answers every /v1 operation may give, whatever the route."""


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """The API for ``settings`` (default: from the environment), on ``engine`` if given."""
    settings = settings or Settings()
    app = FastAPI(
        title="Shockwave",
        version="0.1.0",
        description=(
            "Scheduling service for shared GPU clusters training models whose batch size changes "
            "(NSDI'23 Shockwave). Errors are RFC 9457 problem details."
        ),
    )
    app.state.settings = settings
    app.state.engine = engine or make_engine(settings.database_url, settings.database_schema)
    app.state.rate_limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
    errors.install(app)
    # Requests in progress: no more than the pool has connections (api.admission), and twice
    # the worker threads: a thread done with one request finds the next one admitted, and few
    # wait half-done on the event loop (docs/reliability.md, "Load": p99 166 ms with 10 in
    # progress on 2 threads, 97 ms with 4).
    limit = min(pool_capacity(app.state.engine), 2 * settings.worker_threads)
    app.add_middleware(InFlightLimit, limit=limit, threads=settings.worker_threads)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.state.metrics = ApiMetrics(app.state.engine)
    app.add_middleware(HttpMetricsMiddleware, metrics=app.state.metrics)

    app.include_router(health.router)
    app.include_router(jobs.router, responses=LIMITED)
    app.include_router(events.router, responses=LIMITED)
    app.include_router(prediction.router, responses=LIMITED)
    app.include_router(cluster.router, responses=LIMITED)
    app.include_router(metrics.router)
    app.include_router(agent.router, responses=LIMITED)
    return app


class BodyLimitMiddleware:
    """413 for a request body over ``max_bytes``, counted as it streams in.

    A declared Content-Length over the limit is refused before the app runs. A body without
    one (chunked) is counted chunk by chunk and refused when the count passes the limit, before
    the app has it all. A Content-Length lower than the body cannot smuggle more in: the server
    hands the app only the declared bytes.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            response = errors.problem_response(
                Request(scope), 413, "Request too large", self._detail()
            )
            await response(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._detail())
            return message

        await self.app(scope, counted, send)

    def _detail(self) -> str:
        return f"request bodies are limited to {self.max_bytes} bytes"
