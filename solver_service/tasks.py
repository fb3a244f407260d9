"""The solver worker's task: ``plan(cluster_id, state_version)``.

The task takes ids and a version, never objects, and does all its work through
:func:`solver_service.planning.plan_cluster`, which is idempotent: a redelivered, duplicated or
stale request is a no-op, so ``acks_late`` redelivery after a crash is safe. The plan goes to
the database; the task returns nothing. Each worker process opens its own engine the first time
it runs a task (never before the pool forks).
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from functools import cache
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from shockwave.policies.policy import UnknownPolicyError
from solver_service.celery_app import PLAN_TASK, app
from solver_service.planning import plan_cluster
from solver_service.settings import SolverSettings
from store.db import make_engine
from store.snapshot import KnownSpecs

log = logging.getLogger(__name__)

_engines: dict[int, Engine] = {}
_known: dict[int, KnownSpecs] = {}
"""Each process's job specs, kept from one plan to the next (:class:`store.snapshot.KnownSpecs`)."""


@cache
def settings() -> SolverSettings:
    """This process's settings, read from the environment once."""
    return SolverSettings()


def engine() -> Engine:
    """This process's engine (one per process id, so a forked child never shares its parent's
    connections)."""
    pid = os.getpid()
    if pid not in _engines:
        _engines[pid] = make_engine(settings().database_url, settings().database_schema)
    return _engines[pid]


def run_plan(cluster_id: str, state_version: int) -> None:
    """Plan ``cluster_id`` at ``state_version``; a database outage is retried by Celery, a
    solve that overruns the soft time limit or a cluster naming an unknown policy is logged
    and dropped (the round driver falls back and asks again)."""
    try:
        with Session(engine()) as session:
            plan_cluster(
                session,
                cluster_id,
                state_version,
                now=datetime.now(UTC),
                solver_time_limit_s=settings().solver_time_limit_s,
                time_scale=settings().time_scale,
                priority_classes=settings().priority_classes,
                known=_known.setdefault(os.getpid(), KnownSpecs()),
            )
    except SoftTimeLimitExceeded:
        log.warning("plan %s@%s: over the soft time limit, dropped", cluster_id, state_version)
    except UnknownPolicyError as error:
        log.error("plan %s@%s: %s", cluster_id, state_version, error)


plan: Any = app.task(
    name=PLAN_TASK,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=5,
)(run_plan)
