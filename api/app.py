"""The application factory: build the FastAPI app for given settings (no work at import)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from sqlalchemy.engine import Engine

from api import errors
from api.db import make_engine
from api.observability import ApiMetrics, HttpMetricsMiddleware
from api.routes import agent, cluster, events, health, jobs, metrics, prediction
from api.settings import Settings


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
    errors.install(app)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            return errors.problem_response(
                request,
                413,
                "Request too large",
                f"request bodies are limited to {settings.max_body_bytes} bytes",
            )
        response: Response = await call_next(request)
        return response

    app.state.metrics = ApiMetrics(app.state.engine)
    app.add_middleware(HttpMetricsMiddleware, metrics=app.state.metrics)

    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(events.router)
    app.include_router(prediction.router)
    app.include_router(cluster.router)
    app.include_router(metrics.router)
    app.include_router(agent.router)
    return app
