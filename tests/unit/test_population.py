"""The population prior and the predictor that learns from it: ladders and symbols, learning and
storing finished jobs, and predictions worked by hand on small populations."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import pytest

from shockwave.domain.model import AdaptationMode, JobSpec, Regime
from shockwave.domain.population import (
    EMPTY_PRIOR,
    TOP,
    FinishedJob,
    PopulationPrior,
    PriorFormatError,
    StepStat,
    size_of,
    symbol_of,
)
from shockwave.domain.snapshot import ActiveJob
from shockwave.prediction.population_predictor import (
    PopulationParams,
    apart_params,
    predict_population,
)
from shockwave.prediction.predictor import Prediction, predict
from tests.builders import adaptive_job

ACCORDION = AdaptationMode.ACCORDION
GNS = AdaptationMode.GNS
STATIC = AdaptationMode.STATIC


def finished(
    regimes: Sequence[tuple[int, int]],
    *,
    mode: AdaptationMode = ACCORDION,
    model: str = "ResNet-18",
    ladder: Sequence[int] = (32, 256),
    gpus: int = 1,
    measured: dict[int, float] | None = None,
) -> FinishedJob:
    spec = JobSpec(
        job_id="done",
        gpus=gpus,
        epochs=sum(e for _, e in regimes),
        samples_per_epoch=1000,
        initial_batch_size=regimes[0][0],
        mode=mode,
        batch_sizes=tuple(ladder),
        model=model,
    )
    return FinishedJob(spec, tuple(Regime(bs, e) for bs, e in regimes), measured or {})


def learnt(*jobs: FinishedJob, max_per_group: int = 256) -> PopulationPrior:
    prior = PopulationPrior(max_per_group=max_per_group)
    for job in jobs:
        prior = prior.learn(job)
    return prior


def job(
    *,
    mode: AdaptationMode = ACCORDION,
    model: str = "ResNet-18",
    epochs: int = 100,
    epochs_done: float = 0.0,
    observed: Sequence[tuple[int, int]] = (),
    batch_size: int | None = None,
    ladder: Sequence[int] = (32, 256),
) -> ActiveJob:
    return adaptive_job(
        mode=mode,
        model=model,
        initial=ladder[0],
        batch_sizes=ladder,
        epochs=epochs,
        epochs_done=epochs_done,
        observed=observed,
        batch_size=batch_size,
        profile={bs: 1.0 for bs in ladder},
    )


def regimes(prediction: Prediction) -> list[tuple[int, float]]:
    return [(r.batch_size, round(r.epochs, 6)) for r in prediction.regimes]


# --- ladders and symbols ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch_size", "initial", "ladder", "symbol"),
    [
        (32, 32, (32, 64, 128, 256), 0),
        (64, 32, (32, 64, 128, 256), 1),
        (256, 32, (32, 64, 128, 256), TOP),
        (16, 32, (16, 32, 256), -1),
        (32, 32, (32,), 0),
    ],
)
def test_symbols_place_a_size_on_the_ladder(
    batch_size: int, initial: int, ladder: tuple[int, ...], symbol: int
) -> None:
    assert symbol_of(batch_size, initial, ladder) == symbol
    assert size_of(symbol, initial, ladder) == batch_size


@pytest.mark.parametrize(
    ("symbol", "initial", "ladder", "size"),
    [
        pytest.param(TOP, 40, (5, 10, 20, 40, 80), 80, id="top-is-the-largest"),
        pytest.param(3, 40, (5, 10, 20, 40, 80), 80, id="past-the-top-clips"),
        pytest.param(1, 5, (5, 10, 20, 40, 80), 10, id="one-rung-up"),
        pytest.param(-2, 10, (5, 10, 80), 5, id="below-the-bottom-clips"),
    ],
)
def test_a_symbol_replays_on_another_ladder(
    symbol: int, initial: int, ladder: tuple[int, ...], size: int
) -> None:
    assert size_of(symbol, initial, ladder) == size


# --- learning ---------------------------------------------------------------------------------


def test_learning_keeps_whole_trajectories_by_mode_model_and_initial_size() -> None:
    prior = learnt(
        finished([(32, 3), (256, 7)], measured={32: 10.0, 256: 4.0}),
        finished([(32, 10)], measured={32: 20.0}),
    )

    (first, second) = prior.group((ACCORDION, "ResNet-18", 32))
    assert (first.batch_sizes, first.symbols, first.lengths) == ((32, 256), (0, TOP), (3, 7))
    assert (second.batch_sizes, second.lengths) == ((32,), (10,))
    assert prior.learnt == 2
    assert prior.rates[("ResNet-18", 1, 32)].jobs == 2
    assert prior.rates[("ResNet-18", 1, 32)].samples_per_second == pytest.approx((100 + 50) / 2)
    assert prior.rates[("ResNet-18", 1, 256)].samples_per_second == pytest.approx(250.0)


@pytest.mark.parametrize(
    "job_",
    [
        pytest.param(finished([(32, 10)], mode=STATIC), id="static-mode"),
        pytest.param(finished([(256, 10)], ladder=(32, 256)), id="already-at-its-largest"),
    ],
)
def test_a_job_that_could_not_adapt_teaches_rates_but_no_template(job_: FinishedJob) -> None:
    prior = learnt(job_)

    assert dict(prior.templates) == {}
    assert prior.learnt == 1


def test_a_group_keeps_its_most_recent_templates() -> None:
    prior = learnt(*(finished([(32, n), (256, 10)]) for n in (1, 2, 3, 4)), max_per_group=2)

    assert [t.lengths for t in prior.group((ACCORDION, "ResNet-18", 32))] == [(3, 10), (4, 10)]


def test_the_prior_survives_json_and_a_malformed_one_is_refused() -> None:
    prior = learnt(
        finished([(32, 3), (256, 7)], measured={32: 10.0, 256: 4.0}),
        finished([(5, 11), (10, 20), (5, 1)], mode=GNS, model="LM", ladder=(5, 10, 80)),
    )

    assert prior.steps
    assert PopulationPrior.from_json(prior.as_json()) == prior
    older = {k: v for k, v in prior.as_json().items() if k != "steps"}
    assert PopulationPrior.from_json(older).steps == {}, "a prior stored before steps reads"
    with pytest.raises(PriorFormatError, match="unreadable"):
        PopulationPrior.from_json({"groups": [{"mode": "sideways"}], "rates": []})


# --- predicting -------------------------------------------------------------------------------


def test_with_no_finished_job_an_accordion_job_gets_the_papers_prediction() -> None:
    fresh = job()

    assert regimes(predict_population(fresh, EMPTY_PRIOR)) == regimes(predict(fresh))


def test_with_no_finished_job_a_long_ladder_is_cheaper_to_predict_static() -> None:
    # Paper: four regimes of 25. Static and the paper's rule are equally likely a priori; a
    # wrong static guess costs a 4-regime truth 2 * 75 / 4 / 100 = 37.5%, a wrong 4-regime
    # guess costs a static truth 75%: the Bayes point for regime-length error is static.
    fresh = job(mode=GNS, ladder=(32, 64, 128, 256))

    assert regimes(predict_population(fresh, EMPTY_PRIOR)) == [(32, 100.0)]


def test_finished_jobs_teach_the_split() -> None:
    prior = learnt(*(finished([(32, 30), (256, 70)]) for _ in range(3)))

    assert regimes(predict_population(job(), prior)) == [(32, 30.0), (256, 70.0)]


def test_finished_jobs_of_a_model_that_never_adapts_teach_it_is_static() -> None:
    prior = learnt(*(finished([(32, 100)], model="Transformer") for _ in range(3)))

    assert regimes(predict_population(job(model="Transformer"), prior)) == [(32, 100.0)]


def test_an_ongoing_regime_past_every_learnt_switch_is_restated_as_the_last() -> None:
    prior = learnt(
        *(finished([(32, 30), (256, 70)]) for _ in range(3)),
        finished([(32, 100)]),
    )

    early = predict_population(job(epochs_done=10.0), prior)
    late = predict_population(job(epochs_done=40.0), prior)

    assert regimes(early) == [(32, 30.0), (256, 70.0)]
    assert regimes(late) == [(32, 100.0)], "no adapting job ran 40% without switching"


def test_observed_regimes_are_kept_and_the_rest_split_as_the_templates_do() -> None:
    # Templates: 10 at 32, 60 at 256, 30 back at 32. Seen: 20 at 32, now at 256: the 80 left
    # split as the templates split what followed their first regime (60:30 of 90).
    prior = learnt(*(finished([(32, 10), (256, 60), (32, 30)]) for _ in range(3)))

    seen = job(observed=[(32, 20)], batch_size=256, epochs_done=25.0)

    assert regimes(predict_population(seen, prior)) == [
        (32, 20.0),
        (256, pytest.approx(80 * 60 / 90)),
        (32, pytest.approx(80 * 30 / 90)),
    ]


def test_a_switch_at_a_fixed_epoch_replays_on_jobs_of_similar_length() -> None:
    # A warm-up of 10 epochs, whatever the length: the kernel trusts jobs of similar length.
    short = [finished([(32, 10), (256, 10)]) for _ in range(3)]
    long = [finished([(32, 10), (256, 190)]) for _ in range(3)]
    prior = learnt(*short, *long)
    params = PopulationParams(length_bandwidth=0.3)

    assert regimes(predict_population(job(epochs=20), prior, population=params)) == [
        (32, 10.0),
        (256, 10.0),
    ]
    assert regimes(predict_population(job(epochs=200), prior, population=params)) == [
        (32, 10.0),
        (256, 190.0),
    ]


def test_templates_of_another_initial_size_replay_on_the_jobs_ladder() -> None:
    # GNS LM from 10: 10 -> 20 -> 80 (the top). A job from 5 on the same ladder replays the
    # symbols 0, 1, TOP as 5, 10, 80.
    ladder = (5, 10, 20, 40, 80)
    prior = learnt(
        *(
            finished([(10, 20), (20, 30), (80, 50)], mode=GNS, model="LM", ladder=ladder)
            for _ in range(3)
        )
    )

    prediction = predict_population(job(mode=GNS, model="LM", ladder=ladder), prior)

    assert regimes(prediction) == [(5, 20.0), (10, 30.0), (80, 50.0)]


def test_other_models_speak_only_when_the_jobs_own_model_is_unknown() -> None:
    others = [
        finished([(32, 30), (256, 70)], model=model)
        for model in ("LM", "Transformer", "ResNet-50")
        for _ in range(10)
    ]
    own = [finished([(32, 100)]) for _ in range(3)]

    # Three models that agree pull an unseen model from the paper's even split towards their
    # switch at 30%; its own model's jobs, once there are enough, decide alone.
    (_, first), (_, second) = regimes(predict_population(job(), learnt(*others)))
    assert 30.0 <= first < 50.0 and first + second == 100.0
    assert regimes(predict_population(job(), learnt(*others, *own))) == [(32, 100.0)]


def test_an_unseen_model_hears_other_models_as_models_not_as_their_jobs() -> None:
    # Thirty finished jobs of one other model say no more than two of it: a model never seen
    # keeps the paper's rule against one other model's pattern, however many jobs it ran.
    def lm_jobs(count: int) -> list[FinishedJob]:
        return [finished([(32, 30), (256, 70)], model="LM") for _ in range(count)]

    many = regimes(predict_population(job(), learnt(*lm_jobs(30))))
    two = regimes(predict_population(job(), learnt(*lm_jobs(2))))

    assert many == two == regimes(predict(job()))


def test_an_unseen_model_past_every_switch_of_its_mode_is_predicted_static() -> None:
    # Three other models switch at 30 of 100 epochs. An unseen model's job at 20 epochs may
    # still switch (the paper's rule and the mode agree it will); at 40 it has outlived every
    # switch its mode has seen, so the paper's switch at 50 no longer speaks for it.
    others = learnt(
        *(
            finished([(32, 30), (256, 70)], model=model)
            for model in ("LM", "Transformer", "ResNet-50")
            for _ in range(10)
        )
    )

    (_, before), _ = regimes(predict_population(job(epochs_done=20.0), others))
    assert 30.0 <= before <= 50.0
    assert regimes(predict_population(job(epochs_done=40.0), others)) == [(32, 100.0)]
    unscaled = PopulationParams(mode_hazard=False)
    assert regimes(predict_population(job(epochs_done=40.0), others, population=unscaled)) == [
        (32, 50.0),
        (256, 50.0),
    ]


def test_the_mode_times_an_unseen_model_only_by_the_switches_still_ahead() -> None:
    # Of three other models, one switches at 30 and two at 70: at 40 epochs two thirds of the
    # mode's switches are still ahead, and the job keeps a switch. A model with a finished job
    # of its own is not timed by the mode: past every switch, the paper's rule keeps its whole
    # weight and ties with the static guess (the paper's even split wins the tie).
    others = learnt(
        *(finished([(32, 30), (256, 70)], model="LM") for _ in range(10)),
        *(
            finished([(32, 70), (256, 30)], model=model)
            for model in ("Transformer", "ResNet-50")
            for _ in range(10)
        ),
    )

    kept = regimes(predict_population(job(epochs_done=40.0), others))
    assert len(kept) == 2 and kept[0][1] > 40.0
    rare = learnt(
        finished([(32, 30), (256, 70)]),
        *(finished([(32, 30), (256, 70)], model="LM") for _ in range(10)),
    )
    assert regimes(predict_population(job(epochs_done=40.0), rare)) == [(32, 50.0), (256, 50.0)]


# --- GNS: a job that ended is not a job that stopped climbing (issue 19) ----------------------

LM_LADDER = (5, 10, 20, 40, 80)


def lm(regimes_: Sequence[tuple[int, int]]) -> FinishedJob:
    return finished(regimes_, mode=GNS, model="LM", ladder=LM_LADDER)


def lm_job_at_20() -> ActiveJob:
    """An LM GNS job of 200 epochs that went 5 -> 10 -> 20 in its first 20 and is at 25."""
    return job(
        mode=GNS,
        model="LM",
        ladder=LM_LADDER,
        epochs=200,
        observed=[(5, 10), (10, 10)],
        batch_size=20,
        epochs_done=25.0,
    )


def test_a_shorter_gns_template_that_ended_below_the_top_is_continued_up_the_ladder() -> None:
    # Three LM jobs of 40 epochs ended at 20: they stopped climbing because they ended. Another
    # LM job grew from 20, so 20 is no ceiling for the model. A job of 200 epochs now at 20 is
    # predicted to climb to 80 (the 120-job trace's job 22: without this it was predicted to
    # stay at 20 for its last 180 epochs, 60% too long).
    short = [lm([(5, 10), (10, 10), (20, 20)]) for _ in range(3)]
    prior = learnt(*short, lm([(20, 10), (40, 10)]))
    running = lm_job_at_20()

    prediction = predict_population(running, prior)

    assert [bs for bs, _ in regimes(prediction)] == [5, 10, 20, 40, 80]
    assert sum(r.epochs for r in prediction.regimes) == pytest.approx(200.0)


def test_a_shorter_gns_template_stays_put_where_its_model_never_grew() -> None:
    # The same short jobs, but no LM job ever left 20: the model's GNS jobs may stop there.
    prior = learnt(*(lm([(5, 10), (10, 10), (20, 20)]) for _ in range(3)))
    running = lm_job_at_20()

    assert regimes(predict_population(running, prior)) == [(5, 10.0), (10, 10.0), (20, 180.0)]


def test_a_gns_job_at_a_size_its_model_grew_from_is_not_predicted_static() -> None:
    # One LM job of 25 epochs climbed the whole ladder. Before, the static pseudo-job (weight
    # 0.3) won against it and the paper's rule: a wrong static guess costs a five-regime truth
    # a fifth of what a five-regime guess costs a static truth (heavy-gns-32 seed 3: a GNS job
    # predicted at 1,074 s ran 332 s). Once the model has grown from the job's size, the static
    # guess stands for nothing the data have not already said.
    prior = learnt(lm([(5, 5), (10, 5), (20, 5), (40, 5), (80, 5)]))
    fresh = job(mode=GNS, model="LM", ladder=LM_LADDER, epochs=100)

    assert [bs for bs, _ in regimes(predict_population(fresh, prior))] == list(LM_LADDER)
    kept = PopulationParams(grown_static_weight=0.3)
    assert regimes(predict_population(fresh, prior, population=kept)) == [(5, 100.0)]


@pytest.mark.parametrize(
    "fresh",
    [
        pytest.param(job(mode=STATIC), id="static"),
        pytest.param(job(ladder=(256,)), id="no-room-to-grow"),
    ],
)
def test_a_job_that_cannot_adapt_is_the_papers_single_regime(fresh: ActiveJob) -> None:
    prior = learnt(*(finished([(32, 30), (256, 70)]) for _ in range(3)))

    assert regimes(predict_population(fresh, prior)) == [(fresh.progress.batch_size, 100.0)]


def test_the_prediction_sums_to_the_jobs_epochs_and_knows_where_it_stands() -> None:
    prior = learnt(
        finished([(32, 10), (256, 60), (32, 30)]),
        finished([(32, 50), (256, 50)]),
        finished([(32, 100)]),
    )
    for done in (0.0, 5.0, 20.0, 45.0):
        prediction = predict_population(job(epochs_done=done), prior)
        assert sum(r.epochs for r in prediction.regimes) == pytest.approx(100.0)
        assert (prediction.current, prediction.epochs_done) == (0, done)
        assert prediction.regimes[0].epochs > done


# --- a tenant learning apart ------------------------------------------------------------------


def lm_job_of(epochs: int) -> ActiveJob:
    """An LM GNS job at its initial size 5, nothing observed yet."""
    return job(mode=GNS, model="LM", ladder=LM_LADDER, epochs=epochs)


def test_a_tenant_with_few_finished_jobs_predicts_from_the_papers_rule() -> None:
    # One short LM job of the tenant's own finished at 5 without growing. A single prior takes
    # it (and the static guess) as the model's word: a 65-epoch job stays at 5, the longest run
    # time it could have. Learning apart, the tenant's one finished job weighs less than the
    # paper's rule, which reads the job's own declaration alone.
    prior = learnt(lm([(5, 21)]))
    fresh = lm_job_of(65)
    knobs = PopulationParams()

    assert regimes(predict_population(fresh, prior, population=knobs)) == [(5, 65.0)]
    apart = predict_population(fresh, prior, population=apart_params(knobs, prior.learnt))
    assert regimes(apart) == regimes(predict(fresh))


def test_a_tenants_own_finished_jobs_take_over_from_the_papers_rule() -> None:
    # Ten of its LM jobs of the same length finished at 5: the tenant's own data say static.
    prior = learnt(*(lm([(5, 65)]) for _ in range(10)))
    fresh = lm_job_of(65)

    apart = predict_population(fresh, prior, population=apart_params(PopulationParams(), 10))
    assert regimes(apart) == [(5, 65.0)]


def test_the_papers_rule_weighs_less_as_the_tenants_jobs_finish() -> None:
    knobs = PopulationParams()
    weights = [apart_params(knobs, n).prior_weight for n in (0, 1, 10, 100, 1000)]

    assert weights[0] == pytest.approx(knobs.prior_weight + knobs.neutral_weight)
    assert weights[2] == pytest.approx(knobs.prior_weight + knobs.neutral_weight / 2)
    assert all(a > b for a, b in itertools.pairwise(weights))
    assert weights[-1] > knobs.prior_weight
    # the same knobs object for the same count (predictions are memoized by its identity)
    assert apart_params(knobs, 7) is apart_params(knobs, 7)
    off = PopulationParams(neutral_weight=0.0)
    assert apart_params(off, 3) is off
    with pytest.raises(ValueError, match="neutral_jobs"):
        PopulationParams(neutral_jobs=-1.0)


def test_a_finished_job_teaches_the_step_between_each_two_sizes_it_measured() -> None:
    # 10 s an epoch at 32, 4 s at 256 (the rate 2.5 times), twice; an unnamed model teaches none
    prior = learnt(
        finished([(32, 3), (256, 7)], measured={32: 10.0, 256: 4.0}),
        finished([(32, 3), (256, 7)], measured={32: 10.0, 256: 4.0}),
        finished([(32, 3), (256, 7)], model="", measured={32: 10.0, 256: 4.0}),
        finished([(32, 10)], measured={32: 7.0}),
    )

    assert set(prior.steps) == {("ResNet-18", 1, 32, 256), ("ResNet-18", 1, 256, 32)}
    up = prior.steps[("ResNet-18", 1, 32, 256)]
    assert up.jobs == 2
    assert up.log_ratio_sum == pytest.approx(2 * math.log(2.5))
    assert prior.steps[("ResNet-18", 1, 256, 32)].log_ratio_sum == pytest.approx(-up.log_ratio_sum)
    assert StepStat(0, 0.0).add(1.0).add(2.0) == StepStat(2, 3.0)
