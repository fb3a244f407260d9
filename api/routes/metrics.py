"""/metrics: Prometheus text exposition of this process's registry (see api.observability)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.auth import PUBLIC
from api.observability import MetricsDep

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    openapi_extra=PUBLIC,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Text exposition"}},
)
def metrics(metrics: MetricsDep) -> Response:
    """Counters and histograms of this API process, and job, node and GPU gauges read from the
    database at scrape time. No token needed, like /healthz: it carries counts, no names."""
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
