"""Seconds per epoch where a job has not run yet: measured, not given.

A user rarely knows how fast a batch size runs before the job has run at it, and never how fast
it runs on a GPU count it has not used. The scheduler does know what it has measured: the epoch
times of every job it ran, active or finished. :class:`ThroughputModel` estimates a job's epoch
time at a batch size (and GPU count) from that, in this order, first that applies:

1. ``measured``: the job's own epoch time at that batch size.
2. ``population`` (ratio): the job's own measurement at another size, scaled by the ratio of the
   rates other jobs of its model measured at the two sizes. A ratio transfers between jobs of
   one model far better than an absolute rate (another dataset, another input pipeline).
   Where jobs of one shape run at different speeds (a measured spread,
   :attr:`ThroughputModel.speed_variance` > 0), the ratio is the mean of the ratios of the
   jobs, finished (the prior's size steps) or active, that measured both sizes, where any did
   (:attr:`ThroughputModel.ratios`): the
   ratio of two means averages different jobs at each size, so a slow job's speed carried
   to a size that mostly fast jobs have reached comes out short (one job measured at its
   first size was estimated at 10,000 s left against a true 12,560 s). Without a spread the
   two ratios are the same and the mean of rates is kept.
3. ``population`` (rate): what other jobs of its model measured at that size and GPU count.
4. ``declared``: the user's declared throughput profile, as far as declarations have proven
   right: where a measurement-based estimate (step 5) exists too, the two are averaged in log
   space, each weighted by the inverse of its error variance, learnt from the data: for
   declarations, the squared log ratio of declared to measured rates over every job that has
   both (finished jobs, through the population prior, and running ones); for the scaling law,
   its error predicting each measured rate from the next smaller size of the same series. Exact
   declarations soon weigh all; declarations off by 30% weigh about as much as the law.
5. ``scaled``: the job's own measurement (else its declared rate at another size, else the
   nearest rate measured for its model) scaled by power laws: samples/s grow as
   batch size ** alpha and as GPUs ** beta. alpha and beta are fitted to the measured rates
   (per model when it has two sizes or widths, else over all models), starting from the priors
   in :class:`ThroughputModelParams`.
Nothing applies to a job without a measurement, a declaration or a measured model: the caller
decides the guess (the predictor's ``unknown_epoch_seconds``).

The model is rebuilt at every decision from the population prior's rates (finished jobs) and the
snapshot's active jobs; nothing here reads the jobs' true epoch times.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from shockwave.domain.memo import IdentityMemo
from shockwave.domain.model import JobSpec
from shockwave.domain.population import (
    EMPTY_PRIOR,
    DeclarationErrors,
    PopulationPrior,
    RateKey,
    StepKey,
    declaration_pairs,
    size_steps,
)
from shockwave.domain.snapshot import ActiveJob

_PRIOR_PRECISION = 1.0
_SPREAD_RESOLUTION = 1e-6
"""The least speed spread (standard deviation of log rates) taken for real: rates computed
from equal epoch times differ in their last bits, and a spread of 1e-15 is not a spread."""

Source = Literal["measured", "population", "declared", "scaled"]


@dataclass(frozen=True, slots=True)
class ThroughputModelParams:
    """Priors of the scaling laws.

    ``batch_exponent``: alpha in samples/s ~ batch size ** alpha until rates are measured
    (0: a bigger batch runs no more samples per second; 1: perfectly). ``gpu_exponent``: beta in
    samples/s ~ GPUs ** beta. ``declaration_variance`` and ``law_variance``: the prior error
    variances (squared log ratio) of a declared rate, and of the law per squared unit of log
    size ratio, each worth one observation (0.04: off by about 20%; 0.09: alpha uncertain by
    about 0.3). ``unseen_caution``: z of the cautious run time of a job that has measured
    nothing yet: its estimate times e^(z sigma), sigma the spread of speeds measured among jobs
    of one model, batch size and width (:attr:`ThroughputModel.speed_variance`); 1.645: as slow
    as one job in twenty. 0 when jobs of a shape all run alike, as in the reference traces.
    """

    batch_exponent: float = 0.3
    gpu_exponent: float = 0.8
    declaration_variance: float = 0.04
    law_variance: float = 0.09
    unseen_caution: float = 1.645

    def __post_init__(self) -> None:
        if not (math.isfinite(self.unseen_caution) and self.unseen_caution >= 0):
            raise ValueError(f"unseen_caution must be >= 0, got {self.unseen_caution!r}")
        for name in ("batch_exponent", "gpu_exponent"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 1):
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        for name in ("declaration_variance", "law_variance"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class EpochTime:
    """An estimate: ``seconds`` per epoch and where it comes from."""

    seconds: float
    source: Source


class ThroughputModel:
    """Epoch-time estimates from measured rates (see the module docstring).

    ``rates``: mean samples/s measured at each (model, GPUs, batch size); ``declarations``:
    how far declared rates were from measured ones; ``speed_variance``: the spread of speeds
    among jobs of one shape (:func:`_speed_variance`); ``ratios``: the mean log ratio
    log(rate at b / rate at a) of the jobs, finished or active, that measured both sizes, by
    (model, GPUs, a, b)
    (:meth:`build` fills it only where ``speed_variance`` > 0; see the module docstring, step 2).
    """

    def __init__(
        self,
        rates: Mapping[RateKey, float],
        params: ThroughputModelParams | None = None,
        declarations: DeclarationErrors | None = None,
        speed_variance: float = 0.0,
        ratios: Mapping[StepKey, float] | None = None,
    ) -> None:
        self.params = params or ThroughputModelParams()
        self.ratios = dict(ratios or {})
        self.rates = dict(rates)
        self._by_model: dict[str, list[RateKey]] = defaultdict(list)
        for key in self.rates:
            self._by_model[key[0]].append(key)
        self._alpha = _fit_exponents(self.rates, "batch", self.params.batch_exponent)
        self._beta = _fit_exponents(self.rates, "gpus", self.params.gpu_exponent)
        seen = declarations or DeclarationErrors()
        self.declaration_variance = (self.params.declaration_variance + seen.sum_sq) / (
            1 + seen.count
        )
        self.law_variance = self._law_variance()
        self.speed_variance = speed_variance

    def unseen_factor(self, job: ActiveJob) -> float:
        """How much longer than estimated a cautious planner should take ``job`` to run:
        1 once it has measured an epoch time, else e^(z sigma) (``unseen_caution``, the
        measured speed spread): an estimate from other jobs is their typical speed, and a job
        that turns out slow and waits unrun would never show it."""
        if job.progress.measured_epoch_seconds or self.speed_variance <= 0:
            return 1.0
        return math.exp(self.params.unseen_caution * math.sqrt(self.speed_variance))

    @classmethod
    def build(
        cls,
        prior: PopulationPrior = EMPTY_PRIOR,
        jobs: Iterable[ActiveJob] = (),
        params: ThroughputModelParams | None = None,
    ) -> ThroughputModel:
        """The model of what ``prior`` (finished jobs) and ``jobs`` (active ones) measured and
        how far their declarations were from it. The same prior, params and per-job terms
        (:func:`_measured_rates`, the very objects, in order) give the same model without
        summing again: between arrivals, finishes and new measurements every round asks that."""
        parts = tuple(_measured_rates(job) for job in jobs)
        return _BUILDS.get(
            (cls, prior, params, *parts), (), lambda: cls._summed(prior, parts, params)
        )

    @classmethod
    def _summed(
        cls,
        prior: PopulationPrior,
        parts: Sequence[_JobRates],
        params: ThroughputModelParams | None,
    ) -> ThroughputModel:
        """:meth:`build` from each active job's terms ``parts`` (:func:`_measured_rates`)."""
        sums: dict[RateKey, float] = {
            k: s.samples_per_second * s.jobs for k, s in prior.rates.items()
        }
        counts: dict[RateKey, int] = {k: s.jobs for k, s in prior.rates.items()}
        errors, sum_sq = prior.declarations.count, prior.declarations.sum_sq
        active_logs: dict[RateKey, list[float]] = defaultdict(list)
        steps = {k: (s.log_ratio_sum, s.jobs) for k, s in prior.steps.items()}
        for count, squares, measured, job_steps in parts:
            # the sums in the order DeclarationErrors.add takes them, job by job
            errors, sum_sq = errors + count, sum_sq + squares
            for key, rate, log_rate in measured:
                sums[key] = sums.get(key, 0.0) + rate
                counts[key] = counts.get(key, 0) + 1
                active_logs[key].append(log_rate)
            for step, log_ratio in job_steps:
                total, n = steps.get(step, (0.0, 0))
                steps[step] = (total + log_ratio, n + 1)
        declarations = DeclarationErrors(errors, sum_sq)
        rates = {k: sums[k] / counts[k] for k in sums if counts[k]}
        speed = _speed_variance(active_logs)
        # the same measurements give the same model object, so the predictions made with it
        # can be reused (shockwave.domain.memo); the key keeps the rates' order, which the fits
        # sum in
        ratios = {k: total / n for k, (total, n) in steps.items() if n} if speed > 0 else {}
        content = (tuple(rates.items()), declarations, speed, tuple(ratios.items()))
        return _MODELS.get(
            (params,), content, lambda: cls(rates, params, declarations, speed, ratios)
        )

    def alpha(self, model: str) -> float:
        return self._alpha.get(model, self._alpha.get("", self.params.batch_exponent))

    def beta(self, model: str) -> float:
        return self._beta.get(model, self._beta.get("", self.params.gpu_exponent))

    def epoch_time(
        self, job: ActiveJob, batch_size: int, gpus: int | None = None
    ) -> EpochTime | None:
        """Seconds per epoch of ``job`` at ``batch_size`` on ``gpus`` (default: its own); None
        when nothing is known of the job or its model."""
        spec = job.spec
        gpus = spec.gpus if gpus is None else gpus
        samples = spec.samples_per_epoch
        measured = job.progress.measured_epoch_seconds
        if gpus == spec.gpus and batch_size in measured:
            return EpochTime(measured[batch_size], "measured")
        target = self.rates.get((spec.model, gpus, batch_size)) if spec.model else None
        anchor = self._anchor(job, declared=False)
        if anchor is not None and target is not None:
            anchor_bs, anchor_seconds = anchor
            step = self.ratios.get((spec.model, spec.gpus, anchor_bs, batch_size))
            if step is not None and gpus == spec.gpus:
                return EpochTime(anchor_seconds / math.exp(step), "population")
            base = self.rates.get((spec.model, spec.gpus, anchor_bs))
            if base is not None:
                return EpochTime(anchor_seconds * base / target, "population")
        if target is not None:
            return EpochTime(samples / target, "population")
        if gpus == spec.gpus and spec.throughput.knows(batch_size):
            declared = spec.throughput.epoch_seconds(batch_size, samples)
            measured_law = self._scaled(job, batch_size, gpus, declared=False)
            return declared_or_blend(
                declared, self.declaration_variance, measured_law, self.law_variance
            )
        scaled = self._scaled(job, batch_size, gpus, declared=True)
        return None if scaled is None else EpochTime(scaled[0], "scaled")

    def _scaled(
        self, job: ActiveJob, batch_size: int, gpus: int, declared: bool
    ) -> tuple[float, float] | None:
        """The law's estimate (seconds) from the job's own epoch time (measured, else, if
        ``declared``, declared at another size), else from the nearest rate measured for its
        model; with the squared log distance it was scaled over. None when there is nothing
        to scale."""
        spec = job.spec
        anchor = self._anchor(job, declared=declared)
        if anchor is not None:
            anchor_bs, anchor_seconds = anchor
            factor = self._law(spec.model, anchor_bs, spec.gpus, batch_size, gpus)
            return anchor_seconds / factor, _log_distance(anchor_bs, spec.gpus, batch_size, gpus)
        keys = self._by_model.get(spec.model) if spec.model else None
        if not keys:
            return None
        key = min(keys, key=lambda k: (_log_distance(k[2], k[1], batch_size, gpus), k))
        rate = self.rates[key] * self._law(spec.model, key[2], key[1], batch_size, gpus)
        return spec.samples_per_epoch / rate, _log_distance(key[2], key[1], batch_size, gpus)

    def _law_variance(self) -> float:
        """Error variance of the batch-size law per squared unit of log size ratio: each
        measured rate predicted from the next smaller size of its (model, GPUs) series, with
        the prior ``law_variance`` worth one unit."""
        series: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
        for (model, gpus, batch_size), rate in self.rates.items():
            series[(model, gpus)].append((batch_size, rate))
        errors, spread = self.params.law_variance, 1.0
        for (model, _), points in series.items():
            points.sort()
            for (small, low), (large, high) in itertools.pairwise(points):
                step = math.log(large / small)
                errors += (math.log(high / low) - self.alpha(model) * step) ** 2
                spread += step * step
        return errors / spread

    def _anchor(self, job: ActiveJob, declared: bool) -> tuple[int, float] | None:
        """The job's own epoch time to scale from: measured (at its current batch size, else
        the largest it measured), else, if ``declared``, declared (at its current size, else the
        largest)."""
        current = job.progress.batch_size
        measured = job.progress.measured_epoch_seconds
        if measured:
            batch_size = current if current in measured else max(measured)
            return batch_size, measured[batch_size]
        rates = job.spec.throughput.samples_per_second
        if declared and rates:
            batch_size = current if current in rates else max(rates)
            return batch_size, job.spec.samples_per_epoch / rates[batch_size]
        return None

    def _law(self, model: str, from_bs: int, from_gpus: int, to_bs: int, to_gpus: int) -> float:
        """Samples/s at (to_bs, to_gpus) over samples/s at (from_bs, from_gpus), by the laws."""
        batch = math.pow(to_bs / from_bs, self.alpha(model))
        return batch * math.pow(to_gpus / from_gpus, self.beta(model))


