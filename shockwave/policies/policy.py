"""The one policy interface, its decision value and the registry that finds policies by name.

Every scheduling policy (the baselines and Shockwave) is an object with a ``name``, a frozen
``Params`` dataclass with documented defaults, and ``decide(snapshot, params) -> Decision``. The
simulator and the service call exactly this; nobody compares policy names in an engine, and no
shell looks inside a policy's state: what they need from any policy (the round's jobs, the
rounds planned after it, the last solve's figures) is in the :class:`Decision`, and the
service's options reach a policy's knobs through :func:`service_params`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, runtime_checkable

from shockwave.domain.snapshot import ActiveJob, Snapshot
from shockwave.market.planner import PlannerParams
from shockwave.prediction.predictor import Prediction

REPLAN_MODES = ("reactive", "lazy")
"""When a policy that plans ahead re-plans: on every change (reactive) or only when its plan
runs out or is old (lazy)."""


@dataclass(frozen=True, slots=True)
class SolveSummary:
    """What a policy's latest solve reported (policies that solve a program): its ``status``
    and ``solver``, the ``objective`` and the ``bound`` it proved, the relative gaps
    (``gain_gap`` on the welfare gain, ``gap`` as the solver reports it), and how many
    ``solves`` the policy has made so far."""

    status: str
    solver: str
    objective: float
    bound: float
    gain_gap: float
    gap: float
    solves: int


@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy decides for the next round.

    ``jobs``: ids of the jobs to run this round, highest priority first; their GPU widths sum to
    at most the cluster's GPUs (placement turns them into GPUs). ``state``: handed back to the
    same policy in the next snapshot. ``allocation``: each job's share as the policy sees it (a
    time fraction, or the fraction of planned rounds), for explanations and plots. ``reasons``:
    why a job that is not in ``jobs`` waits, keyed by job id. ``planned``: the rounds after this
    one as the policy plans them now, ``planned[t]`` the jobs of round ``round_index + 1 + t``
    (the snapshot's jobs only, not yet filled with waiting jobs); empty for a policy that
    decides one round at a time. ``solve``: its latest solve's figures, None for a policy that
    solves nothing. ``excluded``: jobs left out of this decision because the policy cannot model
    them, with the reason (:func:`decide_isolating`). ``types``: on a typed cluster, the GPU
    type a heterogeneity-aware policy plans each job on (empty: any type will do).
    ``widths``: the GPU count of each elastic job the policy runs on other than its requested
    one (docs/elastic.md); a job not named runs on its requested count. ``predictions``: the
    trajectory the policy read of each job it predicted for this decision (the jobs whose
    predictions it used, not necessarily every job; empty for a policy that predicts nothing),
    so that a shell can score prediction at the moment of use. The shells read these, never
    ``state`` (which only the policy reads).
    """

    jobs: tuple[str, ...]
    state: object | None = None
    allocation: Mapping[str, float] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    planned: tuple[tuple[str, ...], ...] = ()
    solve: SolveSummary | None = None
    excluded: Mapping[str, str] = field(default_factory=dict)
    types: Mapping[str, str] = field(default_factory=dict)
    widths: Mapping[str, int] = field(default_factory=dict)
    predictions: Mapping[str, Prediction] = field(default_factory=dict)

    def width(self, job: ActiveJob) -> int:
        """The GPUs ``job`` runs on when this decision runs it."""
        return self.widths.get(job.job_id, job.spec.gpus)

    @property
    def rounds(self) -> tuple[tuple[str, ...], ...]:
        """This round's jobs, then the planned rounds after it."""
        return (self.jobs, *self.planned)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocation", MappingProxyType(dict(self.allocation)))
        object.__setattr__(self, "reasons", MappingProxyType(dict(self.reasons)))
        object.__setattr__(self, "excluded", MappingProxyType(dict(self.excluded)))
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))
        object.__setattr__(self, "widths", MappingProxyType(dict(self.widths)))
        object.__setattr__(self, "predictions", MappingProxyType(dict(self.predictions)))


MODEL_ERRORS = (ArithmeticError, ValueError)
"""What a policy raises when a job's numbers break its model (an overflow, a division by
zero, a float it cannot turn into a round count)."""


