"""The application factory: build the FastAPI app for given settings (no work at import)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi_offline import FastAPIOffline
from sqlalchemy.engine import Engine
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from api import errors, openapi
from api.admission import ArrivalStamp, InFlightLimit, pool_capacity
from api.agent import reports_nothing
from api.observability import ApiMetrics, HttpMetricsMiddleware
from api.ratelimit import RateLimiter
from api.request_body import BodyTooLarge, read_body, replaying
from api.routes import (
    agent,
    cluster,
    dashboard,
    events,
    health,
    jobs,
    metrics,
    prediction,
    stream,
    tenants,
    tokens,
    usage,
)
from api.security_headers import SecurityHeaders
from api.settings import Settings
from store.cluster_version import PlanRequest, no_plan_requests
from store.db import make_engine
from store.lease_signal import LEASES, OVERLOAD, LeaseSignal, Listener, Throttled

LIMITED: dict[int | str, dict[str, Any]] = errors.openapi_problems(
    (408, "The request body did not arrive in time"),
    (413, "Request body too large"),
    (429, "Too many requests from this token (or address); Retry-After says when to retry"),
)
"""Answers every /v1 operation may give, whatever the route."""
STATIC_PREFIX = "/static/"
"""The Swagger UI, ReDoc and dashboard assets: files, served without a request slot."""
AGENT_PREFIX = "/v1/agent/"
"""The agents' requests: admitted after every other request waiting (api.admission), so that
a fleet's burst at a round boundary never queues in front of a user."""
POLL_PATH = f"{AGENT_PREFIX}poll"
"""The agents' poll: a long poll that reports nothing waits behind the agents' other requests
(api.admission, ``IDLE``)."""
STATIC_PAGES = ("/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
"""Pages made without the database (the OpenAPI document is built once), served without a
request slot too."""


def create_app(
    settings: Settings | None = None,
    engine: Engine | None = None,
    *,
    request_plan: PlanRequest = no_plan_requests,
    lease_signal: LeaseSignal | None = None,
) -> FastAPI:
    """The API for ``settings`` (default: from the environment), on ``engine`` if given.
    ``request_plan`` is how a committed change asks for a new plan (the solver service's
    requester, handed in by the composition root); by default nobody is asked.
    ``lease_signal``: what the round driver of this process notifies when it issues leases
    (long polls wake on it); by default a new one. On Postgres, while the app runs (its
    lifespan: uvicorn, or a ``with TestClient(app)``), a :class:`store.lease_signal.Listener`
    also notifies it when a round driver in another process commits leases; without it (or
    while its channel is down) held polls re-read on a timer (``poll_recheck_s``)."""
    settings = settings or Settings()
    engine = engine or make_engine(settings.database_url, settings.database_schema)
    signal = lease_signal or LeaseSignal()
    # Swagger UI (/docs) and ReDoc (/redoc) from assets in the fastapi-offline package, served
    # here: no page the API serves loads anything from another host.
    app = FastAPIOffline(
        title="Shockwave",
        version="0.1.0",
        description=(
            "Scheduling service for shared GPU clusters training models whose batch size changes "
            "(NSDI'23 Shockwave). Errors are RFC 9457 problem details. The dashboard is at `/`; "
            "docs/integration.md covers tokens, idempotency, paging, errors and the event stream."
        ),
        generate_unique_id_function=openapi.operation_id,
        static_url="/static/docs",
        favicon_url="/static/dashboard/favicon.svg",
        lifespan=_listening(engine, signal),
    )
    openapi.install(app)
    app.state.settings = settings
    app.state.engine = engine
    app.state.request_plan = request_plan
    app.state.lease_signal = signal
    app.state.rate_limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
    errors.install(app)
    # Requests in progress: no more than the pool has connections (api.admission), and twice
    # the worker threads: a thread done with one request finds the next one admitted, and few
    # wait half-done on the event loop (docs/reliability.md, "Load": p99 166 ms with 10 in
    # progress on 2 threads, 97 ms with 4).
    limit = min(pool_capacity(app.state.engine), 2 * settings.worker_threads)
    app.add_middleware(
        InFlightLimit,
        limit=limit,
        threads=settings.worker_threads,
        exempt=(stream.STREAM_PATH, *STATIC_PAGES),
        exempt_prefixes=(STATIC_PREFIX,),
        queue_timeout_s=settings.queue_timeout_s,
        on_shed=Throttled(engine, OVERLOAD),
        background_prefixes=(AGENT_PREFIX,),
        idle={POLL_PATH: reports_nothing},
    )
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    app.state.metrics = ApiMetrics(app.state.engine)
    app.add_middleware(HttpMetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(ArrivalStamp)  # before admission: a request counts from its arrival
    app.add_middleware(SecurityHeaders)  # outermost: every response, refusals included

    app.include_router(health.router)
    app.include_router(jobs.router, responses=LIMITED)
    app.include_router(events.router, responses=LIMITED)
    app.include_router(stream.router, responses=LIMITED)
    app.include_router(prediction.router, responses=LIMITED)
    app.include_router(cluster.router, responses=LIMITED)
    app.include_router(metrics.router)
    app.include_router(agent.router, responses=LIMITED)
    app.include_router(tokens.router, responses=LIMITED)
    app.include_router(tenants.router, responses=LIMITED)
    app.include_router(usage.router, responses=LIMITED)
    dashboard.install(app)
    return app


def _listening(engine: Engine, signal: LeaseSignal) -> Any:
    """The app's lifespan: on Postgres, listen for the leases other processes commit and wake
    ``signal``'s held polls (``signal.live`` says whether the channel is up)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if not Listener.supported(engine):
            yield
            return

        def live(up: bool) -> None:
            signal.live = up

        listener = Listener(engine, {LEASES: signal.notify}, on_live=live)
        listener.start()
        try:
            yield
        finally:
            await asyncio.to_thread(listener.stop)

    return lifespan


class BodyLimitMiddleware:
    """Read the whole request body, bounded in size and in time, before the request goes on
    (to admission, :class:`api.admission.InFlightLimit`, and the app).

    Size: 413 for a body over ``max_bytes``. A declared Content-Length over the limit is refused
    before any byte is read; a body without one (chunked) is counted as it streams in and
    refused when the count passes the limit. A Content-Length lower than the body cannot
    smuggle more in: the server hands on only the declared bytes.

    Time: 408 (and the connection closed) for a body not all in within ``timeout_s``. Why here:
    admission allows only a few requests in progress per process (twice the worker threads), so
    a request admitted before its body arrived would hold a slot while a slow or hostile client
    trickles it in; four such clients stalled a whole API process, health checks included. Read
    first, a slow body holds only its own connection. Bodies are small (``max_bytes``, 1 MB by
    default), so holding one in memory is cheap.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send, 413, "Request too large", self._detail())
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await read_body(receive, self.max_bytes)
        except TimeoutError:
            detail = f"the request body did not arrive within {self.timeout_s:g} s"
            await self._refuse(scope, receive, send, 408, "Request timeout", detail)
            return
        except BodyTooLarge:
            await self._refuse(scope, receive, send, 413, "Request too large", self._detail())
            return
        if body is None:  # the client went away
            return
        await self.app(scope, replaying(body, receive), send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, title: str, detail: str
    ) -> None:
        """Answer with a problem and close the connection (the rest of the body, if any, is
        not read: the connection cannot carry another request)."""
        headers = {"Connection": "close"}
        response = errors.problem_response(Request(scope), status, title, detail, headers=headers)
        await response(scope, receive, send)

    def _detail(self) -> str:
        return f"request bodies are limited to {self.max_bytes} bytes"
