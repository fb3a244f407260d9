"""The incremental paths of a Shockwave decision give what the full computation gives.

A long simulation reuses a job's prediction while the template groups it reads are the same
objects, takes the planner's envelope slopes of most jobs in one array operation, and packs
rounds without arrays; each must agree with the computation it stands for, to the float.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from shockwave.domain.model import AdaptationMode, JobSpec, Regime
from shockwave.domain.population import TOP, FinishedJob, PopulationPrior, Template, size_of
from shockwave.domain.snapshot import ActiveJob
from shockwave.market import planner
from shockwave.market.planner import concave_slopes, concave_slopes_all
from shockwave.policies.shockwave_market import shockwave as policy_module
from shockwave.policies.shockwave_market.shockwave import ShockwaveParams
from shockwave.prediction import population_predictor
from shockwave.prediction.population_predictor import predict_population, prior_reads
from shockwave.prediction.predictor import PredictedRegime, Prediction
from shockwave.prediction.throughput_model import RecordingModel, ThroughputModel
from tests.builders import adaptive_job

ACCORDION = AdaptationMode.ACCORDION


def _finished(
    regimes: Sequence[tuple[int, int]], model: str, mode: AdaptationMode = ACCORDION
) -> FinishedJob:
    spec = JobSpec(
        job_id="done",
        gpus=1,
        epochs=sum(e for _, e in regimes),
        samples_per_epoch=1000,
        initial_batch_size=regimes[0][0],
        mode=mode,
        batch_sizes=(32, 256),
        model=model,
    )
    return FinishedJob(spec, tuple(Regime(bs, e) for bs, e in regimes))


def _learnt(*jobs: FinishedJob) -> PopulationPrior:
    prior = PopulationPrior()
    for job in jobs:
        prior = prior.learn(job)
    return prior


def _job(model: str, epochs: int = 100) -> ActiveJob:
    return adaptive_job(
        mode=ACCORDION,
        model=model,
        initial=32,
        batch_sizes=(32, 256),
        epochs=epochs,
        epochs_done=10.0,
        profile={32: 1.0, 256: 1.0},
    )


def _clear_prediction_memos() -> None:
    for memo in (
        population_predictor._BLOCKS,
        population_predictor._CANDIDATES,
        population_predictor._DECISIONS,
        population_predictor._SURVIVORS,
    ):
        memo._entries.clear()
    for identity in (
        population_predictor._GROUPS,
        population_predictor._CONSULTED,
        population_predictor._SUPPORT,
        population_predictor._GROWN_FROM,
        population_predictor._GROUPS_OF,
    ):
        identity.clear()
    population_predictor._REPLAYS.clear()
    population_predictor._LAST_GROUPS.clear()


def test_another_models_finish_leaves_a_well_known_models_reads_and_prediction() -> None:
    own = [_finished([(32, 40), (256, 60)], "ResNet-18") for _ in range(5)]
    prior = _learnt(*own, _finished([(32, 100)], "LM"))
    after = prior.learn(_finished([(32, 20), (256, 80)], "LM"))
    job = _job("ResNet-18")

    # five jobs of its own model of the same length: the other models are not consulted, so
    # the groups the prediction reads are the very same objects after LM's finish
    before_reads, after_reads = prior_reads(prior, job), prior_reads(after, job)
    assert len(before_reads) == len(after_reads) == 1
    assert before_reads[0] is after_reads[0]
    reused = predict_population(job, prior)
    _clear_prediction_memos()
    assert predict_population(job, after) == reused


def test_a_thin_models_reads_change_with_another_models_finish() -> None:
    prior = _learnt(_finished([(32, 40), (256, 60)], "ResNet-18"), _finished([(32, 100)], "LM"))
    after = prior.learn(_finished([(32, 20), (256, 80)], "LM"))
    job = _job("ResNet-18")

    # one job of its own model: it backs off to LM, whose new template it must read
    before_reads, after_reads = prior_reads(prior, job), prior_reads(after, job)
    assert len(before_reads) == len(after_reads) == 2
    assert before_reads[1] is not after_reads[1]
    memoized = [predict_population(job, p) for p in (prior, after)]
    _clear_prediction_memos()
    fresh = [predict_population(job, p) for p in (prior, after)]
    assert memoized == fresh


def test_another_modes_finish_leaves_the_groups_a_job_consults_the_very_same() -> None:
    prior = _learnt(_finished([(32, 40), (256, 60)], "ResNet-18"), _finished([(32, 100)], "LM"))
    job = _job("ResNet-18")
    population = population_predictor.PopulationParams()
    before = population_predictor._consulted_groups(prior, job, population)

    # a GNS job's finish leaves every Accordion group as it was: the very groups object, so
    # the consulted groups are the memoized ones, and they are what a fresh computation gives
    other_mode = prior.learn(_finished([(32, 30), (256, 70)], "LM", AdaptationMode.GNS))
    groups = population_predictor._groups_of(other_mode, job)
    assert groups is population_predictor._groups_of(prior, job)
    kept = population_predictor._consulted_groups(other_mode, job, population)
    assert kept is before
    _clear_prediction_memos()
    fresh = population_predictor._consulted_groups(other_mode, job, population)
    assert fresh == kept
    assert prior_reads(other_mode, job) == prior_reads(prior, job)

    # an Accordion finish of another model changes a group this thin model backs off to
    same_mode = other_mode.learn(_finished([(32, 20), (256, 80)], "LM"))
    changed = population_predictor._groups_of(same_mode, job)
    assert changed is not groups
    reads = prior_reads(same_mode, job)
    assert reads[1] is same_mode.templates[(ACCORDION, "LM", 32)]
    memoized = predict_population(job, same_mode)
    _clear_prediction_memos()
    assert predict_population(job, same_mode) == memoized


def test_a_kept_prediction_holds_across_priors_under_one_basis_and_is_the_fresh_one() -> None:
    from shockwave.prediction.regime_predictors import prior_read_basis

    prior = _learnt(_finished([(32, 40), (256, 60)], "ResNet-18"), _finished([(32, 100)], "LM"))
    params = ShockwaveParams()
    job = _job("ResNet-18")
    rates = ThroughputModel.build(prior, [job])
    memo = policy_module._PredictionMemo()
    other_mode = prior.learn(_finished([(32, 30), (256, 70)], "LM", AdaptationMode.GNS))
    same_mode = other_mode.learn(_finished([(32, 20), (256, 80)], "LM"))
    # another mode's finish: the very same basis; the same mode's (a group the job reads): not
    basis = prior_read_basis("population", prior, job)
    assert prior_read_basis("population", other_mode, job) is basis
    assert prior_read_basis("population", same_mode, job) is not basis

    made = []
    for learnt in (prior, other_mode, same_mode):

        def compute(
            model: ThroughputModel, learnt: PopulationPrior = learnt
        ) -> policy_module._Computed:
            made.append(learnt)
            return policy_module._predicted(
                job, learnt, params, model, 1.0, None, params.population
            )

        got = memo.get(job, params, params.population, learnt, rates, 1.0, compute)
        _clear_prediction_memos()
        fresh = policy_module._predicted(
            job, learnt, params, RecordingModel(rates), 1.0, None, params.population
        )
        assert got == fresh[0]
    # made for the first prior, kept under the other mode's finish, made again for the last
    assert made == [prior, same_mode]


def test_a_throughput_model_of_unchanged_terms_is_the_one_built_and_a_change_rebuilds() -> None:
    from shockwave.prediction import throughput_model

    def clear() -> None:
        for memo in (
            throughput_model._BUILDS,
            throughput_model._MODELS,
            throughput_model._JOB_RATES,
        ):
            memo.clear()

    def fields(model: ThroughputModel) -> tuple[object, ...]:
        return (dict(model.rates), model.declaration_variance, model.speed_variance)

    prior = _learnt(_finished([(32, 40), (256, 60)], "ResNet-18"))
    a = adaptive_job("a", mode=ACCORDION, model="ResNet-18", measured={32: 2.0}, profile={32: 1.5})
    b = adaptive_job("b", mode=ACCORDION, model="ResNet-18", measured={32: 2.5})
    built = ThroughputModel.build(prior, [a, b])
    assert ThroughputModel.build(prior, [a, b]) is built

    # b measures another batch size, then another prior: each model is the one built afresh
    measured_b = adaptive_job("b", mode=ACCORDION, model="ResNet-18", measured={32: 2.5, 256: 0.5})
    after = prior.learn(_finished([(32, 10), (256, 90)], "ResNet-18"))
    for inputs in ((prior, [a, measured_b]), (after, [a, measured_b]), (after, [measured_b, a])):
        memoized = ThroughputModel.build(*inputs)
        clear()
        fresh = ThroughputModel.build(*inputs)
        assert fields(memoized) == fields(fresh)
        assert fields(memoized) != fields(built)


def test_a_models_own_finish_changes_its_reads() -> None:
    own = [_finished([(32, 40), (256, 60)], "ResNet-18") for _ in range(5)]
    prior = _learnt(*own)
    after = prior.learn(_finished([(32, 90), (256, 10)], "ResNet-18"))
    job = _job("ResNet-18")

    assert prior_reads(prior, job)[0] is not prior_reads(after, job)[0]
    memoized = predict_population(job, after)
    _clear_prediction_memos()
    assert predict_population(job, after) == memoized


def test_the_remaining_regimes_kept_on_a_prediction_are_the_computed_ones() -> None:
    regimes = (
        PredictedRegime(32, 40.0, 2.0),
        PredictedRegime(64, 30.0, 1.5),
        PredictedRegime(256, 30.0, 1.0),
    )
    prediction = Prediction(regimes, current=1, epochs_done=55.0, total_epochs=100)
    first = prediction.remaining_regimes()

    assert first == (PredictedRegime(64, 15.0, 1.5), PredictedRegime(256, 30.0, 1.0))
    assert prediction.remaining_regimes() is first
    assert prediction.remaining_seconds == 15.0 * 1.5 + 30.0
    # the kept rest is no part of the value: an equal prediction compares equal before asking
    assert prediction == Prediction(regimes, current=1, epochs_done=55.0, total_epochs=100)


@pytest.mark.parametrize("seed", range(5))
def test_slopes_of_many_rows_at_once_are_each_rows_slopes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        count, rounds = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        shape = (count, rounds + 1)
        concave = np.log(np.cumsum(rng.random(shape), axis=1) + 1e-3)
        # concave from n = 1 on, its first step short (a restart): the first chord's path
        restart = concave.copy()
        restart[:, 1] = restart[:, 0] + (restart[:, 1] - restart[:, 0]) * rng.random(count) / 4
        tables = (
            rng.normal(size=shape),  # any shape: the row-by-row fallback
            concave,  # concave: the array path
            restart,
            np.round(rng.normal(size=shape), 1),  # ties: collinear points merge
            np.full(shape, 0.5),  # flat rows
        )
        caps = rng.integers(0, rounds + 1, size=count).astype(np.int64)
        for values in tables:
            each = np.stack([concave_slopes(values[i], int(caps[i])) for i in range(count)])
            assert np.array_equal(concave_slopes_all(values, caps), each)


def _earliest_by_windows(free: Sequence[int], gpus: int, n: int) -> range | None:
    """The earliest start of ``n`` rounds in a row with ``gpus`` free, by trying each."""
    for start in range(len(free) - n + 1):
        if all(left >= gpus for left in free[start : start + n]):
            return range(start, start + n)
    return None


def test_the_earliest_block_is_the_first_window_that_fits() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        free = [int(x) for x in rng.integers(0, 9, size=int(rng.integers(1, 12)))]
        gpus, n = int(rng.integers(1, 9)), int(rng.integers(1, len(free) + 1))
        assert planner._earliest_block(free, gpus, n) == _earliest_by_windows(free, gpus, n)


def test_a_running_jobs_reused_trajectory_is_the_fresh_prediction_at_every_step() -> None:
    own = [_finished([(32, split), (256, 100 - split)], "ResNet-18") for split in (20, 50, 80)]
    prior = _learnt(*own)
    params = ShockwaveParams()
    start = _job("ResNet-18")
    rates = ThroughputModel.build(prior, [start])
    memo = policy_module._PredictionMemo()
    computed = [0]

    for done in range(0, 100, 2):
        job = replace(start, progress=replace(start.progress, epochs_done=float(done)))

        def compute(model: ThroughputModel, job: ActiveJob = job) -> policy_module._Computed:
            computed[0] += 1
            return policy_module._predicted(job, prior, params, model, 1.0, None, params.population)

        got = memo.get(job, params, params.population, prior, rates, 1.0, compute)
        _clear_prediction_memos()
        fresh = policy_module._predicted(
            job, prior, params, RecordingModel(rates), 1.0, None, params.population
        )
        assert got == fresh[0]
    # the trajectory was made again only where the job passed a switch point of a template
    assert 2 <= computed[0] <= 10


@pytest.mark.parametrize(
    ("initial", "ladder"),
    [(32, (32, 64, 128, 256)), (64, (16, 32, 64, 128)), (16, (16, 32)), (128, (32, 64, 128))],
)
def test_a_templates_replay_on_a_ladder_follows_the_symbols_rule(
    initial: int, ladder: tuple[int, ...]
) -> None:
    templates = [
        Template(100, (32, 64, 256), (0, 1, TOP), (10, 30, 60)),
        Template(40, (64, 32, 64), (0, -1, 0), (5, 5, 30)),
        Template(70, (16, 32, 64, 128), (0, 1, 2, 3), (7, 14, 21, 28)),
    ]
    for template in templates:
        rungs = population_predictor._rungs(initial, ladder)
        expected: list[tuple[int, float]] = []
        for symbol, length in zip(template.symbols, template.lengths, strict=True):
            size = size_of(symbol, initial, ladder)
            if expected and expected[-1][0] == size:
                expected[-1] = (size, expected[-1][1] + length)
            else:
                expected.append((size, float(length)))
        sizes = tuple(s for s, _ in expected)
        lengths = tuple(length for _, length in expected)
        assert population_predictor._replay_on(template, rungs) == (sizes, lengths)
        # the second time from the memo, the same
        assert population_predictor._replay_on(template, rungs) == (sizes, lengths)


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_among_survivors_is_the_choice_of_a_pool_of_them_alone(seed: int) -> None:
    rng = np.random.default_rng(seed)
    futures = [(64,), (64, 128), (), (128,)]
    candidates = []
    for _ in range(int(rng.integers(2, 7))):
        future = futures[int(rng.integers(len(futures)))]
        count = int(rng.integers(1, 9))
        raw = rng.uniform(0.05, 1.0, size=(count, len(future) + 1))
        shares = raw / raw.sum(axis=1, keepdims=True)
        weights = rng.uniform(0.0, 1.0, size=count)
        candidates.append(population_predictor._Candidates(future, weights, shares))
    pool = population_predictor._pool(candidates)
    for done_share in (0.0, 0.1, 0.3, 0.5, 0.8, 0.99):
        alive = population_predictor._surviving(pool, done_share)
        chosen = population_predictor._choose(pool, alive, 0.3, 1)
        kept = []
        for c in candidates:
            left = c.shares[:, 0] > done_share + 1e-9
            if not c.future:
                left = np.ones(len(c.weights), dtype=bool)
            if left.any():
                kept.append(
                    population_predictor._Candidates(c.future, c.weights[left], c.shares[left])
                )
        if not kept:
            continue
        alone = population_predictor._pool(kept)
        every = np.ones(len(alone.weights), dtype=bool)
        assert chosen == population_predictor._choose(alone, every, 0.3, 1)


@pytest.mark.parametrize("seed", range(8))
def test_the_choice_with_every_proposals_errors_at_once_is_the_choice_one_by_one(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    sizes = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    # up to nine regimes: past numpy's in-order row sum, the one-by-one path
    futures = [(), *(sizes[: int(rng.integers(1, 9))] for _ in range(4))]
    candidates = []
    for _ in range(int(rng.integers(2, 8))):
        future = futures[int(rng.integers(len(futures)))]
        count = int(rng.integers(1, 60))
        # rounded shares: many candidates tie, as finished jobs of one split do
        raw = np.round(rng.uniform(0.05, 1.0, size=(count, len(future) + 1)), 1)
        shares = raw / raw.sum(axis=1, keepdims=True)
        weights = rng.uniform(0.0, 1.0, size=count) * (rng.random(count) < 0.9)
        candidates.append(population_predictor._Candidates(future, weights, shares))
    pool = population_predictor._pool(candidates)
    for done_share in np.linspace(0.0, 1.0, 21):
        alive = population_predictor._surviving(pool, float(done_share))
        for static in (0.0, 0.3):
            for observed in (0, 2):
                fast = population_predictor._choose(pool, alive, static, observed)
                each = population_predictor._choose_each(
                    population_predictor._Rows.of(pool, alive, static), observed
                )
                assert fast == each


def _blocks_one_by_one(
    group: tuple[Template, ...],
    rungs: population_predictor._Rungs,
    censoring: population_predictor._Censoring,
) -> list[tuple[tuple[int, ...], list[int], list[tuple[float, ...]]]]:
    """A group's blocks for a GNS job, template by template: (sizes, epochs, lengths)."""
    by_sizes: dict[tuple[int, ...], tuple[list[int], list[tuple[float, ...]]]] = {}
    for template in group:
        replayed = population_predictor._replay_on(template, rungs)
        sizes, lengths = population_predictor._censored(template, *replayed, censoring)
        epochs, rows = by_sizes.setdefault(sizes, ([], []))
        epochs.append(template.epochs)
        rows.append(lengths)
    return [(sizes, epochs, rows) for sizes, (epochs, rows) in by_sizes.items()]


