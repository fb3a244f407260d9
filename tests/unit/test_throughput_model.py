"""The throughput model: which knowledge wins for an epoch time, the scaling laws fitted to the
measured rates, and what users declare in a simulated workload (declared, noisy:P, none)."""

from __future__ import annotations

import math

import pytest

from shockwave.domain.model import AdaptationMode
from shockwave.domain.population import (
    EMPTY_PRIOR,
    FinishedJob,
    PopulationPrior,
    declaration_pairs,
)
from shockwave.domain.snapshot import ActiveJob
from shockwave.prediction.throughput_model import ThroughputModel, ThroughputModelParams
from shockwave.workloads.throughput_knowledge import ThroughputKnowledge, apply_knowledge
from tests.builders import SAMPLES, adaptive_job, sim_job, workload

LADDER = (32, 64, 256)
LAW = (32 / 256) ** 0.3


def blend(declared: float, scaled: float) -> float:
    weight = (1 / 0.04) / (1 / 0.04 + 1 / (0.09 * math.log(8) ** 2))
    return float(declared**weight * scaled ** (1 - weight))


# Rates other jobs of the model measured on one GPU (samples/s): an epoch of 1000 samples
# takes 10 s at 32, 5 s at 64, 2 s at 256.
RATES = {("ResNet-18", 1, 32): 100.0, ("ResNet-18", 1, 64): 200.0, ("ResNet-18", 1, 256): 500.0}


def job(
    *,
    measured: dict[int, float] | None = None,
    profile: dict[int, float] | None = None,
    model: str = "ResNet-18",
    batch_size: int = 32,
) -> ActiveJob:
    return adaptive_job(
        mode=AdaptationMode.GNS,
        model=model,
        initial=32,
        batch_sizes=LADDER,
        batch_size=batch_size,
        measured=measured,
        profile=profile,
    )


@pytest.mark.parametrize(
    ("rates", "measured", "profile", "batch_size", "seconds", "source"),
    [
        pytest.param(RATES, {64: 3.0}, {64: 9.0}, 64, 3.0, "measured", id="own-measurement"),
        # Measured 6 s at 32 where others measured 10 s: this job runs at 0.6 of their time,
        # so at 256: 2 s x 0.6.
        pytest.param(RATES, {32: 6.0}, {256: 9.0}, 256, 1.2, "population", id="ratio"),
        pytest.param(RATES, {}, {256: 9.0}, 256, 2.0, "population", id="others-rate"),
        # Declared 9 s; the law from the measured 6 s says 6 (32 / 256) ** 0.3: blended by the
        # prior variances, 0.04 against 0.09 (ln 8) ** 2.
        pytest.param(
            {}, {32: 6.0}, {256: 9.0}, 256, blend(9.0, 6.0 * LAW), "declared", id="declared"
        ),
        # Nothing at 256: alpha = 0.3 by default, 6 s x (32 / 256) ** 0.3.
        pytest.param({}, {32: 6.0}, {}, 256, 6.0 * LAW, "scaled", id="law"),
    ],
)
def test_which_knowledge_wins(
    rates: dict[tuple[str, int, int], float],
    measured: dict[int, float],
    profile: dict[int, float],
    batch_size: int,
    seconds: float,
    source: str,
) -> None:
    estimate = ThroughputModel(rates).epoch_time(
        job(measured=measured, profile=profile), batch_size
    )

    assert estimate is not None
    assert estimate.seconds == pytest.approx(seconds)
    assert estimate.source == source


def test_nothing_known_is_none_and_an_unnamed_model_learns_nothing_from_others() -> None:
    assert ThroughputModel(RATES).epoch_time(job(model="Unknown"), 64) is None
    assert ThroughputModel(RATES).epoch_time(job(model=""), 64) is None


def test_a_model_known_on_another_width_is_scaled_by_both_laws() -> None:
    rates = {("ResNet-18", 4, 32): 100.0, ("ResNet-18", 4, 64): 200.0}
    model = ThroughputModel(rates)

    estimate = model.epoch_time(job(), 64)

    assert estimate is not None and estimate.source == "scaled"
    expected_rate = 200.0 * (1 / 4) ** model.beta("ResNet-18")
    assert estimate.seconds == pytest.approx(SAMPLES / expected_rate)
    assert model.beta("ResNet-18") == ThroughputModelParams().gpu_exponent, "one width: prior"


