"""The Shockwave policy's knobs as ``shockwave simulate`` options, and the params they make.

Every option defaults to None, meaning "the dataclass's own default": params start from the
policy's default :class:`~shockwave.policies.shockwave_market.shockwave.ShockwaveParams` and only
the options the user passed are applied, with :func:`dataclasses.replace`, so no default is written
twice (the help texts read them from the dataclasses too). The knobs apply to the ``shockwave``
policy only; naming one while ``--policy`` selects no policy that takes them is an input error.

A bad value becomes an :class:`~shockwave_cli.commands.inputs.InputError` naming the option: the
dataclasses' own checks (window > 0, replan reactive or lazy, ...) plus the ranges below, which
the dataclasses do not check (weights and the margin >= 0, the time limit > 0, every number
finite).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Annotated

import typer

from shockwave.market.planner import PlannerParams
from shockwave.policies.shockwave_market.shockwave import ShockwaveParams
from shockwave.prediction.regime_predictors import REGIME_PREDICTORS
from shockwave.workloads.throughput_knowledge import ThroughputKnowledge
from shockwave.workloads.variation import Variation
from shockwave_cli.commands.inputs import InputError

_PLANNER = PlannerParams()
_POLICY = ShockwaveParams()

WindowRounds = Annotated[
    int | None,
    typer.Option(help=f"Shockwave: planning window T in rounds (default {_PLANNER.rounds})."),
]
MakespanWeight = Annotated[
    float | None,
    typer.Option(help=f"Shockwave: makespan weight lambda (default {_PLANNER.makespan_weight:g})."),
]
DeadlineWeight = Annotated[
    float | None,
    typer.Option(
        help=f"Shockwave: fairness-deadline weight mu (default {_PLANNER.deadline_weight:g})."
    ),
]
HorizonMargin = Annotated[
    float | None,
    typer.Option(
        help=f"Shockwave: makespan horizon margin theta (default {_PLANNER.horizon_margin:g})."
    ),
]
CriticalPathMargin = Annotated[
    float | None,
    typer.Option(
        help="Shockwave: critical-path margin theta_c in [0, 1]; 0 turns the reservation off "
        f"(default {_PLANNER.critical_path_margin:g})."
    ),
]
CriticalPathGate = Annotated[
    float | None,
    typer.Option(
        help="Shockwave: critical-path gate g in (0, 1]: the reservation holds while g times "
        "the longest remainder outlasts the work bound; 1 protects the longest job whenever it "
        "bounds the makespan (shorter makespans, longer average JCT; default: the margin "
        "theta_c)."
    ),
]
FairnessExponent = Annotated[
    float | None,
    typer.Option(
        help=f"Shockwave: k in the weights B rho^k (default {_POLICY.fairness_exponent:g}).",
    ),
]
Replan = Annotated[
    str | None,
    typer.Option(
        help=f"Shockwave: re-plan policy, reactive or lazy (default {_POLICY.replan}; "
        f"{_POLICY.elastic_replan} while any job is elastic, unless given)."
    ),
]
PackingOrder = Annotated[
    str | None,
    typer.Option(
        help="Shockwave: order in which the plan's running and late jobs take the next round, "
        f"laxity or deadline (default {_POLICY.packing_order}; docs/policy.md).",
    ),
]
ReplanEvery = Annotated[
    int | None,
    typer.Option(
        help=f"Shockwave: re-plan at least every N rounds (default {_POLICY.replan_every_rounds}).",
    ),
]
SolverTimeLimit = Annotated[
    float | None,
    typer.Option(
        help=f"Shockwave: SCIP time limit per solve, s (default {_PLANNER.time_limit_s:g})."
    ),
]
SolverGap = Annotated[
    float | None,
    typer.Option(
        help=f"Shockwave: target relative gap of a solve (default {_PLANNER.relative_gap:g})."
    ),
]
UseScip = Annotated[
    str | None,
    typer.Option(help=f"Shockwave: use SCIP auto, always or never (default {_PLANNER.use_scip})."),
]
Oracle = Annotated[
    bool,
    typer.Option(
        "--oracle",
        help="Shockwave: predict from the true trajectories (measures what prediction costs).",
    ),
]
ForecastContention = Annotated[
    bool,
    typer.Option(
        "--forecast-contention",
        help="Shockwave: fairness by each job's contention over its whole life, the rest of it "
        "forecast from the jobs present (off: the contention it has seen; docs/policy.md).",
    ),
]
PredictionError = Annotated[
    float | None,
    typer.Option(
        help="Shockwave: inject +/-P relative error into predicted run times (0.3 = +/-30%), "
        f"drawn per job from --seed (default {_POLICY.prediction_error:g}).",
    ),
]


RegimePredictorOption = Annotated[
    str | None,
    typer.Option(
        "--predictor",
        help="Shockwave: regime predictor to plan with: "
        f"{', '.join(REGIME_PREDICTORS)} (default {_POLICY.regime_predictor}).",
    ),
]
ThroughputKnowledgeOption = Annotated[
    str,
    typer.Option(
        help="What users declare about throughput: declared (the table's rates), noisy:P "
        "(each rate off by up to +/-P, drawn from --seed) or none (only measured epoch times).",
    ),
]


VariationOption = Annotated[
    str,
    typer.Option(
        help="Jobs that differ from their declared figures: throughput:S gives each job its own "
        "speed (log-normal, spread S, around the table's), trajectory:S its own regime lengths; "
        "comma-separated, drawn from --seed (default: none).",
    ),
]


def parse_variation(text: str) -> Variation:
    """``--variation``, or an :class:`InputError` naming the expected shape."""
    try:
        return Variation.parse(text)
    except ValueError as error:
        raise InputError(f"--variation: {error}") from None


def parse_knowledge(text: str) -> ThroughputKnowledge:
    """``--throughput-knowledge``, or an :class:`InputError` naming the expected shapes."""
    try:
        return ThroughputKnowledge.parse(text)
    except ValueError as error:
        raise InputError(f"--throughput-knowledge: {error}") from None


@dataclass(frozen=True, slots=True)
class ShockwaveKnobs:
    """What the user passed for each knob; None (or False for the flags ``oracle`` and
    ``forecast_contention``): not passed."""

    window_rounds: int | None = None
    makespan_weight: float | None = None
    deadline_weight: float | None = None
    horizon_margin: float | None = None
    critical_path_margin: float | None = None
    critical_path_gate: float | None = None
    fairness_exponent: float | None = None
    replan: str | None = None
    replan_every: int | None = None
    packing_order: str | None = None
    solver_time_limit: float | None = None
    solver_gap: float | None = None
    use_scip: str | None = None
    oracle: bool = False
    prediction_error: float | None = None
    predictor: str | None = None
    forecast_contention: bool = False

    def given(self) -> list[str]:
        """The options the user passed, as flags (``--window-rounds``), in declaration order."""
        return [
            "--" + f.name.replace("_", "-")
            for f in fields(self)
            if getattr(self, f.name) not in (None, False)
        ]


Rule = Callable[[float], bool]


@dataclass(frozen=True, slots=True)
class _Knob:
    """One option: its ``attribute`` of ShockwaveKnobs sets ``field`` of the planner's params
    (``in_planner``) or the policy's, after ``rule`` (described by ``rule_text``) holds."""

    attribute: str
    field: str
    in_planner: bool
    rule: Rule | None = None
    rule_text: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.attribute.replace("_", "-")


