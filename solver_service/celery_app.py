"""The Celery app of the solver service: Redis as the broker, one dedicated queue, no results.

Plan requests are small messages ``(cluster_id, state_version)``; the plan itself is written to
Postgres by the task, so there is no result backend. Every message is acknowledged only after
its task has finished (``acks_late``), and given back to the queue when the worker process dies
(``task_reject_on_worker_lost``): a killed worker loses no request, and since planning is
idempotent a redelivered one costs at most a repeated solve. Each worker process takes one
message at a time (prefetch 1), so a long solve never holds other requests hostage.

``celery -A solver_service.celery_app worker`` (what ``shockwave worker`` runs) uses the module
level :data:`app`, configured from the environment when this module is imported; everything
else builds its own app with :func:`make_app`.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from solver_service import broker
from solver_service.settings import SolverSettings

PLAN_TASK = "solver_service.tasks.plan"


def make_app(settings: SolverSettings) -> Any:
    """A Celery app for ``settings`` (no connection is made until it sends or consumes)."""
    celery = Celery("shockwave", broker=settings.broker_url, include=["solver_service.tasks"])
    celery.conf.update(
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.solver_queue,
        task_routes={PLAN_TASK: {"queue": settings.solver_queue}},
        task_soft_time_limit=settings.soft_time_limit_s,
        task_time_limit=settings.hard_time_limit_s,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport=broker.TRANSPORT,
        broker_transport_options=transport_options(settings),
        worker_hijack_root_logger=False,
    )
    return celery


def transport_options(settings: SolverSettings) -> dict[str, Any]:
    """Redis transport options. ``visibility_timeout``: a message taken by a worker that then
    vanished (kill -9 of the whole worker) returns to the queue after this long; twice the
    hard time limit, so a task still running is never handed to a second worker."""
    return {"visibility_timeout": 2 * settings.hard_time_limit_s}


def producer_options(settings: SolverSettings) -> dict[str, Any]:
    """Options for an app that only sends requests from inside other work (an API request, the
    round driver's loop): fail fast when the broker is away instead of retrying, so a caller
    waits at most about ``broker_timeout_s``."""
    timeout = settings.broker_timeout_s
    return {
        "broker_connection_timeout": timeout,
        "broker_connection_retry": False,
        "broker_connection_max_retries": 0,
        "broker_transport_options": {
            **transport_options(settings),
            "socket_connect_timeout": timeout,
            "socket_timeout": timeout,
            "max_retries": 0,
        },
        "task_publish_retry": False,
    }


app = make_app(SolverSettings())