def test_an_own_measurement_scales_to_another_gpu_count() -> None:
    model = ThroughputModel({})
    measured = job(measured={32: 8.0})

    on_two = model.epoch_time(measured, 32, gpus=2)

    assert on_two is not None and on_two.source == "scaled"
    assert on_two.seconds == pytest.approx(8.0 / 2**0.8)


def test_the_batch_exponent_is_fitted_to_measured_rates_and_shrunk_to_its_prior() -> None:
    # Rates doubling with each doubling of the batch size: alpha = 1 on these points alone.
    rates = {("LM", 1, bs): 10.0 * bs for bs in (5, 10, 20, 40, 80)}
    fitted = ThroughputModel(rates).alpha("LM")

    spread = sum((math.log(bs) - math.log(20)) ** 2 for bs in (5, 10, 20, 40, 80))
    assert fitted == pytest.approx((spread * 1.0 + 1.0 * 0.3) / (spread + 1.0))
    assert ThroughputModel({}).alpha("LM") == 0.3


def test_declarations_weigh_as_much_as_they_have_proven_right() -> None:
    # Jobs that declared 10 s at 32 and measured 10 s: exact declarations; a fresh job's
    # declared 256 then outweighs the law almost entirely. Jobs off by 2x: the law wins.
    def declaring(ratio: float) -> ActiveJob:
        return job(profile={32: 10.0 * ratio}, measured={32: 10.0}, model="Other")

    fresh = job(profile={256: 9.0}, measured={32: 6.0})
    exact = ThroughputModel.build(EMPTY_PRIOR, [declaring(1.0)] * 30)
    wrong = ThroughputModel.build(EMPTY_PRIOR, [declaring(2.0)] * 30)

    assert exact.declaration_variance == pytest.approx(0.04 / 31)
    assert wrong.declaration_variance == pytest.approx((0.04 + 30 * math.log(2) ** 2) / 31)
    trusted, doubted = exact.epoch_time(fresh, 256), wrong.epoch_time(fresh, 256)
    assert trusted is not None and doubted is not None
    assert (trusted.source, doubted.source) == ("declared", "scaled")
    assert abs(math.log(trusted.seconds / 9.0)) < 0.01
    assert 6.0 * LAW < doubted.seconds < math.sqrt(9.0 * 6.0 * LAW) < trusted.seconds


def test_the_law_variance_is_learnt_from_the_measured_series() -> None:
    # Rates that follow alpha exactly: the law's error is the fit's shrinkage only, far below
    # the prior; a zig-zag series is far above it.
    smooth = ThroughputModel({("LM", 1, bs): 10.0 * bs**0.5 for bs in (5, 10, 20, 40, 80)})
    rough = ThroughputModel(
        {("LM", 1, bs): 10.0 * (3 if i % 2 else 1) for i, bs in enumerate((5, 10, 20, 40, 80))}
    )

    assert smooth.law_variance < 0.09 < rough.law_variance


def test_build_merges_finished_and_running_jobs_measurements() -> None:
    done = FinishedJob(job().spec, (), {32: 10.0})
    prior = PopulationPrior().learn(done)
    running = job(measured={32: 5.0, 64: 4.0})

    model = ThroughputModel.build(prior, [running])

    assert model.rates[("ResNet-18", 1, 32)] == pytest.approx((100.0 + 200.0) / 2)
    assert model.rates[("ResNet-18", 1, 64)] == pytest.approx(250.0)
    assert ThroughputModel.build(EMPTY_PRIOR).rates == {}