def decide_isolating(policy: Policy, snapshot: Snapshot, params: Any) -> Decision:
    """``policy.decide(snapshot, params)``, with a job whose model cannot be built left out
    instead of failing the decision for everyone (the second line behind the submission's
    physical bounds, :data:`shockwave.domain.model.MAX_RUN_SECONDS`).

    When the decision raises one of :data:`MODEL_ERRORS`, each job is decided alone (on the
    same cluster, as a first round); the jobs that fail alone are excluded, with the error as
    their reason in ``Decision.excluded``, and the rest are decided together. An error that no
    single job explains is raised: it is the policy's, not a job's. The snapshot's own
    ``excluded`` jobs (which the shell could not build) are reported the same way.
    """
    try:
        decision = policy.decide(snapshot, params)
        if not snapshot.excluded:
            return decision
        return dataclasses.replace(decision, excluded={**snapshot.excluded, **decision.excluded})
    except MODEL_ERRORS as error:
        failure = error
    excluded: dict[str, str] = {}
    for job in snapshot.jobs:
        alone = dataclasses.replace(snapshot, jobs=(job,), policy_state=None)
        try:
            policy.decide(alone, params)
        except MODEL_ERRORS as error:
            excluded[job.job_id] = f"{policy.name} cannot model this job: {error!r}"
    if not excluded:
        raise failure
    rest = tuple(job for job in snapshot.jobs if job.job_id not in excluded)
    decision = policy.decide(dataclasses.replace(snapshot, jobs=rest), params)
    return dataclasses.replace(
        decision, excluded={**snapshot.excluded, **decision.excluded, **excluded}
    )


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: pure, deterministic for the same snapshot and params."""

    name: ClassVar[str]
    Params: ClassVar[type[Any]]

    def decide(self, snapshot: Snapshot, params: Any) -> Decision: ...


class UnknownPolicyError(KeyError):
    """A policy name that no registered policy carries."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = tuple(known)

    def __str__(self) -> str:
        return f"unknown policy {self.name!r} (known: {', '.join(self.known)})"


_REGISTRY: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Add ``policy`` to the registry under its name; a second policy with the same name fails."""
    if policy.name in _REGISTRY and _REGISTRY[policy.name] is not policy:
        raise ValueError(f"policy {policy.name!r} is already registered")
    _REGISTRY[policy.name] = policy
    return policy


def get_policy(name: str) -> Policy:
    _load_builtin_policies()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(name, policy_names()) from None


def policy_names() -> tuple[str, ...]:
    _load_builtin_policies()
    return tuple(_REGISTRY)


def make_params(policy: Policy, overrides: Mapping[str, Any] | None = None) -> Any:
    """The policy's default params with ``overrides`` applied (unknown keys are an error)."""
    params_type = policy.Params
    fields = getattr(params_type, "__dataclass_fields__", {})
    unknown = sorted(set(overrides or {}) - set(fields))
    if unknown:
        raise ValueError(f"policy {policy.name!r} has no parameter(s) {', '.join(unknown)}")
    return params_type(**dict(overrides or {}))


def service_params(
    policy: Policy,
    *,
    replan: str,
    solver_time_limit_s: float | None,
    time_scale: float = 1.0,
) -> Any:
    """The policy's default params with the service's options wherever the policy has such
    knobs: the cluster's re-plan mode (a ``replan`` field; one of :data:`REPLAN_MODES`; it
    also holds for elastic jobs, over an ``elastic_replan`` default), the
    solver's time limit (a ``planner`` of :class:`~shockwave.market.planner.PlannerParams`), and
    ``time_scale``: the workload runs that many times faster than the knobs assume
    (``shockwave replay --time-scale``), so every duration knob is divided by it
    (:func:`time_scaled`)."""
    params = make_params(policy)
    if not dataclasses.is_dataclass(params) or isinstance(params, type):
        return params
    names = {f.name for f in dataclasses.fields(params)}
    changes: dict[str, Any] = {}
    if "replan" in names and replan in REPLAN_MODES:
        changes["replan"] = replan
        if "elastic_replan" in names:
            # The cluster's mode holds for elastic jobs too, as an explicit --replan does in
            # the simulator (docs/elastic.md, lazy re-planning).
            changes["elastic_replan"] = None
    planner = getattr(params, "planner", None)
    if solver_time_limit_s is not None and isinstance(planner, PlannerParams):
        changes["planner"] = dataclasses.replace(planner, time_limit_s=solver_time_limit_s)
    params = dataclasses.replace(params, **changes) if changes else params
    return time_scaled(params, time_scale) if time_scale != 1.0 else params


WALL_CLOCK_KNOBS = frozenset({"time_limit_s"})
"""Duration knobs that are the solver's own wall time, not a span of the workload's time."""


def time_scaled(params: Any, factor: float) -> Any:
    """``params`` with every duration knob divided by ``factor``, nested params included: a
    float field named ``*_s`` or ``*seconds*`` (the restart overhead, Gavel's 1000 s between
    allocations and its initial credit, the predictor's default epoch time), except the
    solver's wall-clock limits (:data:`WALL_CLOCK_KNOBS`). A policy that ran on a clock
    ``factor`` times faster with these knobs decides as the unscaled one does on the real clock."""
    if not dataclasses.is_dataclass(params) or isinstance(params, type):
        return params
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            scaled = time_scaled(value, factor)
            if scaled is not value:
                changes[f.name] = scaled
        elif (
            isinstance(value, float)
            and f.name not in WALL_CLOCK_KNOBS
            and (f.name.endswith("_s") or "seconds" in f.name)
        ):
            changes[f.name] = value / factor
    return dataclasses.replace(params, **changes) if changes else params


def _load_builtin_policies() -> None:
    import shockwave.policies  # noqa: F401  (registers the built-in policies on import)
