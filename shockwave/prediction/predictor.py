"""Bayesian prediction of a job's future batch-size regimes (paper section 5).

A job may go through at most K regimes. The prior on the regimes' shares of the job's E epochs is
Dir(E/K, ..., E/K). When regime k ends after m_k observed epochs, the *restatement rule* sets the
posterior to Dir(m_1, ..., m_k, S_k, ..., S_k) with S_k = (E - sum m) / (K - k): the finished
regimes are what was observed, and the ongoing and future regimes split the remaining epochs
evenly. The scheduler uses the posterior mean as the job's single predicted trajectory.

One refinement (documented in docs/policy.md): when the ongoing regime has already run longer
than its share S_k, it is restated again at that point, i.e. it and the future regimes split
what is left after its observed epochs. Without it the prediction would say the regime has
already ended, which the job has just shown to be false.

Batch sizes of future regimes follow from the declared mode: ``accordion`` alternates between
its initial (small) size and its largest size; ``gns`` doubles up its ladder to the largest size
and never goes down; ``custom`` follows the declared list; ``static`` never changes. Seconds per
epoch at a batch size come from the throughput model (:mod:`shockwave.prediction.throughput_model`):
measurement when the job ran at it, else what other jobs of its model measured, else the declared
throughput profile, else the job's own measurement scaled by a power law, else a default.

This is the paper's predictor, one prior for every job.
:mod:`shockwave.prediction.population_predictor` starts each job from what the jobs that finished
before it did instead (empirical Bayes).

Only observed progress is read: :class:`~shockwave.domain.snapshot.ActiveJob` carries no future.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shockwave.domain.model import AdaptationMode, Regime
from shockwave.domain.snapshot import ActiveJob
from shockwave.prediction.throughput_model import ThroughputModel


@dataclass(frozen=True, slots=True)
class PredictorParams:
    """``accordion_regimes``: K for Accordion jobs (small -> large is 2). ``gns`` and ``custom``
    jobs take K from their ladder or list. ``unknown_epoch_seconds``: the guess for a job with no
    measurement and no declared throughput at all. ``restate_ongoing``: restate an ongoing regime
    that has outrun its share (the refinement in the module docstring); off, the plain rule (the
    population predictor rules such a prediction out instead)."""

    accordion_regimes: int = 2
    unknown_epoch_seconds: float = 60.0
    restate_ongoing: bool = True


@dataclass(frozen=True, slots=True)
class PredictedRegime:
    """A regime of the predicted trajectory: ``epochs`` (fractional) at ``batch_size``."""

    batch_size: int
    epochs: float
    epoch_seconds: float


@dataclass(frozen=True, slots=True)
class Prediction:
    """A job's predicted trajectory and where it stands on it.

    ``regimes``: the whole trajectory, past regimes as observed. ``current``: index of the
    ongoing regime. ``epochs_done``: finished epochs (the position on the trajectory).
    """

    regimes: tuple[PredictedRegime, ...]
    current: int
    epochs_done: float
    total_epochs: int
    _left: tuple[PredictedRegime, ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """:meth:`remaining_regimes`, computed when first asked (a prediction is immutable, and
    the policy asks for its rest several times a round)."""
    _remaining: float | None = field(default=None, init=False, repr=False, compare=False)
    """:attr:`remaining_seconds`, computed when first asked, as :attr:`_left`."""

    @property
    def total_seconds(self) -> float:
        """P-hat: predicted exclusive run time of the whole job."""
        return sum(r.epochs * r.epoch_seconds for r in self.regimes)

    def remaining_regimes(self) -> tuple[PredictedRegime, ...]:
        """What is left from now: the rest of the ongoing regime and the future ones."""
        if self._left is not None:
            return self._left
        start = sum(r.epochs for r in self.regimes[: self.current])
        left: list[PredictedRegime] = []
        for i in range(self.current, len(self.regimes)):
            regime = self.regimes[i]
            epochs = regime.epochs
            if i == self.current:
                epochs = max(0.0, start + regime.epochs - self.epochs_done)
            if epochs > 0:
                left.append(PredictedRegime(regime.batch_size, epochs, regime.epoch_seconds))
        rest = tuple(left)
        object.__setattr__(self, "_left", rest)
        return rest

    @property
    def remaining_seconds(self) -> float:
        """R-hat: predicted exclusive time still to run."""
        if self._remaining is not None:
            return self._remaining
        remaining = sum(r.epochs * r.epoch_seconds for r in self.remaining_regimes())
        object.__setattr__(self, "_remaining", remaining)
        return remaining

    def epochs_after(self, seconds: float) -> float:
        """Epochs gained by running ``seconds`` more from now (capped at the job's end)."""
        gained = 0.0
        for regime in self.remaining_regimes():
            needed = regime.epochs * regime.epoch_seconds
            if seconds >= needed:
                gained += regime.epochs
                seconds -= needed
            else:
                gained += seconds / regime.epoch_seconds
                break
        return gained


def batch_size_pattern(job: ActiveJob, params: PredictorParams) -> list[int]:
    """The batch sizes of the job's regimes, past, current and future, K of them at least.

    The observed part is kept as it happened; the future continues from the current batch size
    along the mode's pattern.
    """
    spec = job.spec
    seen = [r.batch_size for r in job.progress.observed_regimes] + [job.progress.batch_size]
    largest = spec.max_batch_size
    mode = spec.mode
    if mode is AdaptationMode.STATIC or (
        mode in (AdaptationMode.ACCORDION, AdaptationMode.GNS)
        and spec.initial_batch_size >= largest
    ):
        return seen
    if mode is AdaptationMode.CUSTOM:
        declared = list(spec.batch_sizes)
        return seen + declared[len(seen) :]
    if mode is AdaptationMode.GNS:
        ladder = gns_ladder(spec.initial_batch_size, largest, spec.batch_sizes)
        return seen + [bs for bs in ladder if bs > seen[-1]]
    small, large = spec.initial_batch_size, largest
    pattern = list(seen)
    while len(pattern) < params.accordion_regimes:
        pattern.append(large if pattern[-1] == small else small)
    return pattern


def gns_ladder(initial: int, largest: int, declared: Sequence[int]) -> list[int]:
    """Doublings from the initial size up to the largest (declared sizes on the way win)."""
    known = sorted({bs for bs in declared if initial <= bs <= largest} | {initial, largest})
    ladder = [initial]
    while ladder[-1] < largest:
        target = ladder[-1] * 2
        nxt = next((bs for bs in known if bs >= target), largest)
        ladder.append(min(nxt, largest))
    return ladder


def restate(
    total_epochs: int, observed: Sequence[float], current_done: float, k_max: int
) -> list[float]:
    """Posterior-mean epochs per regime under the restatement rule.

    ``observed``: epochs of the finished regimes m_1..m_k; ``current_done``: epochs the ongoing
    regime has run; ``k_max``: K (raised to k + 1 when the job already shows more regimes).
    Returns K values: the observed ones, then the ongoing regime's and the future ones' means.
    """
    k = len(observed)
    regimes = max(k_max, k + 1)
    left = max(0.0, total_epochs - sum(observed))
    share = left / (regimes - k)
    if current_done > share:
        share = current_done + (left - current_done) / (regimes - k)
        rest = (left - share) / (regimes - k - 1) if regimes - k > 1 else 0.0
    else:
        rest = share
    return [*observed, share] + [rest] * (regimes - k - 1)


def predict(
    job: ActiveJob,
    params: PredictorParams | None = None,
    throughput: ThroughputModel | None = None,
) -> Prediction:
    """The posterior-mean trajectory of ``job`` from what has been observed of it (the paper's
    rule); epoch times from ``throughput`` (default: the job's own knowledge only)."""
    params = params or PredictorParams()
    pattern = batch_size_pattern(job, params)
    observed = [float(r.epochs) for r in job.progress.observed_regimes]
    done = job.progress.epochs_done
    current_done = max(0.0, done - sum(observed))
    epochs = restate(
        job.spec.epochs, observed, current_done if params.restate_ongoing else 0.0, len(pattern)
    )
    while len(pattern) < len(epochs):
        pattern.append(pattern[-1])
    regimes = tuple(
        PredictedRegime(bs, e, epoch_seconds(job, bs, params, throughput))
        for bs, e in zip(pattern, epochs, strict=True)
    )
    return Prediction(
        regimes=regimes, current=len(observed), epochs_done=done, total_epochs=job.spec.epochs
    )


def predict_from_truth(
    job: ActiveJob, trajectory: Sequence[Regime], epoch_seconds: Mapping[int, float]
) -> Prediction:
    """The oracle: the true trajectory, for measuring what prediction costs (never in service)."""
    regimes = tuple(
        PredictedRegime(r.batch_size, float(r.epochs), epoch_seconds[r.batch_size])
        for r in trajectory
    )
    done = job.progress.epochs_done
    current, start = 0, 0.0
    while current < len(regimes) - 1 and start + regimes[current].epochs <= done:
        start += regimes[current].epochs
        current += 1
    return Prediction(
        regimes=regimes, current=current, epochs_done=done, total_epochs=job.spec.epochs
    )


def predict_greedy(
    job: ActiveJob,
    params: PredictorParams | None = None,
    throughput: ThroughputModel | None = None,
) -> Prediction:
    """What reactive schedulers assume: the rest of the job runs at the latest batch size."""
    params = params or PredictorParams()
    bs = job.progress.batch_size
    observed = [
        PredictedRegime(
            r.batch_size, float(r.epochs), epoch_seconds(job, r.batch_size, params, throughput)
        )
        for r in job.progress.observed_regimes
    ]
    current = PredictedRegime(
        bs,
        job.spec.epochs - sum(r.epochs for r in observed),
        epoch_seconds(job, bs, params, throughput),
    )
    return Prediction(
        regimes=(*observed, current),
        current=len(observed),
        epochs_done=job.progress.epochs_done,
        total_epochs=job.spec.epochs,
    )


def greedy_remaining_seconds(
    job: ActiveJob,
    params: PredictorParams | None = None,
    throughput: ThroughputModel | None = None,
) -> float:
    """:func:`predict_greedy`'s ``remaining_seconds``, the same float, without building the
    prediction (the policy asks it of every job it looks at): the epochs left of the job at its
    latest batch size, times that size's epoch time. Only that epoch time is asked of
    ``throughput`` (the finished regimes' do not count in what is left)."""
    params = params or PredictorParams()
    finished = sum(float(r.epochs) for r in job.progress.observed_regimes)
    # the operations of remaining_regimes on the greedy trajectory, in its order
    left = max(0.0, finished + (job.spec.epochs - finished) - job.progress.epochs_done)
    if left <= 0:
        return 0.0
    return left * epoch_seconds(job, job.progress.batch_size, params, throughput)


_OWN_KNOWLEDGE = ThroughputModel({})
"""A throughput model with no rates measured by other jobs: a job's own measurements and
declarations only."""


def epoch_seconds(
    job: ActiveJob,
    batch_size: int,
    params: PredictorParams,
    throughput: ThroughputModel | None = None,
) -> float:
    """Seconds per epoch of ``job`` at ``batch_size``: the throughput model's estimate, else
    ``params.unknown_epoch_seconds``."""
    estimate = (throughput or _OWN_KNOWLEDGE).epoch_time(job, batch_size)
    return params.unknown_epoch_seconds if estimate is None else estimate.seconds