def test_build_sums_declaration_errors_as_adding_each_job_does() -> None:
    # the model's declaration errors are the prior's with each active job's pairs added in turn
    done = FinishedJob(job().spec, (), {32: 10.0})
    prior = PopulationPrior().learn(done)
    declared = {32: 9.0, 64: 4.5}
    jobs = [
        job(measured={32: 5.0, 64: 4.0}, profile=declared),
        job(measured={}, profile=declared),
        job(measured={32: 3.3}, profile=declared),
    ]
    expected = prior.declarations
    for active in jobs:
        expected = expected.add(
            declaration_pairs(active.spec, active.progress.measured_epoch_seconds)
        )

    model = ThroughputModel.build(prior, jobs)
    again = ThroughputModel.build(prior, jobs)

    assert expected.count == 3
    assert model.declaration_variance == (model.params.declaration_variance + expected.sum_sq) / (
        1 + expected.count
    )
    assert again is model, "the same measurements give the same model"


# --- what users declare ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "spread", "label"),
    [
        ("declared", "declared", 0.0, "declared"),
        ("none", "none", 0.0, "none"),
        ("noisy:0.3", "noisy", 0.3, "noisy:0.3"),
        (" Noisy:0 ", "noisy", 0.0, "noisy:0"),
    ],
)
def test_knowledge_parses(text: str, kind: str, spread: float, label: str) -> None:
    knowledge = ThroughputKnowledge.parse(text)

    assert (knowledge.kind, knowledge.spread, str(knowledge)) == (kind, spread, label)


@pytest.mark.parametrize("text", ["noisy", "noisy:1.5", "noisy:-0.1", "none:0.2", "exact", ""])
def test_malformed_knowledge_names_the_shapes(text: str) -> None:
    with pytest.raises(ValueError, match=r"declared|noisy|spread"):
        ThroughputKnowledge.parse(text)


def test_applying_knowledge_changes_only_what_is_declared() -> None:
    jobs = workload(sim_job("a", [(32, 10, 2.0), (64, 10, 1.0)]), sim_job("b", [(16, 5, 4.0)]))

    hidden = apply_knowledge(jobs, ThroughputKnowledge("none"))
    noisy = apply_knowledge(jobs, ThroughputKnowledge("noisy", 0.3), seed=7)

    assert apply_knowledge(jobs, ThroughputKnowledge()) is jobs
    for original, none, off in zip(jobs.jobs, hidden.jobs, noisy.jobs, strict=True):
        assert none.spec.throughput.samples_per_second == {}
        assert (none.trajectory, none.epoch_seconds) == (
            original.trajectory,
            original.epoch_seconds,
        )
        for bs, rate in original.spec.throughput.samples_per_second.items():
            assert 0.7 * rate <= off.spec.throughput.samples_per_second[bs] <= 1.3 * rate
            assert off.spec.throughput.samples_per_second[bs] != rate
    again = apply_knowledge(jobs, ThroughputKnowledge("noisy", 0.3), seed=7)
    other = apply_knowledge(jobs, ThroughputKnowledge("noisy", 0.3), seed=8)
    assert again == noisy and other != noisy


def _measuring(job_id: str, seconds: float, model: str = "ResNet-18") -> ActiveJob:
    return adaptive_job(job_id, model=model, measured={32: seconds})


def test_jobs_of_one_shape_that_run_alike_leave_no_caution() -> None:
    rates = ThroughputModel.build(jobs=[_measuring("a", 2.0), _measuring("b", 2.0)])
    unseen = adaptive_job("new", model="ResNet-18")

    assert rates.speed_variance == 0.0
    assert rates.unseen_factor(unseen) == 1.0


def test_a_job_that_measured_nothing_is_judged_as_slow_as_the_spread_says() -> None:
    # Two jobs of one shape at 1 s and 4 s per epoch: log spread ln 4 / sqrt 2 per job.
    jobs = [_measuring("a", 1.0), _measuring("b", 4.0), _measuring("other", 9.0, model="LM")]
    rates = ThroughputModel.build(jobs=jobs)
    sigma = math.log(4.0) / math.sqrt(2.0)

    assert rates.speed_variance == pytest.approx(sigma**2)
    unseen = adaptive_job("new", model="Transformer")
    assert rates.unseen_factor(unseen) == pytest.approx(math.exp(1.645 * sigma))
    assert rates.unseen_factor(_measuring("a", 1.0)) == 1.0, "a measured job is what it measured"
    cautious = ThroughputModel.build(jobs=jobs, params=ThroughputModelParams(unseen_caution=0))
    assert cautious.unseen_factor(unseen) == 1.0
    with pytest.raises(ValueError, match="unseen_caution"):
        ThroughputModelParams(unseen_caution=-1.0)