def _non_negative(value: float) -> bool:
    return value >= 0


def _positive(value: float) -> bool:
    return value > 0


_KNOBS: tuple[_Knob, ...] = (
    _Knob("window_rounds", "rounds", in_planner=True),
    _Knob("makespan_weight", "makespan_weight", True, _non_negative, "must be >= 0"),
    _Knob("deadline_weight", "deadline_weight", True, _non_negative, "must be >= 0"),
    _Knob("horizon_margin", "horizon_margin", True, _non_negative, "must be >= 0"),
    _Knob(
        "critical_path_margin",
        "critical_path_margin",
        True,
        lambda v: 0 <= v <= 1,
        "must be in [0, 1] (0: off)",
    ),
    _Knob(
        "critical_path_gate",
        "critical_path_gate",
        True,
        lambda v: 0 < v <= 1,
        "must be in (0, 1]",
    ),
    _Knob("solver_time_limit", "time_limit_s", True, _positive, "must be > 0 seconds"),
    _Knob("solver_gap", "relative_gap", True, _non_negative, "must be >= 0"),
    _Knob("use_scip", "use_scip", in_planner=True),
    _Knob("fairness_exponent", "fairness_exponent", False, _non_negative, "must be >= 0"),
    _Knob("replan", "replan", in_planner=False),
    _Knob("replan_every", "replan_every_rounds", in_planner=False),
    _Knob("packing_order", "packing_order", in_planner=False),
    _Knob("prediction_error", "prediction_error", in_planner=False),
    _Knob("predictor", "regime_predictor", in_planner=False),
)


def apply_knobs(
    params: ShockwaveParams, knobs: ShockwaveKnobs, seed: int | None
) -> ShockwaveParams:
    """``params`` with every passed knob applied; ``seed`` (when given) becomes ``error_seed``.

    Raises :class:`InputError` naming the first option whose value is out of range.
    """
    planner = params.planner
    for knob in _KNOBS:
        value = getattr(knobs, knob.attribute)
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{knob.flag}: must be a finite number, got {value}")
        if knob.rule is not None and not knob.rule(value):
            raise InputError(f"{knob.flag}: {knob.rule_text}, got {value:g}")
        try:
            if knob.in_planner:
                planner = replace(planner, **{knob.field: value})
            else:
                params = replace(params, **{knob.field: value})
        except ValueError as error:
            raise InputError(f"{knob.flag}: {error}") from None
    params = replace(params, planner=planner)
    if knobs.replan is not None:
        # Given explicitly, it holds for elastic workloads too (docs/elastic.md).
        params = replace(params, elastic_replan=None)
    if knobs.oracle:
        params = replace(params, oracle=True)
    if knobs.forecast_contention:
        params = replace(params, forecast_contention=True)
    if seed is not None:
        params = replace(params, error_seed=seed)
    return params
