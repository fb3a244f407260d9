"""Ask for a plan: ``request_plan(cluster_id, state_version)``, from the API or the round driver.

Two modes (``SHOCKWAVE_SOLVER_MODE``):

- ``celery`` (distributed): send the task ``solver_service.tasks.plan`` to the solver queue.
  Redis is only a broker: when it is unreachable the request is dropped with a warning after at
  most about ``broker_timeout_s``, and nothing is lost, because the database already holds
  everything a plan is made from and the round driver asks for a plan every round.
- ``inline`` (the embedded ``shockwave up``): run the plan in a background thread of this
  process, one plan at a time, each with its own database session.
- ``process`` (``shockwave up --solver process``): the same, in one child process (spawned,
  with its own database engine), so that a solve's pure-Python work (the Shockwave planner's
  greedy: 0.1 to 0.5 s a plan on the reference trace) does not hold the interpreter lock that
  the API's and the round driver's threads need meanwhile.

Callers send a request only after the transaction that made it necessary has committed, so a
worker never plans from data that is not there yet. The process's requester is built from the
environment on first use, or explicitly with :func:`configure` at the entry point.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Protocol

from kombu.exceptions import KombuError
from sqlalchemy.engine import Engine
from sqlmodel import Session

from solver_service.celery_app import PLAN_TASK, make_app, producer_options
from solver_service.settings import SolverSettings
from store.db import make_engine
from store.snapshot import KnownSpecs

log = logging.getLogger(__name__)


class PlanRequester(Protocol):
    def request(self, cluster_id: str, state_version: int) -> None: ...

    def close(self) -> None: ...


class CeleryRequester:
    """Sends plan requests to the solver queue; gives up fast when the broker is away."""

    def __init__(self, settings: SolverSettings) -> None:
        self._app = make_app(settings)
        self._app.conf.update(producer_options(settings))
        self._queue = settings.solver_queue

    def request(self, cluster_id: str, state_version: int) -> None:
        try:
            self._app.send_task(
                PLAN_TASK, args=(cluster_id, state_version), queue=self._queue, retry=False
            )
        except (KombuError, OSError) as error:
            log.warning(
                "plan request %s@%s not sent, the broker is unreachable (%s); "
                "the round driver will ask again",
                cluster_id,
                state_version,
                error,
            )

    def close(self) -> None:
        self._app.close()


class InlineRequester:
    """Plans in a background thread of this process, one plan at a time."""

    def __init__(self, settings: SolverSettings, engine: Engine | None = None) -> None:
        self._settings = settings
        self._engine = engine or make_engine(settings.database_url, settings.database_schema)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shockwave-solver")
        self._known = KnownSpecs()  # the one planning thread's

    def request(self, cluster_id: str, state_version: int) -> None:
        self._pool.submit(self._plan, cluster_id, state_version)

    def close(self) -> None:
        """Wait for the plan in progress; drop the queued ones (the driver asks again)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _plan(self, cluster_id: str, state_version: int) -> None:
        from solver_service.planning import plan_cluster

        try:
            with Session(self._engine) as session:
                plan_cluster(
                    session,
                    cluster_id,
                    state_version,
                    now=datetime.now(UTC),
                    solver_time_limit_s=self._settings.solver_time_limit_s,
                    time_scale=self._settings.time_scale,
                    priority_classes=self._settings.priority_classes,
                    known=self._known,
                )
        except Exception:
            log.exception("plan %s@%s failed", cluster_id, state_version)


class ProcessRequester:
    """Plans in one child process, one plan at a time (module docstring). The child logs at
    this process's root level, in the format of ``shockwave up``."""

    def __init__(self, settings: SolverSettings) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_child,
            initargs=(settings.model_dump(), logging.getLogger().getEffectiveLevel()),
        )
        # Start the child now, not at the first plan request: spawning it and importing the
        # planner takes seconds (3 to 9 s on a loaded 2-core machine), and a cluster whose first
        # jobs wait for it runs first in, first out until then (at a replay's 120x, 470 to
        # 2,230 simulated seconds of its start).
        self._warm = self._pool.submit(_warm_child)

    def warm(self, timeout_s: float) -> bool:
        """Whether the child has started and imported the planner within ``timeout_s``."""
        try:
            self._warm.result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def request(self, cluster_id: str, state_version: int) -> None:
        self._pool.submit(_plan_in_child, cluster_id, state_version)

    def close(self) -> None:
        """Wait for the plan in progress; drop the queued ones (the driver asks again)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


_child: InlineRequester | None = None


def _start_child(settings: dict[str, object], level: int) -> None:
    global _child
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    _child = InlineRequester(SolverSettings.model_validate(settings))


def _warm_child() -> None:
    """Import what a plan needs (the planning module, every policy) in the child."""
    import solver_service.planning  # noqa: F401  (the import is the point)
    from shockwave.policies.policy import policy_names

    policy_names()  # loads the built-in policies


def _plan_in_child(cluster_id: str, state_version: int) -> None:
    assert _child is not None, "the solver process was not started"
    _child._plan(cluster_id, state_version)


def make_requester(settings: SolverSettings, engine: Engine | None = None) -> PlanRequester:
    """The requester for ``settings.solver_mode`` (``engine``: the inline solver's database,
    default one built from the settings)."""
    if settings.solver_mode == "inline":
        return InlineRequester(settings, engine)
    if settings.solver_mode == "process":
        return ProcessRequester(settings)
    return CeleryRequester(settings)


_lock = threading.Lock()
_requester: PlanRequester | None = None


def configure(
    settings: SolverSettings | None = None, *, engine: Engine | None = None
) -> PlanRequester:
    """Install this process's requester (default settings: from the environment), closing the
    previous one."""
    global _requester
    new = make_requester(settings or SolverSettings(), engine)
    with _lock:
        old, _requester = _requester, new
    if old is not None:
        old.close()
    return new


def install(requester: PlanRequester | None) -> PlanRequester | None:
    """Make ``requester`` this process's requester (None: build one from the environment on
    the next request); returns the previous one, not closed (embedding, tests)."""
    global _requester
    with _lock:
        old, _requester = _requester, requester
    return old


def shutdown() -> None:
    """Close this process's requester (an inline one finishes its current plan first)."""
    global _requester
    with _lock:
        old, _requester = _requester, None
    if old is not None:
        old.close()


def request_plan(cluster_id: str, state_version: int) -> None:
    """Ask for a plan of ``cluster_id`` at ``state_version``; never raises for a broker outage
    and returns within about ``broker_timeout_s``."""
    global _requester
    with _lock:
        if _requester is None:
            _requester = make_requester(SolverSettings())
        requester = _requester
    requester.request(cluster_id, state_version)
