"""Settings of the solver service, read once from the environment (prefix SHOCKWAVE_)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shockwave.market.planner import PlannerParams
from store.settings import DatabaseSettings

SolverMode = Literal["celery", "inline", "process"]


class SolverSettings(DatabaseSettings):
    """The database plans are read from and written to (the API's variables:
    :class:`~store.settings.DatabaseSettings`) and the solver service's own settings.
    ``broker_url``: the Celery broker (Redis); it carries only plan requests, never data.
    ``solver_mode``: ``celery`` sends each plan request to the Celery queue the workers
    consume; ``inline`` runs it in a background thread of the requesting process (the embedded
    ``shockwave up``); ``process`` in a child process of it (``shockwave up --solver process``:
    a solve's Python work then never holds the interpreter the API and the round driver run
    in). ``solver_queue``: that queue's name (a test or a benchmark sharing a Redis names its
    own). ``solver_time_limit_s``: the planner's own limit (SCIP's, for
    policies that solve a program). ``task_time_margin_s``: the task's soft time limit is the
    planner's plus this, its hard limit that plus the margin again.
    ``broker_timeout_s``: how long a request may wait on the broker before it gives up (the API
    answers meanwhile, so this bounds what an unreachable Redis adds to a request).
    ``time_scale``: the workload runs this many times faster than real time (``shockwave
    replay --time-scale``; 1 in production): the policy's duration knobs are divided by it
    (:func:`shockwave.policies.policy.time_scaled`)."""

    broker_url: str = "redis://127.0.0.1:6379/0"
    solver_mode: SolverMode = "celery"
    solver_queue: str = Field(default="solver", pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    solver_time_limit_s: float = Field(default=PlannerParams().time_limit_s, gt=0)
    task_time_margin_s: float = Field(default=30.0, gt=0)
    broker_timeout_s: float = Field(default=0.5, gt=0, le=10)
    time_scale: float = Field(default=1.0, gt=0)

    @property
    def soft_time_limit_s(self) -> float:
        return self.solver_time_limit_s + self.task_time_margin_s

    @property
    def hard_time_limit_s(self) -> float:
        return self.soft_time_limit_s + self.task_time_margin_s