def test_rounding_noise_in_equal_rates_is_no_spread() -> None:
    # Equal epoch times reach the rates through different sums, so their logs can differ in
    # the last bits: a spread of 1e-15 must not make every unmeasured job a cautious guess.
    seconds = 0.1 + 0.2
    jobs = [_measuring("a", seconds), _measuring("b", 0.3), _measuring("c", 0.30000000000000004)]
    rates = ThroughputModel.build(jobs=jobs)

    assert rates.speed_variance == 0.0
    assert rates.unseen_factor(adaptive_job("new", model="ResNet-18")) == 1.0


def test_with_a_spread_a_speed_is_carried_by_the_ratio_of_jobs_that_measured_both_sizes() -> None:
    # Every job's epoch at 256 takes half its epoch at 32, but the slow jobs ("s", 4 s at 32)
    # have not reached 256 and the fast ones (1 s at 32) have: the ratio of the mean rates
    # (0.5 of a sample rate unit at 32 over 2 at 256) would carry the slow "x" to 4 x 0.25 =
    # 1 s at 256; "f", which measured both sizes, says 4 x 0.5 = 2 s.
    def one(job_id: str, measured: dict[int, float]) -> ActiveJob:
        return adaptive_job(job_id, model="ResNet-18", batch_sizes=LADDER, measured=measured)

    slow = one("x", {32: 4.0})
    jobs = [slow, one("s", {32: 4.0}), one("f", {32: 1.0, 256: 0.5}), one("g", {256: 0.5})]
    model = ThroughputModel.build(jobs=jobs)

    assert model.speed_variance > 0
    assert model.ratios[("ResNet-18", 1, 32, 256)] == pytest.approx(math.log(2.0))
    estimate = model.epoch_time(slow, 256)
    assert estimate is not None and estimate.source == "population"
    assert estimate.seconds == pytest.approx(2.0)
    # on another GPU count the pairs say nothing: the mean rates and the law carry it
    other = model.epoch_time(slow, 256, gpus=2)
    assert other is not None and other.seconds != pytest.approx(2.0 / 2**0.8)


def test_without_a_spread_the_ratio_is_the_mean_rates_one() -> None:
    # Jobs of one shape that run alike: the two ratios are the same, and the model keeps the
    # one of the mean rates (its estimates, and so every decision, as without the pairs).
    def one(job_id: str, measured: dict[int, float]) -> ActiveJob:
        return adaptive_job(job_id, model="ResNet-18", batch_sizes=LADDER, measured=measured)

    jobs = [one("x", {32: 1.0}), one("f", {32: 1.0, 256: 0.5}), one("g", {256: 0.5})]
    model = ThroughputModel.build(jobs=jobs)

    assert model.speed_variance == 0.0
    assert model.ratios == {}
    estimate = model.epoch_time(jobs[0], 256)
    assert estimate is not None and estimate.seconds == pytest.approx(0.5)


def test_finished_jobs_that_measured_both_sizes_carry_a_speed_too() -> None:
    # No active job measured both sizes; a finished one did (half the epoch time at 256). The
    # active ones differ in speed (4 s and 1 s at 32), so the slow "x" is carried by it: 2 s.
    done = FinishedJob(
        adaptive_job("done", model="ResNet-18", batch_sizes=LADDER).spec, (), {32: 1.0, 256: 0.5}
    )
    prior = PopulationPrior().learn(done)
    slow = adaptive_job("x", model="ResNet-18", batch_sizes=LADDER, measured={32: 4.0})
    fast = adaptive_job("f", model="ResNet-18", batch_sizes=LADDER, measured={32: 1.0})

    model = ThroughputModel.build(prior, [slow, fast])

    assert model.ratios[("ResNet-18", 1, 32, 256)] == pytest.approx(math.log(2.0))
    estimate = model.epoch_time(slow, 256)
    assert estimate is not None and estimate.seconds == pytest.approx(2.0)