Read = tuple[int | None, int | None, EpochTime | float | None]
"""One answer a model gave about a job: (batch size, GPUs, its :meth:`ThroughputModel.epoch_time`)
or (None, None, its :meth:`ThroughputModel.unseen_factor`)."""


class RecordingModel(ThroughputModel):
    """A throughput model that notes every answer it gives (:attr:`reads`), so that a result
    computed with it about one job can be reused with another model that gives that job the
    same answers (:func:`answers_alike`). It shares ``model``'s state and answers as it does."""

    def __init__(self, model: ThroughputModel) -> None:
        self.__dict__.update(model.__dict__)
        self.reads: list[Read] = []

    def epoch_time(
        self, job: ActiveJob, batch_size: int, gpus: int | None = None
    ) -> EpochTime | None:
        answer = super().epoch_time(job, batch_size, gpus)
        self.reads.append((batch_size, gpus, answer))
        return answer

    def unseen_factor(self, job: ActiveJob) -> float:
        answer = super().unseen_factor(job)
        self.reads.append((None, None, answer))
        return answer


def answers_alike(model: ThroughputModel, job: ActiveJob, reads: Sequence[Read]) -> bool:
    """Whether ``model`` gives ``job`` each answer of ``reads`` (a :class:`RecordingModel`'s,
    about the same job with the same progress)."""
    for batch_size, gpus, answer in reads:
        if batch_size is None:
            if model.unseen_factor(job) != answer:
                return False
        elif model.epoch_time(job, batch_size, gpus) != answer:
            return False
    return True