@pytest.mark.parametrize("seed", range(6))
def test_a_gns_jobs_blocks_from_the_groups_layout_are_its_blocks_template_by_template(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    ladder = (32, 64, 128, 256, 512)
    group = []
    for _ in range(int(rng.integers(1, 40))):
        start = int(rng.integers(0, 3))
        steps = sorted({start, *(int(x) for x in rng.integers(start, 5, size=rng.integers(0, 4)))})
        sizes = tuple(ladder[i] for i in steps)
        lengths = tuple(int(x) for x in rng.integers(1, 40, size=len(sizes)))
        initial = sizes[0]
        symbols = tuple(
            TOP if bs == ladder[-1] else ladder.index(bs) - ladder.index(initial) for bs in sizes
        )
        group.append(Template(sum(lengths), sizes, symbols, lengths))
    templates = tuple(group)
    for initial in (32, 64):
        rungs = population_predictor._rungs(initial, ladder)
        climb = tuple(bs for bs in ladder if bs >= initial)
        for grown_from in (frozenset({32, 64, 128}), frozenset({64, 256}), frozenset()):
            censoring = population_predictor._Censoring(1, climb, grown_from)
            layout = population_predictor._layout(templates, rungs, censoring)
            for epochs in (1, 10, 37, 60, 100, 250):
                censoring = population_predictor._Censoring(epochs, climb, grown_from)
                got = [
                    (b.sizes, b.epochs.tolist(), [tuple(row) for row in b.lengths.tolist()])
                    for b in layout.blocks(epochs)
                ]
                want = [
                    (sizes, [float(e) for e in epochs_], rows)
                    for sizes, epochs_, rows in _blocks_one_by_one(templates, rungs, censoring)
                ]
                assert got == want


@pytest.mark.parametrize("seed", range(4))
def test_the_weighted_median_reads_the_sorted_rows_where_it_picks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        rows, width = int(rng.integers(1, 80)), int(rng.integers(1, 6))
        values = np.round(rng.random((rows, width)), int(rng.integers(1, 4)))
        weights = rng.random(rows) * (rng.random(rows) < 0.8)
        if weights.sum() <= 0:
            continue
        order = np.argsort(values, axis=0)
        sorted_values = np.take_along_axis(values, order, axis=0)
        cumulative = np.cumsum(weights[order], axis=0)
        index = (cumulative >= cumulative[-1:] / 2).argmax(axis=0)
        median = sorted_values[index, np.arange(width)]
        total = float(median.sum())
        expected = median / total if total > 0 else median
        assert np.array_equal(population_predictor._weighted_median(values, weights), expected)
