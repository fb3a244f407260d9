"""The regime predictors a policy may plan with, found by name.

Each takes the job as a scheduler sees it, what finished jobs teach (the population prior) and
the throughput model, and returns the job's single predicted trajectory:

- ``population`` (the Shockwave policy's default): the empirical-Bayes predictor of
  :mod:`shockwave.prediction.population_predictor`, the paper's rule updated by what finished jobs
  did;
- ``restatement``: the paper's rule alone (:func:`shockwave.prediction.predictor.predict`), one
  prior for every job;
- ``greedy``: the rest of the job at its latest batch size, what reactive schedulers assume.

Every one reads only observed progress: none can see a job's future.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from shockwave.domain.population import PopulationPrior
from shockwave.domain.snapshot import ActiveJob
from shockwave.prediction.population_predictor import (
    PopulationParams,
    predict_population,
    prior_basis,
    prior_reads,
)
from shockwave.prediction.predictor import Prediction, PredictorParams, predict, predict_greedy
from shockwave.prediction.throughput_model import ThroughputModel

RegimePredictor = Callable[
    [ActiveJob, PopulationPrior, ThroughputModel, PredictorParams, PopulationParams], Prediction
]

REGIME_PREDICTORS: Mapping[str, RegimePredictor] = MappingProxyType(
    {
        "population": lambda job, prior, rates, params, population: predict_population(
            job, prior, params, rates, population
        ),
        "restatement": lambda job, _prior, rates, params, _population: predict(job, params, rates),
        "greedy": lambda job, _prior, rates, params, _population: predict_greedy(
            job, params, rates
        ),
    }
)

DEFAULT_REGIME_PREDICTOR = "population"


def prior_read(
    name: str,
    prior: PopulationPrior,
    job: ActiveJob,
    population: PopulationParams | None = None,
) -> tuple[object, ...]:
    """The parts of ``prior`` (the very objects) that the regime predictor ``name`` reads to
    predict ``job`` with ``population``: the population predictor's template groups
    (:func:`shockwave.prediction.population_predictor.prior_reads`); the others read none."""
    return prior_reads(prior, job, population) if name == "population" else ()


def prior_read_basis(name: str, prior: PopulationPrior, job: ActiveJob) -> object:
    """An object that is the very same for two priors only where :func:`prior_read` gives
    ``job`` the very same parts of each (with the same ``population``): a cheaper check than
    the reads themselves (:func:`shockwave.prediction.population_predictor.prior_basis`;
    ``()`` for the predictors that read none)."""
    return prior_basis(prior, job) if name == "population" else ()


def check_regime_predictor(name: str) -> str:
    """``name`` when it names a regime predictor; ValueError listing the known ones otherwise."""
    if name not in REGIME_PREDICTORS:
        known = ", ".join(REGIME_PREDICTORS)
        raise ValueError(f"unknown regime predictor {name!r} (one of {known})")
    return name
