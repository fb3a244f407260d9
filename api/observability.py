"""Prometheus metrics of one API process, on a registry of its own (never the global one).

Names are prefixed ``shockwave_`` and in base units (seconds):

- ``shockwave_http_requests_total{method,route,status}``: answered requests; ``route`` is the
  matched route template (``/v1/jobs/{job_id}``), never the raw path, and ``unmatched`` when
  no route matched, so a scan of random URLs cannot blow up the series count;
- ``shockwave_http_request_duration_seconds{method,route}``: a histogram of the same;
- ``shockwave_job_events_total{kind,outcome}``: client events posted; outcome ``recorded`` (new)
  or ``replayed`` (a duplicate seq);
- read from the database at scrape time (the same for every replica): ``shockwave_jobs{state}``,
  ``shockwave_nodes{state}``, ``shockwave_cluster_gpus{state}`` (GPUs of the nodes in each
  state), and ``shockwave_database_up`` (0 when that read failed; the other gauges are then
  absent rather than wrong);
- per tenant (every tenant with jobs queued or running or GPUs held, and every tenant above
  one; ``tenant`` is its path): ``shockwave_tenant_entitled_gpus`` (its water-filled share of
  the READY GPUs now), ``shockwave_tenant_held_gpus``, ``shockwave_tenant_active_jobs``, and
  ``shockwave_tenant_gpu_hours_24h`` (GPU-hours its jobs held over the last 24 hours, as
  ``GET /v1/usage`` counts them; leaf tenants).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shockwave.domain.lifecycle import NodeState
from store import cluster, tenants, usage
from store.principals import OPEN

log = logging.getLogger("shockwave.api")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """The metrics of one app; ``render()`` is the text a Prometheus scrape gets."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "shockwave_http_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "shockwave_http_request_duration_seconds",
            "Time to answer an HTTP request, by method and route template.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.job_events = Counter(
            "shockwave_job_events",
            "Client job events posted, by kind (progress, scaling) and outcome "
            "(recorded, replayed).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.registry.register(DatabaseCollector(engine))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.duration.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class DatabaseCollector:
    """Gauges read from the database at each scrape (jobs, nodes and GPUs by state)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "shockwave_database_up", "1 if the last scrape could read the database, else 0."
        )
        try:
            with Session(self.engine) as session:
                jobs = cluster.jobs_by_state(session)
                capacity = cluster.capacity(session)
                shares = tenants.shares_now(session)
                now = datetime.now(UTC)
                used = usage.usage(
                    session,
                    OPEN,
                    since=now - timedelta(hours=24),
                    until=now,
                    now=now,
                    group_by=usage.GroupBy.TENANT,
                )
            gpus = {
                NodeState.READY.value: capacity.ready_gpus,
                NodeState.LOST.value: capacity.total_gpus - capacity.ready_gpus,
            }
        except SQLAlchemyError as error:
            log.warning("metrics: could not read the database: %r", error)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield _by_state("shockwave_jobs", "Jobs by state.", jobs)
        yield _by_state("shockwave_nodes", "Registered nodes by state.", capacity.nodes)
        yield _by_state("shockwave_cluster_gpus", "GPUs of the nodes in each state.", gpus)
        yield from _tenant_gauges(shares, {row.key: row.gpu_hours for row in used})


def _tenant_gauges(
    shares: dict[str, tenants.Share], gpu_hours: dict[str, float]
) -> Iterable[GaugeMetricFamily]:
    gauges = (
        ("entitled_gpus", "A tenant's water-filled share of the READY GPUs now.",
         {p: s.entitled_gpus for p, s in shares.items()}),
        ("held_gpus", "GPUs a tenant's jobs hold now (live leases).",
         {p: float(s.held_gpus) for p, s in shares.items()}),
        ("active_jobs", "A tenant's jobs queued and running.",
         {p: float(s.active_jobs) for p, s in shares.items()}),
        ("gpu_hours_24h", "GPU-hours a tenant's jobs held over the last 24 hours.", gpu_hours),
    )  # fmt: skip
    for name, documentation, values in gauges:
        family = GaugeMetricFamily(f"shockwave_tenant_{name}", documentation, labels=["tenant"])
        for path, value in sorted(values.items()):
            family.add_metric([path], float(value))
        yield family


def _by_state(name: str, documentation: str, counts: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["state"])
    for state, count in sorted(counts.items()):
        family.add_metric([state], float(count))
    return family


class HttpMetricsMiddleware:
    """Pure ASGI middleware that counts and times every HTTP request by route template.

    Install it outermost so requests that inner middleware answers (413) count too; an
    exception escaping the app counts as the 500 the server will send.
    """

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_request(
                scope["method"], route, status, time.perf_counter() - started
            )


def get_metrics(request: Request) -> ApiMetrics:
    metrics: ApiMetrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