_MODELS: IdentityMemo[ThroughputModel] = IdentityMemo(limit=64)
"""Models by (params, rates, declaration errors): :meth:`ThroughputModel.build`."""


_JobRates = tuple[
    int, float, tuple[tuple[RateKey, float, float], ...], tuple[tuple[StepKey, float], ...]
]


def _measured_rates(job: ActiveJob) -> _JobRates:
    """What one active job adds to :meth:`ThroughputModel.build`: the number of its
    (declared, measured) pairs and the sum of their squared log ratios
    (:meth:`DeclarationErrors.add`'s terms), (key, rate, log rate) of each epoch time it
    measured, in its order (none for a job without a model), and its size steps
    (:func:`shockwave.domain.population.size_steps`). Memoized per (spec, measured
    times): a job's measurements change when it reaches a new batch size, not every round."""
    measured = job.progress.measured_epoch_seconds
    return _JOB_RATES.get(
        (job.spec,), tuple(measured.items()), lambda: _job_rates(job.spec, measured)
    )


def _job_rates(spec: JobSpec, measured: Mapping[int, float]) -> _JobRates:
    errors = [math.log(d / m) ** 2 for d, m in declaration_pairs(spec, measured) if d > 0 and m > 0]
    rates: list[tuple[RateKey, float, float]] = []
    if spec.model:
        for batch_size, seconds in measured.items():
            if seconds > 0 and math.isfinite(seconds):
                rate = spec.samples_per_epoch / seconds
                rates.append(((spec.model, spec.gpus, batch_size), rate, math.log(rate)))
    return len(errors), sum(errors), tuple(rates), tuple(size_steps(spec, measured))


