"""How well a job's future is predicted as it runs (the paper's "modeling error" figure).

For every job whose declared mode adapts its batch size (accordion, gns), walk its true trajectory
to the progress points 0%, 10%, ..., 90% of its epochs. At each point build the
:class:`~shockwave.domain.snapshot.ActiveJob` a scheduler would see there (:func:`observed_job`),
predict its trajectory with each :class:`Predictor` and compare with the truth:

- regime-length error: the mean over the job's true regimes of |predicted epochs of regime i -
  true epochs of regime i| / E, regimes aligned by index. A true regime the prediction lacks
  counts its whole length; a predicted regime past the true ones adds no term of its own (both
  trajectories sum to E, so its epochs are missing from the aligned regimes' terms).
- run-time accuracy: 1 - |P_hat - P| / P, with P the job's exclusive run time (all its epochs,
  the part already run included) and P_hat the predicted one. Not clipped: it falls below 0 when
  P_hat is more than twice P.
- throughput error (when the users do not declare exact throughputs): the mean relative error
  |estimated - true| / true of the epoch time at each batch size of the job's true trajectory it
  has not run at yet.

Predictors: ``restatement`` (the paper's rule, one prior for every job), ``population`` (the
empirical-Bayes predictor: the paper's rule updated by what finished jobs did, what the Shockwave
policy plans with by default: :data:`POLICY_PREDICTOR`), ``greedy`` (the rest of the job at its
latest batch size and throughput, what reactive schedulers assume) and ``oracle``
(:func:`~shockwave.prediction.predictor.predict_from_truth`, a sanity check: error 0, accuracy 1).

**No look-ahead.** The population prior at a point is learnt only from the jobs that have
finished by then, and the measured rates only from the epochs jobs have run by then, on a
timeline where each job runs from its arrival,
``slowdown`` times slower than alone (1: every job alone on its GPUs; a contended cluster is
nearer its mean slowdown). The job reaches p% of its epochs at arrival + slowdown x (time to run
them alone) and finishes at arrival + slowdown x t_exclusive. In a simulation the policy learns
from the jobs that really finished (:mod:`shockwave.simulation.simulator`).

The paper reports about 6% regime-length error and 84% run-time accuracy on average. Every job
weighs the same at every point, so the overall means are the means of the per-point means.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

import numpy as np

from shockwave.domain.model import AdaptationMode, Regime
from shockwave.domain.population import (
    EMPTY_PRIOR,
    DeclarationErrors,
    FinishedJob,
    PopulationPrior,
    RateKey,
    declaration_pairs,
)
from shockwave.domain.snapshot import ActiveJob, JobProgress
from shockwave.prediction.population_predictor import PopulationParams
from shockwave.prediction.predictor import Prediction, PredictorParams, predict_from_truth
from shockwave.prediction.regime_predictors import DEFAULT_REGIME_PREDICTOR, REGIME_PREDICTORS
from shockwave.prediction.throughput_model import ThroughputModel
from shockwave.workloads.workload import SimJob, Workload

PROGRESS_PERCENTS: tuple[int, ...] = tuple(range(0, 100, 10))
"""Where each job is looked at, in percent of its epochs."""

DYNAMIC_MODES: frozenset[AdaptationMode] = frozenset({AdaptationMode.ACCORDION, AdaptationMode.GNS})


class Predictor(StrEnum):
    RESTATEMENT = "restatement"
    POPULATION = "population"
    GREEDY = "greedy"
    ORACLE = "oracle"


class HeldOut(StrEnum):
    """What a leave-one-model-out report withholds of the held-out model's jobs.

    ``never-seen``: the population prior never learns one of them, the whole trace long (the
    other models' jobs are learnt as they finish): a model no job of which ever finishes, so
    every prediction of it is the fallback of a model never seen. ``new``: a model new to a
    cluster with a history: the prior starts with every other model's finished jobs (the whole
    trace's) and learns the held-out model's own jobs as they finish, as a deployment does
    from a new model's first finished jobs on. In both, the throughput model learns every
    job's measured epoch times as they are measured (a scheduler times a running job whatever
    its model; in ``new``, the other models' from the start)."""

    NEVER_SEEN = "never-seen"
    NEW = "new"


POLICY_PREDICTOR = Predictor(DEFAULT_REGIME_PREDICTOR)
"""The predictor the Shockwave policy plans with by default."""


@dataclass(frozen=True, slots=True)
class Knowledge:
    """What a scheduler has learnt by the time of a prediction: the population prior and the
    throughput model built from it."""

    prior: PopulationPrior
    rates: ThroughputModel


NO_KNOWLEDGE = Knowledge(EMPTY_PRIOR, ThroughputModel({}))

PredictFn = Callable[[ActiveJob, SimJob, Knowledge, PredictorParams], Prediction]


def _learnt(name: str) -> PredictFn:
    predictor = REGIME_PREDICTORS[name]
    population = PopulationParams()
    return lambda view, _job, known, params: predictor(
        view, known.prior, known.rates, params, population
    )


_PREDICT: Mapping[Predictor, PredictFn] = {
    Predictor.RESTATEMENT: _learnt("restatement"),
    Predictor.POPULATION: _learnt("population"),
    Predictor.GREEDY: _learnt("greedy"),
    Predictor.ORACLE: lambda view, job, _known, _params: predict_from_truth(
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
    """Means over the ``jobs`` dynamic jobs at ``percent`` % of their epochs, per predictor;
    ``throughput_error``: the mean over the jobs with a batch size still to run at (None when
    there is none)."""

    percent: int
    jobs: int
    accuracy: Mapping[Predictor, Accuracy]
    throughput_error: float | None = None


@dataclass(frozen=True, slots=True)
class PredictionReport:
    """The whole report. ``jobs``: dynamic jobs scored; ``adapting_jobs``: those of them whose
    true trajectory has more than one regime (a job may declare a dynamic mode and never change
    batch size); ``rows``: one per progress point; ``overall``: means over every job and point;
    ``adapting``: the same over the adapting jobs only; ``by_mode``: the same per adaptation
    mode; ``policy_predictor``: the predictor the Shockwave policy plans with;
    ``throughput_knowledge``: what the users declared (``declared``, ``noisy:P``, ``none``);
    ``throughput_error``: the mean throughput error over every point that has one. Empty rows
    and means when the workload has no dynamic job."""

    workload: str
    jobs: int
    adapting_jobs: int
    rows: tuple[ProgressRow, ...]
    overall: Mapping[Predictor, Accuracy]
    adapting: Mapping[Predictor, Accuracy]
    by_mode: Mapping[AdaptationMode, Mapping[Predictor, Accuracy]]
    policy_predictor: Predictor = POLICY_PREDICTOR
    throughput_knowledge: str = "declared"
    throughput_error: float | None = None
    slowdown: float = 1.0

    def overall_oracle(self) -> Accuracy:
        return self.overall.get(Predictor.ORACLE, Accuracy(0.0, 1.0))

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: ``{workload, policy_predictor, throughput_knowledge, slowdown, jobs,
        adapting_jobs, progress: [{percent, jobs, <predictor>: {regime_error,
        runtime_accuracy}, throughput_error?}], overall: {<predictor>: {...}}, adapting:
        {<predictor>: {...}}, by_mode: {<mode>: {<predictor>: {...}}}, throughput_error?}``;
        the throughput errors only when throughputs are not declared exactly."""
        estimated = self.throughput_knowledge != "declared"
        return {
            "workload": self.workload,
            "policy_predictor": str(self.policy_predictor),
            "throughput_knowledge": self.throughput_knowledge,
            "slowdown": self.slowdown,
            "jobs": self.jobs,
            "adapting_jobs": self.adapting_jobs,
            "progress": [
                {
                    "percent": row.percent,
                    "jobs": row.jobs,
                    **{str(p): a.as_dict() for p, a in row.accuracy.items()},
                    **({"throughput_error": row.throughput_error} if estimated else {}),
                }
                for row in self.rows
            ],
            "overall": {str(p): a.as_dict() for p, a in self.overall.items()},
            "adapting": {str(p): a.as_dict() for p, a in self.adapting.items()},
            "by_mode": {
                str(mode): {str(p): a.as_dict() for p, a in means.items()}
                for mode, means in self.by_mode.items()
            },
            **({"throughput_error": self.throughput_error} if estimated else {}),
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
    """Mean over the true regimes of |predicted_i - true_i| / E (a missing predicted_i is 0),
    summed in order (as numpy's mean sums so few terms: the same float), without numpy, since a
    simulation scores every prediction its policy reads (:class:`AtUse`)."""
    total = 0.0
    for i, epochs in enumerate(true):
        total += abs((predicted[i] if i < len(predicted) else 0.0) - epochs) / total_epochs
    return total / len(true)


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


@dataclass(slots=True)
class AtUse:
    """Predictions scored at the moment of use: every trajectory a policy read of a dynamic job
    (accordion, gns: the jobs the progress grid scores) for a decision
    (:attr:`shockwave.policies.policy.Decision.predictions`), against the job's truth
    (:func:`score`); a simulation adds each decision's (:meth:`add`). Every read weighs the
    same, so a job predicted at many decisions (one that waits, or runs long) weighs more, as
    it does in the policy's choices. ``as_dict``: ``{uses, regime_error, runtime_accuracy}``
    (the means; None when nothing was read)."""

    uses: int = 0
    regime_error_sum: float = 0.0
    runtime_accuracy_sum: float = 0.0

    def add(self, predictions: Mapping[str, Prediction], jobs: Mapping[str, SimJob]) -> None:
        for job_id, prediction in predictions.items():
            job = jobs[job_id]
            if job.spec.mode not in DYNAMIC_MODES:
                continue
            accuracy = score(prediction, job)
            self.uses += 1
            self.regime_error_sum += accuracy.regime_error
            self.runtime_accuracy_sum += accuracy.runtime_accuracy

    def mean(self) -> Accuracy | None:
        if not self.uses:
            return None
        return Accuracy(self.regime_error_sum / self.uses, self.runtime_accuracy_sum / self.uses)

    def as_dict(self) -> dict[str, float | int | None]:
        mean = self.mean()
        return {
            "uses": self.uses,
            "regime_error": None if mean is None else mean.regime_error,
            "runtime_accuracy": None if mean is None else mean.runtime_accuracy,
        }


def score_job(
    job: SimJob,
    percent: int,
    params: PredictorParams | None = None,
    known: Knowledge = NO_KNOWLEDGE,
) -> dict[Predictor, Accuracy]:
    """Each predictor's accuracy on ``job`` seen at ``percent`` % of its epochs, knowing
    ``known`` (default: no finished job)."""
    params = params or PredictorParams()
    view = observed_job(job, job.spec.epochs * percent / 100)
    return {p: score(make(view, job, known, params), job) for p, make in _PREDICT.items()}


def throughput_error(job: SimJob, percent: int, rates: ThroughputModel) -> float | None:
    """Mean relative error of the estimated epoch time at each batch size of ``job``'s true
    trajectory it has not run at by ``percent`` % of its epochs; None when it has run at all."""
    view = observed_job(job, job.spec.epochs * percent / 100)
    unseen = sorted(
        {r.batch_size for r in job.trajectory} - set(view.progress.measured_epoch_seconds)
    )
    if not unseen:
        return None
    errors = []
    for batch_size in unseen:
        true = job.epoch_seconds[batch_size]
        estimate = rates.epoch_time(view, batch_size)
        guess = PredictorParams().unknown_epoch_seconds if estimate is None else estimate.seconds
        errors.append(abs(guess - true) / true)
    return float(np.mean(errors))


def prediction_report(
    workload: Workload,
    params: PredictorParams | None = None,
    percents: Sequence[int] = PROGRESS_PERCENTS,
    *,
    slowdown: float = 1.0,
    throughput_knowledge: str = "declared",
    held_out_model: str | None = None,
    held_out: HeldOut = HeldOut.NEVER_SEEN,
) -> PredictionReport:
    """Score every dynamic job of ``workload`` at each of ``percents`` (see the module doc),
    each prediction knowing only the jobs finished by then on the ``slowdown`` timeline.
    ``throughput_knowledge`` labels what the workload's specs declare (the caller applied it:
    :func:`shockwave.workloads.throughput_knowledge.apply_knowledge`). With ``held_out_model``, only
    the jobs of that model are scored, and the population prior learns them as ``held_out``
    says: never, or only as they finish, after a history of every other model's jobs."""
    if not slowdown >= 1:
        raise ValueError(f"slowdown must be >= 1, got {slowdown}")
    jobs = [
        job
        for job in workload.jobs
        if job.spec.mode in DYNAMIC_MODES
        and (held_out_model is None or job.spec.model == held_out_model)
    ]
    scores: dict[tuple[int, int], dict[Predictor, Accuracy]] = {}
    rate_errors: dict[tuple[int, int], float] = {}
    index = {id(job): i for i, job in enumerate(jobs)}
    withheld = None if held_out_model is None else (held_out_model, held_out)
    for known, job, percent in _timeline(workload, jobs, percents, slowdown, withheld):
        key = (index[id(job)], percent)
        scores[key] = score_job(job, percent, params, known)
        error = throughput_error(job, percent, known.rates)
        if error is not None:
            rate_errors[key] = error
    per_job = [[scores[(i, pct)] for pct in percents] for i in range(len(jobs))]
    rows = tuple(
        ProgressRow(
            pct,
            len(jobs),
            _means([scores[i] for scores in per_job]),
            _mean_or_none([e for (_, p), e in rate_errors.items() if p == pct]),
        )
        for i, pct in enumerate(percents)
        if jobs
    )
    scored = list(zip(jobs, per_job, strict=True))
    adapting = [s for job, scores in scored if len(job.trajectory) > 1 for s in scores]
    by_mode = {
        mode: _means([s for job, scores in scored if job.spec.mode is mode for s in scores])
        for mode in sorted({job.spec.mode for job in jobs})
    }
    point_errors = [row.throughput_error for row in rows if row.throughput_error is not None]
    return PredictionReport(
        workload=workload.name,
        jobs=len(jobs),
        adapting_jobs=sum(1 for job in jobs if len(job.trajectory) > 1),
        rows=rows,
        overall=_means([s for scores in per_job for s in scores]),
        adapting=_means(adapting),
        by_mode=MappingProxyType(by_mode),
        throughput_knowledge=throughput_knowledge,
        throughput_error=_mean_or_none(point_errors),
        slowdown=slowdown,
    )


def leave_one_model_out(
    workload: Workload,
    params: PredictorParams | None = None,
    percents: Sequence[int] = PROGRESS_PERCENTS,
    *,
    slowdown: float = 1.0,
    throughput_knowledge: str = "declared",
    held_out: HeldOut = HeldOut.NEVER_SEEN,
) -> dict[str, PredictionReport]:
    """One report per model of the workload's dynamic jobs, each scoring that model's jobs with
    a prior built without that model (:func:`prediction_report`, ``held_out_model``; what of it
    the prior withholds: ``held_out``): how the predictors do on a model never seen before, or
    new to the cluster. Keyed by model name, sorted."""
    models = sorted(
        {
            job.spec.model
            for job in workload.jobs
            if job.spec.mode in DYNAMIC_MODES and job.spec.model
        }
    )
    return {
        model: prediction_report(
            workload,
            params,
            percents,
            slowdown=slowdown,
            throughput_knowledge=throughput_knowledge,
            held_out_model=model,
            held_out=held_out,
        )
        for model in models
    }


def held_out_means(reports: Mapping[str, PredictionReport]) -> Mapping[Predictor, Accuracy]:
    """Each predictor's accuracy averaged over the held-out models of
    :func:`leave_one_model_out` (every model weighs the same, whatever its job count)."""
    return _means([report.overall for report in reports.values() if report.overall])


def held_out_as_dict(reports: Mapping[str, PredictionReport]) -> dict[str, object]:
    """JSON-ready: ``{models: {<model>: {jobs, adapting_jobs, overall: {<predictor>:
    {regime_error, runtime_accuracy}}}}, mean: {<predictor>: {...}}}``."""
    return {
        "models": {
            model: {
                "jobs": report.jobs,
                "adapting_jobs": report.adapting_jobs,
                "overall": {str(p): a.as_dict() for p, a in report.overall.items()},
            }
            for model, report in reports.items()
        },
        "mean": {str(p): a.as_dict() for p, a in held_out_means(reports).items()},
    }


def finished_job(job: SimJob) -> FinishedJob:
    """What a scheduler knows of ``job`` once it has finished: its whole observed trajectory
    and the epoch times it measured."""
    return FinishedJob(job.spec, job.trajectory, job.epoch_seconds)


def _timeline(
    workload: Workload,
    jobs: Sequence[SimJob],
    percents: Sequence[int],
    slowdown: float,
    withheld: tuple[str, HeldOut] | None = None,
) -> list[tuple[Knowledge, SimJob, int]]:
    """Each (job, percent) to score with what is known at its time: the jobs finished at or
    before it (learnt in the order they finished), the epoch times measured by then (a job
    measures a batch size once it has run its first epoch at it) and how far the declared rates
    were from them. ``withheld``: a model and what of it the prior withholds (:class:`HeldOut`):
    never one of its finished jobs, or every other model's jobs known from the start."""
    events: list[tuple[float, int, int, int]] = []
    for i, job in enumerate(workload.jobs):
        start = 0
        for regime in job.trajectory:
            first_epoch = _seconds_to(job, start + 1) if regime.epochs else 0.0
            events.append((job.spec.arrival_s + slowdown * first_epoch, 0, i, regime.batch_size))
            start += regime.epochs
        events.append((job.spec.arrival_s + slowdown * job.t_exclusive_s, 1, i, 0))
    learning = _Learning(workload)
    if withheld is not None and withheld[1] is HeldOut.NEW:
        history = {i for i, job in enumerate(workload.jobs) if job.spec.model != withheld[0]}
        for _, kind, i, value in sorted(e for e in events if e[2] in history):
            learning.learn(kind, i, value)
        events = [e for e in events if e[2] not in history]
    never = withheld[0] if withheld is not None and withheld[1] is HeldOut.NEVER_SEEN else None
    for i, job in enumerate(jobs):
        for pct in percents:
            at = job.spec.arrival_s + slowdown * _seconds_to(job, job.spec.epochs * pct / 100)
            events.append((at, 2, i, pct))
    timeline: list[tuple[Knowledge, SimJob, int]] = []
    for _, kind, i, value in sorted(events):
        if kind == 2:
            timeline.append((learning.known(), jobs[i], value))
        elif kind == 0 or never is None or workload.jobs[i].spec.model != never:
            learning.learn(kind, i, value)
    return timeline


class _Learning:
    """What a scheduler has learnt of ``workload``'s jobs so far (:func:`_timeline`): the
    population prior, the measured rates and the declaration errors, as :class:`Knowledge`
    (made again only after something new was learnt)."""

    def __init__(self, workload: Workload) -> None:
        self._jobs = workload.jobs
        self._prior = EMPTY_PRIOR
        self._sums: dict[RateKey, list[float]] = {}
        self._declarations = DeclarationErrors()
        self._known: Knowledge | None = NO_KNOWLEDGE

    def learn(self, kind: int, i: int, batch_size: int) -> None:
        """Job ``i``'s first epoch at ``batch_size`` (``kind`` 0), or its finish (1)."""
        job = self._jobs[i]
        if kind == 0:
            spec, seconds = job.spec, job.epoch_seconds[batch_size]
            if spec.model:
                self._sums.setdefault((spec.model, spec.gpus, batch_size), []).append(
                    spec.samples_per_epoch / seconds
                )
            self._declarations = self._declarations.add(
                declaration_pairs(spec, {batch_size: seconds})
            )
        else:
            self._prior = self._prior.learn(finished_job(job))
        self._known = None

    def known(self) -> Knowledge:
        if self._known is None:
            rates = {key: float(np.mean(values)) for key, values in self._sums.items()}
            self._known = Knowledge(
                self._prior, ThroughputModel(rates, declarations=self._declarations)
            )
        return self._known


def _seconds_to(job: SimJob, epochs: float) -> float:
    """Seconds ``job`` needs alone to run its first ``epochs`` epochs."""
    seconds, start = 0.0, 0
    for regime in job.trajectory:
        part = min(float(regime.epochs), max(0.0, epochs - start))
        seconds += part * job.epoch_seconds[regime.batch_size]
        start += regime.epochs
    return seconds


def _mean_or_none(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


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
