"""Regime prediction from the population prior: empirical Bayes over finished jobs.

The paper's restatement rule (:func:`shockwave.prediction.predictor.predict`) gives every job the
same uninformed prior: K regimes splitting the epochs evenly. Many jobs that declare Accordion or
GNS never change batch size, and those that do split their epochs in ways a scheduler can learn
from the jobs that finished before them. Here the prior of a job is the empirical distribution of
the finished trajectories in its group (:mod:`shockwave.domain.population`), shrunk towards the
paper's prior, and the job's own observations update it the restatement way:

1. **Candidates.** The templates of the job's mode and model, replayed on the job's own ladder
   by their symbols (a template of another initial size replays as that size's rungs would on
   this job's). While they hold fewer than ``backoff_jobs`` jobs of a similar length, templates
   of other models of the mode join at weight ``mode_weight``, each model's together at most
   ``model_weight`` (models within the mode, jobs within a model: a hierarchical pool). Two
   pseudo-templates stand for the prior before data: the paper's posterior mean (weight
   ``prior_weight``) and the static guess, no further change (weight ``static_weight``); equal,
   so a job is as likely to adapt as not until finished jobs say otherwise. Where a tenant
   learns apart from other tenants, the paper's rule weighs more while the tenant has few
   finished jobs of its own (:func:`apart_params`). Custom jobs consult
   only their own (mode, model, initial size) group: their declared list is their own.
   A GNS job reads its model's templates the way GNS behaves: where a finished job
   of its model has grown from a batch size, a shorter template that ended there was censored
   (it ended before it could climb: :func:`_censored`), and the static pseudo-template is
   dropped (weight ``grown_static_weight``) while the job is at such a size.
2. **Length kernel.** A template of a job of E' epochs weighs exp(-(ln(E / E') / h)^2 / 2) for a
   job of E epochs (h = ``length_bandwidth``): adaptation rules tied to epoch counts (a warm-up
   of ten epochs, a noise scale that grows by epoch) replay faithfully on jobs of similar length,
   and rules tied to fractions lose nothing.
3. **Restatement update.** The regimes the job has finished are kept as observed. A template
   speaks for the rest: from the start of the ongoing regime, its regimes split the job's
   remaining epochs in its own proportions (the Dirichlet's neutrality: given the finished
   shares, the rest split as the prior's). A template whose batch sizes so far differ from the
   job's, or whose ongoing regime would already have ended, is ruled out (the paper's
   pseudo-template too, taken without its restatement of an overlong ongoing regime: a job that
   has outrun every switch point left is predicted static). For a model never seen, the
   paper's pseudo-template weighs as much as the other models' templates say a switch is still
   ahead (:func:`_paper_by_hazard`): the mode says when, the paper's rule how the rest splits.
4. **One trajectory.** The scheduler plans with a single trajectory (paper section 5). Each
   distinct continuation of batch sizes proposes the weighted mean and the weighted median of its
   candidates' shares; the proposal with the least expected regime-length error under all the
   candidates' weights is the prediction: the Bayes point estimate for the error the paper
   reports.

The work of steps 1 and 4 is memoized per (template groups, job shape, surviving candidates), so a
round repeats none of it for a job whose candidates no finished job has changed.

A static job, or one already at its largest batch size, has one regime: the paper's rule.
"""

from __future__ import annotations

import bisect
import functools
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from shockwave.domain.memo import IdentityMemo
from shockwave.domain.model import AdaptationMode, JobSpec
from shockwave.domain.population import EMPTY_PRIOR, TOP, PopulationPrior, Template, ladder_of
from shockwave.domain.snapshot import ActiveJob
from shockwave.prediction.predictor import (
    PredictedRegime,
    Prediction,
    PredictorParams,
    epoch_seconds,
    gns_ladder,
    predict,
)
from shockwave.prediction.throughput_model import ThroughputModel

