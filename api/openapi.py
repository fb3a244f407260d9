"""The OpenAPI document, made for client generators and for people.

- Operation ids are the route functions' names in camelCase (``submit_job`` -> ``submitJob``):
  stable as long as the function keeps its name, readable in a generated client, and checked
  unique when the document is built.
- A bearer security scheme (``bearerAuth``) applies to every operation that needs a token (its
  ``x-access`` says anonymous callers get ``token``, 401); the probes say ``security: []``.
  Swagger UI shows an Authorize button for it.
- Tags carry descriptions; enums (GPU counts, job states, adaptation modes) and bounds come from
  the schemas (:mod:`api.schemas`), with an example job.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

SCHEME = "bearerAuth"

TAGS: list[dict[str, str]] = [
    {"name": "jobs", "description": "Submit, list, follow and cancel jobs."},
    {"name": "events", "description": "A job's events, and the stream of state changes."},
    {"name": "cluster", "description": "Nodes, capacity, the queue and the rounds."},
    {"name": "agent", "description": "What node agents call: register, poll, report."},
    {"name": "health", "description": "Probes and Prometheus metrics (no token)."},
    {"name": "tenants", "description": "The tenant tree, its shares and limits, and usage."},
]


RENAMED = {
    "healthz": "getLiveness",
    "readyz": "getReadiness",
    "metrics": "getMetrics",
    "register": "registerNode",
    "heartbeat": "sendHeartbeat",
    "leases": "listNodeLeases",
    "poll": "pollAgent",
    "report_status": "reportAttemptStatus",
    "job_token": "createJobToken",
    "post_event": "reportJobEvent",
    "list_events": "listJobEvents",
    "get_event": "getJobEvent",
    "get_prediction": "getJobPrediction",
}
"""Route functions whose names alone would make unclear operation ids."""


def operation_id(route: APIRoute) -> str:
    """``submit_job`` -> ``submitJob``: the route function's name in camelCase (or its entry in
    :data:`RENAMED`)."""
    if route.name in RENAMED:
        return RENAMED[route.name]
    first, *rest = route.name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def install(app: FastAPI) -> None:
    """Replace ``app.openapi`` with one that adds the security scheme (built once, cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=TAGS,
    )
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from `shockwave admin create-token` (users, admins, agents) "
        "or one minted for a job's attempt (SHOCKWAVE_TOKEN). In open mode (the embedded "
        "service on localhost) requests without a token act as an admin.",
    }
    seen: dict[str, str] = {}
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            ident = operation.get("operationId", "")
            if ident in seen:
                raise RuntimeError(f"operation id {ident} of {method} {path} repeats {seen[ident]}")
            seen[ident] = f"{method} {path}"
            rules = operation.get("x-access", {})
            needs_token = rules.get("anonymous") == "token"
            operation["security"] = [{SCHEME: []}] if needs_token else []
    return schema