_JOB_RATES: IdentityMemo[_JobRates] = IdentityMemo(limit=50_000)
"""Per (spec, measured epoch times): :func:`_measured_rates`."""
_BUILDS: IdentityMemo[ThroughputModel] = IdentityMemo(limit=64)
"""Models by (class, prior, params, each active job's :func:`_measured_rates`, the very
objects): :meth:`ThroughputModel.build`."""


def declared_or_blend(
    declared: float,
    declaration_variance: float,
    scaled: tuple[float, float] | None,
    law_variance: float,
) -> EpochTime:
    """The declared epoch time, blended in log space with the law's estimate ``scaled``
    (seconds, squared log distance) by inverse error variances; labelled by the larger
    weight."""
    if scaled is None:
        return EpochTime(declared, "declared")
    seconds, distance = scaled
    law = law_variance * max(distance, 1e-12)
    weight = (1 / declaration_variance) / (1 / declaration_variance + 1 / law)
    blended = math.exp(weight * math.log(declared) + (1 - weight) * math.log(seconds))
    return EpochTime(blended, "declared" if weight >= 0.5 else "scaled")


def _log_distance(from_bs: int, from_gpus: int, to_bs: int, to_gpus: int) -> float:
    """Squared log distance between two (batch size, GPUs) configurations."""
    return math.log(to_bs / from_bs) ** 2 + math.log(to_gpus / from_gpus) ** 2