_EPS = 1e-9
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PopulationParams:
    """Knobs of the population predictor (see the module docstring).

    ``length_bandwidth``: h of the length kernel, in ln epochs (1: a job twice as long weighs
    0.79, ten times as long 0.07). ``prior_weight`` and ``static_weight``: the paper's rule and
    the static guess (the job never changes batch size again) as that many pseudo-jobs; equal,
    so before any data a job is as likely to adapt as not, and together worth less than one
    finished job. ``mode_weight``: the weight of a template from another model of the same mode
    (models differ: one adapts where another never does); ``model_weight``: the most the
    templates of one other model weigh together (a model is one unit of the mode's pool: a
    mode of many jobs of few models says little of a model never seen). ``backoff_jobs``: below
    this weight of similar-length jobs of its own model, a job consults the other models.
    ``grown_static_weight``: the static guess's weight for a GNS job at a batch size a finished
    job of its model grew from (the static guess stands for a model that may never adapt; step
    4's loss would let it outvote finished jobs that all climbed).
    ``neutral_weight`` and ``neutral_jobs``: for a prior a tenant learns apart
    (:func:`apart_params`), the paper's rule weighs ``neutral_weight * neutral_jobs /
    (neutral_jobs + n)`` more, n the tenant's finished jobs. ``mode_hazard``: for a model never
    seen, the paper's rule weighs as much as the other models' templates say a switch is still
    ahead of the job (:func:`_paper_by_hazard`).
    """

    length_bandwidth: float = 1.0
    prior_weight: float = 0.3
    static_weight: float = 0.3
    mode_weight: float = 0.05
    model_weight: float = 0.1
    backoff_jobs: float = 3.0
    grown_static_weight: float = 0.0
    neutral_weight: float = 3.0
    neutral_jobs: float = 10.0
    mode_hazard: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.length_bandwidth) and self.length_bandwidth > 0):
            raise ValueError("length_bandwidth must be > 0")
        for name in (
            "prior_weight",
            "static_weight",
            "grown_static_weight",
            "mode_weight",
            "model_weight",
            "backoff_jobs",
            "neutral_weight",
            "neutral_jobs",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class _Block:
    """Templates that share one sequence of batch sizes (as replayed on the job's ladder):
    ``epochs[i]`` the i-th one's length, ``lengths[i, r]`` the epochs of its regime r."""

    sizes: tuple[int, ...]
    epochs: FloatArray
    lengths: FloatArray


@dataclass(frozen=True, slots=True)
class _Candidates:
    """Trajectories the job may follow from its ongoing regime on, all with one ``future``
    (batch sizes after the ongoing regime): ``weights[i]`` and ``shares[i, r]``, the share of
    the remaining epochs (from the ongoing regime's start) of the ongoing regime (r = 0) and
    each future one."""

    future: tuple[int, ...]
    weights: FloatArray
    shares: FloatArray


@dataclass(frozen=True, slots=True)
class Stage:
    """Where on its progress a job's population prediction stays one trajectory: ``start``
    epochs of finished regimes, ``left`` epochs after them, and the survival ``thresholds``
    of its candidates, ``passed`` of them passed (:func:`predict_staged`)."""

    start: float
    left: float
    thresholds: tuple[float, ...]
    passed: int

    def holds(self, epochs_done: float) -> bool:
        """Whether the same job (spec, finished regimes, batch size, the prior's groups it
        reads and the throughput model's answers all as they were) at ``epochs_done`` passes
        the same thresholds, so that its prediction is the same trajectory, at that point on
        it: the candidates that survive are fixed by the thresholds passed."""
        done_share = max(0.0, epochs_done - self.start) / self.left
        return bisect.bisect_right(self.thresholds, done_share + _EPS) == self.passed


def predict_population(
    job: ActiveJob,
    prior: PopulationPrior = EMPTY_PRIOR,
    params: PredictorParams | None = None,
    throughput: ThroughputModel | None = None,
    population: PopulationParams | None = None,
) -> Prediction:
    """The job's trajectory under the population prior updated by its own observations."""
    return predict_staged(job, prior, params, throughput, population)[0]


def predict_staged(
    job: ActiveJob,
    prior: PopulationPrior = EMPTY_PRIOR,
    params: PredictorParams | None = None,
    throughput: ThroughputModel | None = None,
    population: PopulationParams | None = None,
) -> tuple[Prediction, Stage | None]:
    """:func:`predict_population`, and the :class:`Stage` over which the job keeps that
    trajectory as it trains (None where the paper's rule predicts it)."""
    params = params or PredictorParams()
    population = population or PopulationParams()
    spec = job.spec
    if _reads_no_templates(spec):
        return predict(job, params, throughput), None
    observed = job.progress.observed_regimes
    prefix = (*(r.batch_size for r in observed), job.progress.batch_size)
    start = float(sum(r.epochs for r in observed))
    left = spec.epochs - start
    if left <= _EPS:
        return predict(job, params, throughput), None
    done_share = max(0.0, job.progress.epochs_done - start) / left
    censoring, groups = _consulted_groups(prior, job, population)
    key = (
        spec.mode,
        spec.model,
        spec.initial_batch_size,
        ladder_of(spec),
        spec.epochs,
        observed,
        prefix[-1],
        population,
        params.accordion_regimes,
        len(groups[0]),
        _group_ids(groups),
    )
    cached = _CANDIDATES.get(key, groups)
    if cached is None:
        unrefined = predict(job, replace(params, restate_ongoing=False), throughput)
        candidates = (
            *_from_templates(job, groups, population, prefix, censoring),
            _from_paper(unrefined, population.prior_weight),
        )
        pool = _pool(candidates)
        unseen = population.mode_hazard and bool(groups[1]) and not any(groups[0])
        cached = (pool, _survival_thresholds(pool), unseen)
        _CANDIDATES.put(key, groups, cached)
    pool, thresholds, fallback = cached
    # which candidates survive depends only on how many thresholds done_share has passed
    passed = bisect.bisect_right(thresholds, done_share + _EPS)
    decision = _SURVIVORS.get((key, passed), groups)
    if decision is None:
        alive = _surviving(pool, done_share)
        static = population.static_weight
        if censoring is not None and prefix[-1] in censoring.grown_from:
            static = population.grown_static_weight
        # the survivors are nested as done_share grows: their number names them
        signature = (key, int(alive.sum()))
        decision = _DECISIONS.get(signature, groups)
        if decision is None:
            chosen = _paper_by_hazard(pool, alive) if fallback else pool
            decision = _choose(chosen, alive, static, len(observed))
            _DECISIONS.put(signature, groups, decision)
        _SURVIVORS.put((key, passed), groups, decision)
    future, shares = decision
    regimes = [
        PredictedRegime(
            r.batch_size, float(r.epochs), epoch_seconds(job, r.batch_size, params, throughput)
        )
        for r in observed
    ]
    for batch_size, share in zip((prefix[-1], *future), shares, strict=True):
        regimes.append(
            PredictedRegime(
                batch_size, left * share, epoch_seconds(job, batch_size, params, throughput)
            )
        )
    prediction = Prediction(
        regimes=tuple(regimes),
        current=len(observed),
        epochs_done=job.progress.epochs_done,
        total_epochs=spec.epochs,
    )
    return prediction, Stage(start, left, thresholds, passed)


@functools.lru_cache(maxsize=1024)
def apart_params(population: PopulationParams, learnt: int) -> PopulationParams:
    """The knobs for a prior that one tenant learns apart from ``learnt`` of its own finished
    jobs: ``population`` with the paper's rule weighing ``neutral_weight * neutral_jobs /
    (neutral_jobs + learnt)`` more (the very same object for the same arguments, so that
    predictions memoized by the knobs' identity hold while the tenant learns nothing).

    The paper's rule is tenant-neutral: it reads the job's own declaration (its mode, its
    ladder of batch sizes), nothing another tenant submitted. A tenant's own prior holds a
    handful of trajectories while few of its jobs have finished, and a handful outvotes the two
    pseudo-jobs (together worth less than one finished job); step 4's loss then often settles
    on the static guess, the longest run time for a job that will grow its batch size. A run
    time predicted too long puts the job's fairness deadline too late, and it waits past its
    fair finish. Shrunk towards the paper's rule, the tenant predicts from it until its own
    jobs outweigh it (3.3 pseudo-jobs before any finish, 1.8 after ten, 0.6 after a hundred)."""
    extra = population.neutral_weight * population.neutral_jobs
    if extra <= 0:
        return population
    return replace(
        population,
        prior_weight=population.prior_weight + extra / (population.neutral_jobs + max(0, learnt)),
    )


_Groups = tuple[tuple[tuple[Template, ...], ...], tuple[tuple[tuple[Template, ...], ...], ...]]
"""(the job's own model's template groups, the other models' of its mode: one tuple of groups
per model, by model name)."""


def _consulted_groups(
    prior: PopulationPrior, job: ActiveJob, population: PopulationParams
) -> tuple[_Censoring | None, _Groups]:
    """The job's censoring (:func:`_censoring`) and the template groups of ``prior`` it
    consults (:func:`_consulted`), memoized per (the groups of its mode, spec, params): a
    new prior whose finished job is of another mode gives the job the very groups object
    (:func:`_groups_of`), so it costs a look-up. Both read its own model's groups alone
    while they hold enough jobs, so a new prior costs a look-up on those: the censoring is
    memoized per (spec, the very own groups) in :data:`_GROUPS`, the support in
    :data:`_SUPPORT`, and the other models' groups are not read at all."""
    everyone = _groups_of(prior, job)

    def consulted() -> tuple[_Censoring | None, _Groups]:
        own = everyone[0]
        censoring = _GROUPS.get((job.spec, *own), len(own), lambda: _censoring(job, own))
        return censoring, _consulted(everyone, job, population, censoring)

    return _CONSULTED.get((everyone, job.spec, population), (), consulted)


def _reads_no_templates(spec: JobSpec) -> bool:
    """Whether a job of ``spec`` never changes batch size (static, or starting at its largest),
    so that the paper's rule predicts it and no template group of a prior is read."""
    return spec.mode is AdaptationMode.STATIC or spec.initial_batch_size >= spec.max_batch_size


def prior_reads(
    prior: PopulationPrior, job: ActiveJob, population: PopulationParams | None = None
) -> tuple[tuple[Template, ...], ...]:
    """The template groups of ``prior`` that a population prediction of ``job`` with
    ``population`` reads, in order (none for a job that cannot change batch size): its own
    model's groups, and the other models' of its mode only while its own are too thin to be
    consulted alone (:func:`_consulted`). Two priors whose reads are the very same group
    objects predict the job alike, so a job finishing changes the predictions of the jobs
    that consult its group only."""
    spec = job.spec
    if _reads_no_templates(spec):
        return ()
    _, (own, others) = _consulted_groups(prior, job, population or PopulationParams())
    return (*own, *(g for model in others for g in model))


def prior_basis(prior: PopulationPrior, job: ActiveJob) -> object:
    """An object that is the very same for two priors where each gives ``job`` the very same
    template groups to read (:func:`prior_reads`, with the same population knobs): the
    groups of its mode (:func:`_groups_of`), or ``()`` for a job that reads none. Two
    priors may give the same reads under different objects; the same object, never other
    reads (the groups a job consults are made from these groups, its spec and the knobs)."""
    spec = job.spec
    if _reads_no_templates(spec):
        return ()
    return _groups_of(prior, job)


def _groups_of(prior: PopulationPrior, job: ActiveJob) -> _Groups:
    """:func:`_groups`, memoized per prior and what of the spec it reads; the very object
    made for an earlier prior where every group in it is the very same group (a prior
    learnt from a job of another mode keeps the others' group objects), so that what is
    memoized per groups object holds across such priors."""
    spec = job.spec
    custom = spec.mode is AdaptationMode.CUSTOM
    key = (spec.mode, spec.model, spec.initial_batch_size if custom else None)
    return _GROUPS_OF.get((prior,), key, lambda: _lasting_groups(key, _groups(prior, job)))


def _lasting_groups(key: Hashable, groups: _Groups) -> _Groups:
    """``groups``, or the last groups made for ``key`` where they are the very same group
    objects in the same places (:func:`_groups_of`)."""
    with _LAST_GROUPS_LOCK:
        last = _LAST_GROUPS.get(key)
        if last is not None and _same_groups(last, groups):
            return last
        if len(_LAST_GROUPS) >= 4096:
            _LAST_GROUPS.clear()
        _LAST_GROUPS[key] = groups
    return groups


def _same_groups(a: _Groups, b: _Groups) -> bool:
    """Whether two :data:`_Groups` hold the very same group objects in the same places."""
    (own_a, others_a), (own_b, others_b) = a, b
    return (
        len(own_a) == len(own_b)
        and len(others_a) == len(others_b)
        and all(map(operator.is_, own_a, own_b))
        and all(
            len(x) == len(y) and all(map(operator.is_, x, y))
            for x, y in zip(others_a, others_b, strict=True)
        )
    )


_LAST_GROUPS: dict[Hashable, _Groups] = {}
"""The last :data:`_Groups` made per :func:`_groups_of` key (bounded: cleared whole when full)."""
_LAST_GROUPS_LOCK = threading.Lock()


def _groups(prior: PopulationPrior, job: ActiveJob) -> _Groups:
    """The template groups that speak for ``job``: (its own model's, other models' of its
    mode, by model); a custom job only its own group, its declared list being its own."""
    spec = job.spec
    if spec.mode is AdaptationMode.CUSTOM:
        return (prior.group((spec.mode, spec.model, spec.initial_batch_size)),), ()
    same_model: list[tuple[Template, ...]] = []
    other_models: dict[str, list[tuple[Template, ...]]] = {}
    for key, group in prior.templates.items():
        if key[0] is spec.mode:
            if key[1] == spec.model:
                same_model.append(group)
            else:
                other_models.setdefault(key[1], []).append(group)
    return tuple(same_model), tuple(tuple(other_models[m]) for m in sorted(other_models))


def _group_ids(groups: _Groups) -> tuple[int, ...]:
    """The identities of every template group in ``groups`` (a memo key)."""
    own, others = groups
    return (*(id(g) for g in own), -1, *(id(g) for model in others for g in model))


def _consulted(
    groups: _Groups, job: ActiveJob, population: PopulationParams, censoring: _Censoring | None
) -> _Groups:
    """``groups`` without the other models' when the job's own model holds enough jobs of a
    similar length (they would not be consulted); ``censoring``: the job's, from its own
    model's groups (:func:`_censoring`)."""
    own, others = groups
    if not others:
        return groups
    spec = job.spec
    ladder = ladder_of(spec)
    replay = spec.mode is not AdaptationMode.CUSTOM
    bandwidth = population.length_bandwidth
    # the support reads the own model's groups alone: memoized on them, so that another
    # model's finished job costs a look-up here
    initial = spec.initial_batch_size
    support = _SUPPORT.get(
        own,
        (spec.epochs, initial, ladder, replay, censoring, bandwidth),
        lambda: sum(
            weight
            for group in own
            for weight in _weighed(
                group, initial, ladder, replay, censoring, spec.epochs, bandwidth
            ).totals
        ),
    )
    return (own, ()) if support >= population.backoff_jobs else groups


def _from_templates(
    job: ActiveJob,
    groups: _Groups,
    population: PopulationParams,
    prefix: Sequence[int],
    censoring: _Censoring | None,
) -> Iterator[_Candidates]:
    """Candidates from the job's own model, backing off to other models while it is thin;
    ``censoring`` as in :func:`_consulted`.

    The back-off is hierarchical: jobs within a model, models within the mode. Another
    model's templates weigh ``mode_weight`` each but at most ``model_weight`` together, so
    the mode speaks as a handful of models, not as their many jobs: for a model never seen,
    the paper's rule and the static guess keep a say against a pattern that the other models
    share only because they are other models."""
    spec = job.spec
    ladder = ladder_of(spec)
    replay = spec.mode is not AdaptationMode.CUSTOM
    own, others = groups
    k = len(prefix) - 1

    def candidates(
        blocks: Sequence[_Block], weights: Sequence[FloatArray]
    ) -> Iterator[_Candidates]:
        for block, weight in zip(blocks, weights, strict=True):
            if len(block.sizes) <= k or block.sizes[: k + 1] != tuple(prefix):
                continue
            rest = block.lengths[:, k:]
            yield _Candidates(block.sizes[k + 1 :], weight, rest / rest.sum(axis=1, keepdims=True))

    support = 0.0
    for group in own:
        weighed = _weighed(
            group,
            spec.initial_batch_size,
            ladder,
            replay,
            censoring,
            spec.epochs,
            population.length_bandwidth,
        )
        support += sum(weighed.totals)
        yield from candidates(weighed.blocks, weighed.kernels)
    if support >= population.backoff_jobs or population.mode_weight <= 0:
        return
    for model in others:
        blocks = tuple(
            b for g in model for b in _blocks(g, spec.initial_batch_size, ladder, replay, censoring)
        )
        kernels = [_kernel(spec.epochs, b.epochs, population.length_bandwidth) for b in blocks]
        total = sum(float(w.sum()) for w in kernels)
        if total <= 0:
            continue
        scale = min(population.mode_weight, population.model_weight / total)
        yield from candidates(blocks, [scale * w for w in kernels])


@dataclass(frozen=True, slots=True)
class _Censoring:
    """What a GNS job needs to read a shorter template as censored (:func:`_censored`): its
    ``epochs``, the ``climb`` of batch sizes it goes up
    (:func:`shockwave.prediction.predictor.gns_ladder`) and the batch sizes its model has been seen
    to grow from (``grown_from``: a finished job of its model left each of them for a larger
    one)."""

    epochs: int
    climb: tuple[int, ...]
    grown_from: frozenset[int]


def _censoring(job: ActiveJob, own: Sequence[tuple[Template, ...]]) -> _Censoring | None:
    """:class:`_Censoring` for a GNS job, from its model's groups ``own``; None for other
    modes (an Accordion job goes back down; a custom job follows its own list)."""
    spec = job.spec
    if spec.mode is not AdaptationMode.GNS:
        return None
    grown_from = _GROWN_FROM.get(tuple(own), (), lambda: _grown_from(own))
    climb = gns_ladder(spec.initial_batch_size, spec.max_batch_size, spec.batch_sizes)
    return _Censoring(spec.epochs, tuple(climb), grown_from)


def _grown_from(own: Sequence[tuple[Template, ...]]) -> frozenset[int]:
    """The batch sizes some template of the groups ``own`` grew from."""
    return frozenset(
        small
        for group in own
        for template in group
        for small, large in zip(template.batch_sizes, template.batch_sizes[1:], strict=False)
        if large > small
    )


@dataclass(frozen=True, slots=True)
class _Weighed:
    """A group's :func:`_blocks` for a job, with each block's length kernel
    (:func:`_kernel`, read-only) and that kernel's sum as a float, in block order."""

    blocks: tuple[_Block, ...]
    kernels: tuple[FloatArray, ...]
    totals: tuple[float, ...]


def _weighed(
    group: tuple[Template, ...],
    initial: int,
    ladder: tuple[int, ...],
    replay: bool,
    censoring: _Censoring | None,
    epochs: int,
    bandwidth: float,
) -> _Weighed:
    """:class:`_Weighed` of ``group`` for a job of ``epochs`` epochs (the rest as
    :func:`_blocks`), memoized per group: a job finishing changes one group, and the jobs
    that read the others weigh them again at a look-up."""
    key = (id(group), initial, ladder, replay, censoring, epochs, bandwidth)
    cached: _Weighed | None = _WEIGHED.get(key, group)
    if cached is not None:
        return cached
    blocks = _blocks(group, initial, ladder, replay, censoring)
    kernels = tuple(_kernel(epochs, b.epochs, bandwidth) for b in blocks)
    for kernel in kernels:
        kernel.setflags(write=False)
    made = _Weighed(blocks, kernels, tuple(float(k.sum()) for k in kernels))
    _WEIGHED.put(key, group, made)
    return made


def _kernel(epochs: int, template_epochs: FloatArray, bandwidth: float) -> FloatArray:
    z = np.log(epochs / template_epochs) / bandwidth
    weights: FloatArray = np.exp(-0.5 * z * z)
    return weights


class _Memo:
    """A bounded, thread-safe memo whose entries hold the template groups they were computed
    from: a hit needs the very same group objects (a prior shares the groups a new finished
    job did not change with the prior before it), so a key built from their ids is never
    stale. Results only, no state: the predictor stays a pure function."""

    def __init__(self, size: int) -> None:
        self._entries: OrderedDict[Hashable, tuple[object, Any]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: Hashable, owner: object) -> Any:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or (hit[0] is not owner and hit[0] != owner):
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def put(self, key: Hashable, owner: object, value: Any) -> None:
        with self._lock:
            self._entries[key] = (owner, value)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


_BLOCKS = _Memo(4096)
_WEIGHED = _Memo(16384)
"""Per (group, job shape, length): :func:`_weighed`."""
_CANDIDATES = _Memo(8192)
_DECISIONS = _Memo(16384)
_SURVIVORS = _Memo(16384)
_GROUPS: IdentityMemo[_Censoring | None] = IdentityMemo(limit=20_000)
"""Per (spec, its own model's template groups): :func:`_censoring`."""
_CONSULTED: IdentityMemo[tuple[_Censoring | None, _Groups]] = IdentityMemo(limit=50_000)
"""Per (groups of the job's mode, spec, params), the very objects: :func:`_consulted_groups`."""
_SUPPORT: IdentityMemo[float] = IdentityMemo(limit=20_000)
"""Per (the own model's template groups, what of the spec the kernel reads): the weight of
similar-length jobs of the job's own model (:func:`_consulted`)."""
_GROWN_FROM: IdentityMemo[frozenset[int]] = IdentityMemo(limit=4096)
"""Per model's template groups (the very objects): :func:`_grown_from`."""
_GROUPS_OF: IdentityMemo[_Groups] = IdentityMemo(limit=4096)
"""Per (prior, mode, model[, initial batch size of a custom job]): :func:`_groups`."""


def _blocks(
    group: tuple[Template, ...],
    initial: int,
    ladder: tuple[int, ...],
    replay: bool,
    censoring: _Censoring | None = None,
) -> tuple[_Block, ...]:
    """The group's templates as blocks of one batch-size sequence each, replayed on the job's
    ladder when ``replay``, censored ones continued per ``censoring`` (:func:`_censored`;
    memoized: most groups outlive many priors)."""
    key = (id(group), initial, ladder, replay, censoring)
    cached: tuple[_Block, ...] | None = _BLOCKS.get(key, group)
    if cached is not None:
        return cached
    by_sizes: dict[tuple[int, ...], list[tuple[int, tuple[float, ...]]]] = {}
    if replay and censoring is not None:
        rungs = _rungs(initial, ladder)
        key_of_layout = (id(group), rungs, censoring.climb, censoring.grown_from)
        layout: _Layout | None = _LAYOUTS.get(key_of_layout, group)
        if layout is None:
            layout = _layout(group, rungs, censoring)
            _LAYOUTS.put(key_of_layout, group, layout)
        blocks = layout.blocks(censoring.epochs)
        _BLOCKS.put(key, group, blocks)
        return blocks
    if replay:
        rungs = _rungs(initial, ladder)
        for template in group:
            sizes, lengths = _censored(template, *_replay_on(template, rungs), censoring)
            by_sizes.setdefault(sizes, []).append((template.epochs, lengths))
    else:
        for template in group:
            lengths = tuple(float(x) for x in template.lengths)
            by_sizes.setdefault(template.batch_sizes, []).append((template.epochs, lengths))
    blocks = tuple(
        _Block(
            sizes,
            np.array([e for e, _ in rows], dtype=float),
            np.array([lengths for _, lengths in rows], dtype=float),
        )
        for sizes, rows in by_sizes.items()
    )
    _BLOCKS.put(key, group, blocks)
    return blocks


@dataclass(frozen=True, slots=True)
class _Layout:
    """A group's templates replayed on one ladder, for GNS jobs of any length
    (:func:`_censored`): which templates a job of E epochs cuts short (those that may be
    censored, ``above[i] > 0``, with ``epochs[i] < E``) and, for each batch-size sequence
    ``sizes[k]``, the templates that replay as it whole (``uncut[i] == k``) or cut short
    (``cut[i] == k``): ``rows[k]`` in order, and ``lengths[k]`` their regimes, a cut one's
    without the epochs it never saw (its highest regime's share of them added at ``peak[i]``,
    the ``above[i]`` regimes after it taking the same share). The blocks of one job length
    then take a few array operations per sequence instead of a pass over the templates."""

    sizes: tuple[tuple[int, ...], ...]
    uncut: npt.NDArray[np.intp]
    cut: npt.NDArray[np.intp]
    epochs: npt.NDArray[np.int64]
    peak: npt.NDArray[np.intp]
    above: npt.NDArray[np.intp]
    rows: tuple[npt.NDArray[np.intp], ...]
    lengths: tuple[FloatArray, ...]

    def blocks(self, epochs: int) -> tuple[_Block, ...]:
        """The blocks of a GNS job of ``epochs`` epochs: :func:`_blocks`' with its
        censoring (the same sequences, templates, order and lengths, to the float)."""
        cutting = (self.above > 0) & (self.epochs < epochs)
        keys = np.where(cutting, self.cut, self.uncut)
        seen, first = np.unique(keys, return_index=True)
        made = []
        for k in seen[np.argsort(first)].tolist():
            rows = self.rows[k]
            take = keys[rows] == k
            members = rows[take]
            lengths = self.lengths[k][take]
            short = np.flatnonzero(cutting[members])
            if short.size:
                cut = members[short]
                # the epochs a template never saw, split evenly from its highest size up
                share = (epochs - self.epochs[cut]) / (self.above[cut] + 1)
                peak = self.peak[cut]
                lengths[short, peak] += share
                spans = self.above[cut]
                starts = np.repeat(np.cumsum(spans) - spans, spans)
                steps = np.arange(int(spans.sum())) - starts
                lengths[np.repeat(short, spans), np.repeat(peak + 1, spans) + steps] = np.repeat(
                    share, spans
                )
            made.append(_Block(self.sizes[k], self.epochs[members].astype(float), lengths))
        return tuple(made)


def _layout(group: tuple[Template, ...], rungs: _Rungs, censoring: _Censoring) -> _Layout:
    """The :class:`_Layout` of ``group`` on the ladder ``rungs`` for GNS jobs of the climb
    and grown-from sizes of ``censoring`` (its epochs unread)."""
    ids: dict[tuple[int, ...], int] = {}
    rows: list[list[int]] = []
    lengths: list[list[tuple[float, ...]]] = []

    def add(sizes: tuple[int, ...], row: int, regimes: tuple[float, ...]) -> int:
        k = ids.setdefault(sizes, len(ids))
        if k == len(rows):
            rows.append([])
            lengths.append([])
        rows[k].append(row)
        lengths[k].append(regimes)
        return k

    count = len(group)
    uncut = np.empty(count, dtype=np.intp)
    cut = np.full(count, -1, dtype=np.intp)
    peak = np.zeros(count, dtype=np.intp)
    above = np.zeros(count, dtype=np.intp)
    for i, template in enumerate(group):
        sizes, regimes = _replay_on(template, rungs)
        uncut[i] = add(sizes, i, regimes)
        if max(template.batch_sizes) not in censoring.grown_from:
            continue
        highest = max(sizes)
        more = tuple(bs for bs in censoring.climb if bs > highest)
        if not more:
            continue
        top = len(sizes) - 1 - sizes[::-1].index(highest)
        peak[i], above[i] = top, len(more)
        cut[i] = add(
            (*sizes[: top + 1], *more, *sizes[top + 1 :]),
            i,
            (*regimes[: top + 1], *[0.0] * len(more), *regimes[top + 1 :]),
        )
    return _Layout(
        tuple(ids),
        uncut,
        cut,
        np.array([t.epochs for t in group], dtype=np.int64),
        peak,
        above,
        tuple(np.array(r, dtype=np.intp) for r in rows),
        tuple(np.array(x, dtype=float) for x in lengths),
    )


_LAYOUTS = _Memo(1024)
"""Per (group, ladder, climb, grown-from sizes): :func:`_layout`."""


_Rungs = tuple[tuple[int, ...], int]
"""A job's batch sizes ascending (its ladder and initial size) and the index of its initial
size: where :func:`shockwave.domain.population.size_of` places a symbol."""


@functools.lru_cache(maxsize=1024)
def _rungs(initial: int, ladder: tuple[int, ...]) -> _Rungs:
    """A job's :data:`_Rungs` from its initial size and ladder."""
    sizes = tuple(sorted({*ladder, initial}))
    return sizes, sizes.index(initial)


def _replay_on(template: Template, rungs: _Rungs) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The template's regimes on the ladder ``rungs``, regimes that land on one size merged,
    before any censoring (:func:`_censored`); memoized per template, which a group keeps
    while it stays among its most recent."""
    key = (id(template), rungs)
    hit = _REPLAYS.get(key)
    if hit is not None and hit[0] is template:
        return hit[1], hit[2]
    ladder, base = rungs
    top = len(ladder) - 1
    sizes: list[int] = []
    lengths: list[float] = []
    for symbol, length in zip(template.symbols, template.lengths, strict=True):
        size = ladder[-1] if symbol == TOP else ladder[min(max(base + symbol, 0), top)]
        if sizes and sizes[-1] == size:
            lengths[-1] += length
        else:
            sizes.append(size)
            lengths.append(float(length))
    replayed = (tuple(sizes), tuple(lengths))
    with _REPLAYS_LOCK:
        if len(_REPLAYS) >= _REPLAYS_LIMIT:
            _REPLAYS.clear()
        _REPLAYS[key] = (template, *replayed)
    return replayed


_REPLAYS: dict[tuple[int, _Rungs], tuple[Template, tuple[int, ...], tuple[float, ...]]] = {}
"""Per (template, ladder): :func:`_replay_on`, with the template it was made from (an entry
holds its template alive, so its id names no other while the entry stands)."""
_REPLAYS_LIMIT = 200_000
_REPLAYS_LOCK = threading.Lock()


def _censored(
    template: Template,
    sizes: tuple[int, ...],
    lengths: tuple[float, ...],
    censoring: _Censoring | None,
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The template's regimes on another job's ladder (``sizes`` and ``lengths``, as
    :func:`_replay_on` replays them), continued per ``censoring`` where it was censored.

    ``censoring`` (a GNS job of E epochs): a GNS job's batch size grows with its gradient noise
    scale, which grows as it trains, so a template of E' < E epochs that ended below its largest
    size, at a size its model has been seen to grow from, was *censored*: it stopped climbing
    because it ended, and says nothing of its epochs after E'. It replays in epochs up to E',
    and the E - E' epochs it never saw follow the paper's prior from its highest size on: that
    size and each larger one on the job's climb take an even share (its regimes after its
    highest one, a final drop, stay at the end). Any other template (as long as the job, at the
    largest size, or stopped at a size its model never grew from: a model whose GNS jobs do not
    climb) replays in proportion.
    """
    if (
        censoring is None
        or template.epochs >= censoring.epochs
        or max(template.batch_sizes) not in censoring.grown_from
    ):
        return sizes, lengths
    highest = max(sizes)
    above = [bs for bs in censoring.climb if bs > highest]
    if not above:
        return sizes, lengths
    peak = len(sizes) - 1 - sizes[::-1].index(highest)
    share = (censoring.epochs - template.epochs) / (len(above) + 1)
    grown = list(lengths)
    grown[peak] += share
    return (
        (*sizes[: peak + 1], *above, *sizes[peak + 1 :]),
        (*grown[: peak + 1], *[share] * len(above), *grown[peak + 1 :]),
    )


@dataclass(frozen=True, slots=True)
class _Pool:
    """A job's candidates (:class:`_Candidates`, in order) as one row per template:
    ``shares[i]`` zero-padded to the widest candidate, ``regimes[i]`` its candidate's number
    of regimes, ``weights[i]``, ``ongoing[i]`` its ongoing regime's share (inf where its
    candidate has no future: it survives to the end) and ``codes[i]`` the index of its
    continuation in ``futures`` (distinct, by first appearance). The survivors at any
    progress are then a mask of rows (:func:`_surviving`)."""

    shares: FloatArray
    regimes: FloatArray
    weights: FloatArray
    ongoing: FloatArray
    codes: npt.NDArray[np.int64]
    futures: tuple[tuple[int, ...], ...]


def _pool(candidates: Sequence[_Candidates]) -> _Pool:
    """``candidates`` as a :class:`_Pool`."""
    rows = sum(len(c.weights) for c in candidates)
    shares = np.zeros((rows, max(c.shares.shape[1] for c in candidates)))
    regimes = np.zeros(rows)
    ongoing = np.empty(rows)
    codes = np.empty(rows, dtype=np.int64)
    futures: dict[tuple[int, ...], int] = {}
    row = 0
    for c in candidates:
        count, width = c.shares.shape
        shares[row : row + count, :width] = c.shares
        regimes[row : row + count] = width
        ongoing[row : row + count] = c.shares[:, 0] if c.future else np.inf
        codes[row : row + count] = futures.setdefault(c.future, len(futures))
        row += count
    weights = np.concatenate([c.weights for c in candidates])
    return _Pool(shares, regimes, weights, ongoing, codes, tuple(futures))


def _survival_thresholds(pool: _Pool) -> tuple[float, ...]:
    """The ongoing regime's shares of every candidate that has a future, sorted and distinct:
    a candidate survives while ``done_share + eps`` is below its share (:func:`_surviving`),
    so the survivors are fixed by how many of these ``done_share + eps`` has reached."""
    shares: list[float] = np.unique(pool.ongoing[np.isfinite(pool.ongoing)]).tolist()
    return tuple(shares)


def _surviving(pool: _Pool, done_share: float) -> npt.NDArray[np.bool_]:
    """Which rows of ``pool`` outlast what the job has run of its ongoing regime (all of a
    candidate's when it is its last regime)."""
    alive: npt.NDArray[np.bool_] = pool.ongoing > done_share + _EPS
    return alive


def _paper_by_hazard(pool: _Pool, alive: npt.NDArray[np.bool_]) -> _Pool:
    """``pool`` with the paper's pseudo-template (its last row) weighing as much as the
    finished jobs say a switch ahead still comes: its weight p times (s + p) / (a + p), with a
    the weight of the templates that had a switch ahead at the ongoing regime's start and s
    that of those still ``alive`` (the mode's survival curve, the paper's own point counted in
    it at its weight, so that a few templates cannot silence it).

    The paper's rule puts the next switch at a fixed share of the remaining epochs; the
    templates of the mode's other models say when their jobs switched. A job that has run past
    the switches of most of them without switching is, by their account, unlikely to switch at
    all, and the paper's point keeps it alive only because it is a point. Read for a model
    never seen (no template of its own): the mode then speaks of when, and the paper's rule of
    how the rest splits. A model with templates of its own, however few, is timed by them."""
    templates = np.isfinite(pool.ongoing[:-1])
    ahead = float(pool.weights[:-1][templates].sum())
    if ahead <= 0 or not np.isfinite(pool.ongoing[-1]):
        return pool
    still = float(pool.weights[:-1][templates & alive[:-1]].sum())
    weights = pool.weights.copy()
    paper = float(weights[-1])
    weights[-1] *= (still + paper) / (ahead + paper)
    return replace(pool, weights=weights)


def _from_paper(paper: Prediction, weight: float) -> _Candidates:
    """The paper's posterior mean as a pseudo-template."""
    rest = paper.regimes[paper.current :]
    total = sum(r.epochs for r in rest) or 1.0
    return _Candidates(
        tuple(r.batch_size for r in rest[1:]),
        np.array([weight]),
        np.array([[r.epochs / total for r in rest]]),
    )


def _choose(
    pool: _Pool, alive: npt.NDArray[np.bool_], static: float, observed: int
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The continuation (batch sizes after the ongoing regime) and shares to predict.

    The candidates are the ``alive`` rows of ``pool`` and the static guess (no further
    change) at weight ``static``, last. Each distinct continuation proposes the weighted mean,
    and the weighted median, of the shares of the candidates that follow it; the proposal
    with the least expected regime-length error under all candidates' weights wins (the
    Bayes point estimate for that loss). ``observed``: regimes the job has finished, which
    count in each candidate's number of regimes but carry no error.

    Every proposal's errors are taken at once, a regime at a time over the candidates' rows
    (:data:`_ROW_SUM_IN_ORDER` regimes at most: up to there a row's sum of its regimes adds
    them in order, as numpy's row sum does), so that each loss is the one
    :func:`_choose_each` computes proposal by proposal, to the float.
    """
    rows = _Rows.of(pool, alive, static)
    shares, counts, weights = rows.shares, rows.counts, rows.weights
    width = shares.shape[1]
    total = weights.sum()
    if width > _ROW_SUM_IN_ORDER or total <= 0:
        return _choose_each(rows, observed)
    per_regime = weights / (observed + counts) / total
    codes: list[int] = []
    made: list[FloatArray] = []
    for code, members_at in rows.continuations():
        w = weights[members_at]
        w_total = w.sum()
        if w_total <= 0:
            continue
        members = shares[members_at]
        codes += (code, code)
        made.append(w @ members / w_total)
        made.append(_weighted_median(members, w))
    if not made:
        return (), (1.0,)
    proposals = np.array(made)
    columns = shares.T.copy()
    errors = np.abs(columns[0][None, :] - proposals[:, :1])
    for r in range(1, width):
        # a candidate's regimes past its own number carry no error
        errors = errors + np.abs(columns[r][None, :] - proposals[:, r : r + 1]) * (counts > r)
    best = -1
    least = 0.0
    for i, error in enumerate(errors):
        loss = float(per_regime @ error)
        if best < 0 or loss < least - _EPS:
            best, least = i, loss
    return rows.prediction(codes[best], made[best])


_ROW_SUM_IN_ORDER = 7
"""Up to this many columns, numpy's sum of a row adds its entries one after the other (past
it, in pairs of blocks): :func:`_choose` adds a regime at a time in that order."""


def _choose_each(rows: _Rows, observed: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """:func:`_choose` proposal by proposal, nothing kept (past :data:`_ROW_SUM_IN_ORDER`
    regimes, and where every weight is zero: then every candidate counts alike)."""
    shares, counts = rows.shares, rows.counts
    weights = rows.weights if rows.weights.sum() > 0 else np.ones(len(rows.weights))
    in_truth = np.arange(shares.shape[1])[None, :] < counts[:, None]
    per_regime = weights / (observed + counts) / weights.sum()
    best: tuple[float, int, FloatArray] | None = None
    for code, members_at in rows.continuations():
        w = weights[members_at]
        if w.sum() <= 0:
            continue
        members = shares[members_at]
        for proposal in (w @ members / w.sum(), _weighted_median(members, w)):
            errors = (np.abs(shares - proposal[None, :]) * in_truth).sum(axis=1)
            loss = float(per_regime @ errors)
            if best is None or loss < best[0] - _EPS:
                best = (loss, code, proposal)
    if best is None:
        return (), (1.0,)
    _, code, proposal = best
    return rows.prediction(code, proposal)


@dataclass(frozen=True, slots=True)
class _Rows:
    """What :func:`_choose` weighs: the ``alive`` rows of a pool and the static guess (no
    further change, one regime) last, as ``shares`` (cut to the widest alive candidate),
    ``counts`` (each row's number of regimes), ``weights`` and ``codes`` (each row's
    continuation in ``futures``; the static guess's is that of ``()``)."""

    shares: FloatArray
    counts: FloatArray
    weights: FloatArray
    codes: npt.NDArray[np.int64]
    futures: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, pool: _Pool, alive: npt.NDArray[np.bool_], static: float) -> _Rows:
        index = alive.nonzero()[0]
        size = index.size
        regimes = pool.regimes[index]
        width = max(1, int(regimes.max())) if size else 1
        shares = np.zeros((size + 1, width))
        shares[:-1] = pool.shares[index, :width]
        shares[-1, 0] = 1.0
        futures = pool.futures
        stay = futures.index(()) if () in futures else len(futures)
        counts = np.empty(size + 1)
        counts[:-1] = regimes
        counts[-1] = 1.0
        weights = np.empty(size + 1)
        weights[:-1] = pool.weights[index]
        weights[-1] = static
        codes = np.empty(size + 1, dtype=np.int64)
        codes[:-1] = pool.codes[index]
        codes[-1] = stay
        return cls(shares, counts, weights, codes, futures)

    def continuations(self) -> list[tuple[int, npt.NDArray[np.intp]]]:
        """Each continuation present and its rows, in the order of its first row."""
        codes = self.codes
        # a dict keeps the codes in the order each first appears
        return [(code, (codes == code).nonzero()[0]) for code in dict.fromkeys(codes.tolist())]

    def prediction(
        self, code: int, proposal: FloatArray
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The continuation ``code`` and its shares from ``proposal`` (ongoing regime first)."""
        future = self.futures[code] if code < len(self.futures) else ()
        return future, tuple(float(x) for x in proposal[: len(future) + 1])


def _weighted_median(values: FloatArray, weights: FloatArray) -> FloatArray:
    """Column-wise weighted median of ``values`` (rows weighted by ``weights``), rescaled so
    the shares sum to 1: the point that minimizes the expected absolute error per regime."""
    order = values.argsort(axis=0)
    cumulative = weights[order].cumsum(axis=0)
    index = (cumulative >= cumulative[-1:] / 2).argmax(axis=0)
    width = values.shape[1]
    columns = _COLUMNS[:width] if width <= len(_COLUMNS) else np.arange(width)
    median: FloatArray = values[order[index, columns], columns]
    total = float(median.sum())
    return median / total if total > 0 else median


_COLUMNS = np.arange(64)
"""Column indices for :func:`_weighted_median` (a slice of one array, not a new one a call)."""
