"""How well a job's future is predicted as it runs (the paper's "modeling error" figure).

For every job whose declared mode adapts its batch size (accordion, gns), walk its true trajectory
to the progress points 0%, 10%, ..., 90% of its epochs. At each point build the
:class:`~shockwave.snapshot.ActiveJob` a scheduler would see there (:func:`observed_job`), predict
its trajectory with each :class:`Predictor` and compare with the truth:

- regime-length error: the mean over the job's true regimes of |predicted epochs of regime i -
  true epochs of regime i| / E, regimes aligned by index. A true regime the prediction lacks
  counts its whole length; a predicted regime past the true ones adds no term of its own (both
  trajectories sum to E, so its epochs are missing from the aligned regimes' terms).
- run-time accuracy: 1 - |P_hat - P| / P, with P the job's exclusive run time (all its epochs,
  the part already run included) and P_hat the predicted one. Not clipped: it falls below 0 when
  P_hat is more than twice P.

Predictors: ``restatement`` (:func:`~shockwave.predictor.predict`, the posterior mean under the
restatement rule, what Shockwave plans with), ``greedy``
(:func:`~shockwave.predictor.predict_greedy`, the rest of the job at its latest batch size and
throughput, what reactive schedulers assume) and ``oracle``
(:func:`~shockwave.predictor.predict_from_truth`, a sanity check: error 0, accuracy 1).

The paper reports about 6% regime-length error and 84% run-time accuracy on average. Every job
weighs the same at every point, so the overall means are the means of the per-point means.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

import numpy as np

from shockwave.model import AdaptationMode, Regime
from shockwave.predictor import (
    Prediction,
    PredictorParams,
    predict,
    predict_from_truth,
    predict_greedy,
)
from shockwave.snapshot import ActiveJob, JobProgress
from shockwave.workload import SimJob, Workload

PROGRESS_PERCENTS: tuple[int, ...] = tuple(range(0, 100, 10))
"""Where each job is looked at, in percent of its epochs."""

DYNAMIC_MODES: frozenset[AdaptationMode] = frozenset({AdaptationMode.ACCORDION, AdaptationMode.GNS})


class Predictor(StrEnum):
    RESTATEMENT = "restatement"
    GREEDY = "greedy"
    ORACLE = "oracle"


_PREDICT: Mapping[Predictor, Callable[[ActiveJob, SimJob, PredictorParams], Prediction]] = {
    Predictor.RESTATEMENT: lambda view, _job, params: predict(view, params),
    Predictor.GREEDY: lambda view, _job, params: predict_greedy(view, params),
    Predictor.ORACLE: lambda view, job, _params: predict_from_truth(
        view, job.trajectory, job.epoch_seconds
    ),
}


@dataclass(frozen=True, slots=True)
class Accuracy:
    """``regime_error``: regime-length error (share of E); ``runtime_accuracy``: 1 - relative
    error of the predicted exclusive run time. For one prediction, or a mean over several."""

    regime_error: float
    runtime_accuracy: float

    def as_dict(self) -> dict[str, float]:
        return {"regime_error": self.regime_error, "runtime_accuracy": self.runtime_accuracy}


@dataclass(frozen=True, slots=True)
class ProgressRow:
    """Means over the ``jobs`` dynamic jobs at ``percent`` % of their epochs, per predictor."""

    percent: int
    jobs: int
    accuracy: Mapping[Predictor, Accuracy]


@dataclass(frozen=True, slots=True)
class PredictionReport:
    """The whole report. ``jobs``: dynamic jobs scored; ``adapting_jobs``: those of them whose
    true trajectory has more than one regime (a job may declare a dynamic mode and never change
    batch size); ``rows``: one per progress point; ``overall``: means over every job and point;
    ``adapting``: the same over the adapting jobs only; ``by_mode``: the same per adaptation
    mode. Empty rows and means when the workload has no dynamic job."""

    workload: str
    jobs: int
    adapting_jobs: int
    rows: tuple[ProgressRow, ...]
    overall: Mapping[Predictor, Accuracy]
    adapting: Mapping[Predictor, Accuracy]
    by_mode: Mapping[AdaptationMode, Mapping[Predictor, Accuracy]]

    def overall_oracle(self) -> Accuracy:
        return self.overall.get(Predictor.ORACLE, Accuracy(0.0, 1.0))

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: ``{workload, jobs, adapting_jobs, progress: [{percent, jobs,
        <predictor>: {regime_error, runtime_accuracy}}], overall: {<predictor>: {...}},
        adapting: {<predictor>: {...}}, by_mode: {<mode>: {<predictor>: {...}}}}``."""
        return {
            "workload": self.workload,
            "jobs": self.jobs,
            "adapting_jobs": self.adapting_jobs,
            "progress": [
                {
                    "percent": row.percent,
                    "jobs": row.jobs,
                    **{str(p): a.as_dict() for p, a in row.accuracy.items()},
                }
                for row in self.rows
            ],
            "overall": {str(p): a.as_dict() for p, a in self.overall.items()},
            "adapting": {str(p): a.as_dict() for p, a in self.adapting.items()},
            "by_mode": {
                str(mode): {str(p): a.as_dict() for p, a in means.items()}
                for mode, means in self.by_mode.items()
            },
        }