def _fit_exponents(
    rates: Mapping[RateKey, float], axis: Literal["batch", "gpus"], prior: float
) -> dict[str, float]:
    """Power-law exponents of the rates along ``axis`` (batch size or GPUs), per model and
    over all models (key ""), by least squares on logs within each fixed other coordinate.
    The fit is shrunk towards ``prior`` (a Gaussian prior worth :data:`_PRIOR_PRECISION` of
    squared log spread: about two sizes a factor 4 apart), so two noisy points do not swing it.
    A model without two points along the axis gets no entry; with none at all, "" is ``prior``.
    Exponents are clipped to [0, 1]."""
    series: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for (model, gpus, batch_size), rate in rates.items():
        along, fixed = (batch_size, gpus) if axis == "batch" else (gpus, batch_size)
        series[(model, fixed)].append((math.log(along), math.log(rate)))
    moments: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (model, _), points in series.items():
        if len(points) < 2:
            continue
        xs, ys = np.array(points).T
        dx = xs - xs.mean()
        for name in (model, ""):
            moments[name][0] += float(dx @ (ys - ys.mean()))
            moments[name][1] += float(dx @ dx)
    fitted = {
        name: min(1.0, max(0.0, (cov + _PRIOR_PRECISION * prior) / (var + _PRIOR_PRECISION)))
        for name, (cov, var) in moments.items()
    }
    fitted.setdefault("", prior)
    return fitted


def _speed_variance(logs: Mapping[RateKey, list[float]]) -> float:
    """The spread of speeds among jobs of one shape: the pooled variance of log(rate / mean
    rate) over the (model, GPUs, batch size) keys of ``logs`` (the log rates the active jobs
    measured) that two or more jobs measured (0 when none did, or when they all measured the
    same, to rounding: a spread under :data:`_SPREAD_RESOLUTION` is the floats' noise)."""
    sum_sq, dof = 0.0, 0
    for values in logs.values():
        if len(values) > 1:
            mean = sum(values) / len(values)
            sum_sq += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    variance = sum_sq / dof if dof else 0.0
    return variance if variance > _SPREAD_RESOLUTION**2 else 0.0
