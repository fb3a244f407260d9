"""/metrics: Prometheus text exposition of this process's registry (see api.observability)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.auth import ANY, DENIED, access
from api.deps import Scraper
from api.errors import openapi_problems
from api.observability import MetricsDep

router = APIRouter(tags=["health"])

PROBLEMS = openapi_problems(
    (401, "Missing, unknown, revoked or expired token"),
    (403, "Neither a metrics nor an admin token"),
    (429, "Too many requests from this token (or address)"),
)


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    openapi_extra=access(admin=ANY, user=DENIED, agent=DENIED, job=DENIED),
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Text exposition"},
        **PROBLEMS,
    },
)
def metrics(metrics: MetricsDep, scraper: Scraper) -> Response:
    """Counters and histograms of this API process, and job, node and GPU gauges read from the
    database at scrape time. Needs a metrics token (``shockwave admin create-token --role
    metrics``; Prometheus: ``authorization: {credentials_file: ...}``) or an admin token: the
    gauges count every tenant's jobs and the nodes, which users may not see."""
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