def observed_job(job: SimJob, epochs_done: float) -> ActiveJob:
    """``job`` as a scheduler sees it after ``epochs_done`` epochs of its true trajectory.

    As in the simulator: a regime that ends at or before the point is observed (the job moves to
    the next regime the moment one ends), the current batch size is that of the regime holding
    the point, and epoch times are measured at the batch sizes of regimes that started before it.
    ``epochs_done`` must be in [0, E): a finished job is no longer active.
    """
    if not 0 <= epochs_done < job.spec.epochs:
        raise ValueError(f"epochs_done must be in [0, {job.spec.epochs}), got {epochs_done}")
    observed: list[Regime] = []
    measured: dict[int, float] = {}
    current = job.trajectory[-1].batch_size
    start = 0
    for regime in job.trajectory:
        if start < epochs_done:
            measured[regime.batch_size] = job.epoch_seconds[regime.batch_size]
        if start + regime.epochs > epochs_done:
            current = regime.batch_size
            break
        observed.append(regime)
        start += regime.epochs
    progress = JobProgress(
        batch_size=current,
        epochs_done=epochs_done,
        observed_regimes=tuple(observed),
        measured_epoch_seconds=measured,
    )
    return ActiveJob(spec=job.spec, progress=progress)


def regime_length_error(
    predicted: Sequence[float], true: Sequence[int], total_epochs: int
) -> float:
    """Mean over the true regimes of |predicted_i - true_i| / E (a missing predicted_i is 0)."""
    terms = [
        abs((predicted[i] if i < len(predicted) else 0.0) - epochs) / total_epochs
        for i, epochs in enumerate(true)
    ]
    return float(np.mean(terms))


def runtime_accuracy(predicted_s: float, true_s: float) -> float:
    """1 - |P_hat - P| / P."""
    return 1.0 - abs(predicted_s - true_s) / true_s


def score(prediction: Prediction, job: SimJob) -> Accuracy:
    """How ``prediction`` of the whole trajectory compares with ``job``'s truth."""
    return Accuracy(
        regime_error=regime_length_error(
            [r.epochs for r in prediction.regimes],
            [r.epochs for r in job.trajectory],
            job.spec.epochs,
        ),
        runtime_accuracy=runtime_accuracy(prediction.total_seconds, job.t_exclusive_s),
    )


def score_job(
    job: SimJob, percent: int, params: PredictorParams | None = None
) -> dict[Predictor, Accuracy]:
    """Each predictor's accuracy on ``job`` seen at ``percent`` % of its epochs."""
    params = params or PredictorParams()
    view = observed_job(job, job.spec.epochs * percent / 100)
    return {p: score(make(view, job, params), job) for p, make in _PREDICT.items()}


def prediction_report(
    workload: Workload,
    params: PredictorParams | None = None,
    percents: Sequence[int] = PROGRESS_PERCENTS,
) -> PredictionReport:
    """Score every dynamic job of ``workload`` at each of ``percents`` (see the module doc)."""
    jobs = [job for job in workload.jobs if job.spec.mode in DYNAMIC_MODES]
    per_job = [[score_job(job, pct, params) for pct in percents] for job in jobs]
    rows = tuple(
        ProgressRow(pct, len(jobs), _means([scores[i] for scores in per_job]))
        for i, pct in enumerate(percents)
        if jobs
    )
    scored = list(zip(jobs, per_job, strict=True))
    adapting = [s for job, scores in scored if len(job.trajectory) > 1 for s in scores]
    by_mode = {
        mode: _means([s for job, scores in scored if job.spec.mode is mode for s in scores])
        for mode in sorted({job.spec.mode for job in jobs})
    }
    return PredictionReport(
        workload=workload.name,
        jobs=len(jobs),
        adapting_jobs=sum(1 for job in jobs if len(job.trajectory) > 1),
        rows=rows,
        overall=_means([s for scores in per_job for s in scores]),
        adapting=_means(adapting),
        by_mode=MappingProxyType(by_mode),
    )


def _means(scores: Sequence[Mapping[Predictor, Accuracy]]) -> Mapping[Predictor, Accuracy]:
    """Mean accuracy per predictor over ``scores`` (empty when there is none)."""
    if not scores:
        return MappingProxyType({})
    return MappingProxyType(
        {
            p: Accuracy(
                regime_error=float(np.mean([s[p].regime_error for s in scores])),
                runtime_accuracy=float(np.mean([s[p].runtime_accuracy for s in scores])),
            )
            for p in Predictor
        }
    )
