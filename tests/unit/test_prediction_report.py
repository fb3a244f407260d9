"""The prediction-accuracy report: what a scheduler sees at each progress point, the two
measures worked by hand on small jobs, and the oracle as a sanity check."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

import pytest

from shockwave.domain.model import VALID_WIDTHS, AdaptationMode, Regime, ThroughputProfile
from shockwave.domain.population import EMPTY_PRIOR, DeclarationErrors
from shockwave.prediction.throughput_model import ThroughputModel
from shockwave.simulation.prediction_report import (
    POLICY_PREDICTOR,
    PROGRESS_PERCENTS,
    HeldOut,
    Knowledge,
    Predictor,
    held_out_as_dict,
    leave_one_model_out,
    observed_job,
    prediction_report,
    regime_length_error,
    runtime_accuracy,
    score_job,
)
from shockwave.workloads.generator import generate_workload
from shockwave.workloads.throughput_knowledge import ThroughputKnowledge, apply_knowledge
from shockwave.workloads.traces import ThroughputTable
from shockwave.workloads.workload import SimJob
from tests.builders import SAMPLES, sim_job, workload

ACCORDION = AdaptationMode.ACCORDION
GNS = AdaptationMode.GNS
RESTATEMENT = Predictor.RESTATEMENT
GREEDY = Predictor.GREEDY
ORACLE = Predictor.ORACLE
POPULATION = Predictor.POPULATION

# Accordion, E = 100: 20 epochs at batch size 32 (2 s each), then 80 at 128 (1 s each).
# P = 20 * 2 + 80 * 1 = 120 s. The prior (K = 2) splits the epochs 50/50.
TWO_REGIMES = sim_job("acc", [(32, 20, 2.0), (128, 80, 1.0)], mode=ACCORDION)

# GNS up the ladder 16 -> 32 -> 64, E = 100: 20 epochs at 4 s, 30 at 2 s, 50 at 1 s.
# P = 80 + 60 + 50 = 190 s. The prior (K = 3, from the ladder) splits the epochs in thirds.
THREE_REGIMES = sim_job("gns", [(16, 20, 4.0), (32, 30, 2.0), (64, 50, 1.0)], mode=GNS)

STATIC = sim_job("static", [(32, 10, 1.0)])

TRUSTED = Knowledge(EMPTY_PRIOR, ThroughputModel({}, declarations=DeclarationErrors(10**9, 0.0)))
"""Knowledge that declarations have always been exact: a declared epoch time stands as it is
(else the throughput model blends it with the scaling law, by how far declarations erred)."""


def regimes(*rows: tuple[int, int]) -> tuple[Regime, ...]:
    return tuple(Regime(bs, e) for bs, e in rows)


@pytest.mark.parametrize(
    ("epochs_done", "observed", "batch_size", "measured"),
    [
        pytest.param(0.0, (), 16, {}, id="start-nothing-measured"),
        pytest.param(10.0, (), 16, {16: 4.0}, id="inside-regime-1"),
        pytest.param(20.0, ((16, 20),), 32, {16: 4.0}, id="regime-1-just-ended"),
        pytest.param(25.0, ((16, 20),), 32, {16: 4.0, 32: 2.0}, id="inside-regime-2"),
        pytest.param(50.0, ((16, 20), (32, 30)), 64, {16: 4.0, 32: 2.0}, id="regime-2-ended"),
        pytest.param(99.5, ((16, 20), (32, 30)), 64, {16: 4.0, 32: 2.0, 64: 1.0}, id="near-end"),
    ],
)
def test_observed_job_is_what_the_simulator_shows(
    epochs_done: float,
    observed: tuple[tuple[int, int], ...],
    batch_size: int,
    measured: Mapping[int, float],
) -> None:
    view = observed_job(THREE_REGIMES, epochs_done)

    assert view.spec is THREE_REGIMES.spec
    assert view.progress.epochs_done == epochs_done
    assert view.progress.observed_regimes == regimes(*observed)
    assert view.progress.batch_size == batch_size
    assert dict(view.progress.measured_epoch_seconds) == measured


@pytest.mark.parametrize("epochs_done", [-1.0, 100.0, 120.0])
def test_observed_job_refuses_points_off_the_run(epochs_done: float) -> None:
    with pytest.raises(ValueError, match="epochs_done"):
        observed_job(THREE_REGIMES, epochs_done)


@pytest.mark.parametrize(
    ("predicted", "true", "expected"),
    [
        pytest.param([20.0, 80.0], [20, 80], 0.0, id="exact"),
        pytest.param([50.0, 50.0], [20, 80], (30 + 30) / 2 / 100, id="prior-split"),
        pytest.param([100.0], [20, 80], (80 + 80) / 2 / 100, id="missing-regime-counts-whole"),
        pytest.param([50.0, 25.0, 25.0], [50, 50], (0 + 25) / 2 / 100, id="extra-regime-no-term"),
    ],
)
def test_regime_length_error(predicted: list[float], true: list[int], expected: float) -> None:
    assert regime_length_error(predicted, true, 100) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("predicted_s", "true_s", "expected"),
    [(120.0, 120.0, 1.0), (150.0, 120.0, 0.75), (90.0, 120.0, 0.75), (300.0, 100.0, -1.0)],
)
def test_runtime_accuracy_is_one_minus_relative_error_unclipped(
    predicted_s: float, true_s: float, expected: float
) -> None:
    assert runtime_accuracy(predicted_s, true_s) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("job", "percent", "predictor", "regime_error", "accuracy"),
    [
        # 0%: restatement predicts 50/50 epochs, P_hat = 50*2 + 50*1 = 150 s.
        pytest.param(TWO_REGIMES, 0, RESTATEMENT, 0.30, 1 - 30 / 120, id="2r-0%-restatement"),
        # 0%: greedy runs all 100 epochs at 32 (2 s): P_hat = 200 s; regime 2 is missing.
        pytest.param(TWO_REGIMES, 0, GREEDY, 0.80, 1 - 80 / 120, id="2r-0%-greedy"),
        # 10%: the ongoing regime has not outrun its share (50): nothing changes.
        pytest.param(TWO_REGIMES, 10, RESTATEMENT, 0.30, 1 - 30 / 120, id="2r-10%-restatement"),
        # 20%: regime 1 is observed; restatement gives the rest to regime 2: exact.
        pytest.param(TWO_REGIMES, 20, RESTATEMENT, 0.0, 1.0, id="2r-20%-restatement"),
        pytest.param(TWO_REGIMES, 20, GREEDY, 0.0, 1.0, id="2r-20%-greedy"),
        pytest.param(TWO_REGIMES, 0, ORACLE, 0.0, 1.0, id="2r-0%-oracle"),
        # 0%: thirds of 100 epochs; P_hat = (100/3) * (4 + 2 + 1) = 700/3 s.
        pytest.param(
            THREE_REGIMES,
            0,
            RESTATEMENT,
            (40 / 3 + 10 / 3 + 50 / 3) / 3 / 100,
            1 - (700 / 3 - 190) / 190,
            id="3r-0%-restatement",
        ),
        # 0%: greedy: 100 epochs at 4 s = 400 s, more than twice P: accuracy below 0.
        pytest.param(
            THREE_REGIMES, 0, GREEDY, (80 + 30 + 50) / 3 / 100, 1 - 210 / 190, id="3r-0%-greedy"
        ),
        # 20%: regime 1 exact, the 80 left split 40/40: P_hat = 80 + 40*2 + 40*1 = 200 s.
        pytest.param(
            THREE_REGIMES,
            20,
            RESTATEMENT,
            (0 + 10 + 10) / 3 / 100,
            1 - 10 / 190,
            id="3r-20%-restatement",
        ),
        # 20%: greedy: the 80 left at 32 (2 s): P_hat = 80 + 160 = 240 s; regime 3 missing.
        pytest.param(
            THREE_REGIMES, 20, GREEDY, (0 + 50 + 50) / 3 / 100, 1 - 50 / 190, id="3r-20%-greedy"
        ),
        pytest.param(THREE_REGIMES, 20, ORACLE, 0.0, 1.0, id="3r-20%-oracle"),
    ],
)
def test_scores_worked_by_hand(
    job: SimJob, percent: int, predictor: Predictor, regime_error: float, accuracy: float
) -> None:
    got = score_job(job, percent, known=TRUSTED)[predictor]

    assert got.regime_error == pytest.approx(regime_error)
    assert got.runtime_accuracy == pytest.approx(accuracy)


def test_report_averages_dynamic_jobs_per_point_and_overall() -> None:
    report = prediction_report(workload(TWO_REGIMES, STATIC, THREE_REGIMES), percents=(0, 20))

    assert (report.workload, report.jobs, report.adapting_jobs) == ("test", 2, 2)
    assert [(row.percent, row.jobs) for row in report.rows] == [(0, 2), (20, 2)]
    start = report.rows[0].accuracy
    assert start[RESTATEMENT].regime_error == pytest.approx((0.30 + 100 / 900) / 2)
    assert start[GREEDY].regime_error == pytest.approx((0.80 + 160 / 300) / 2)
    for predictor in Predictor:
        per_point = [row.accuracy[predictor] for row in report.rows]
        assert report.overall[predictor].regime_error == pytest.approx(
            sum(a.regime_error for a in per_point) / 2
        )
        assert report.overall[predictor].runtime_accuracy == pytest.approx(
            sum(a.runtime_accuracy for a in per_point) / 2
        )
    assert report.adapting == report.overall
    assert set(report.by_mode) == {ACCORDION, GNS}
    assert report.by_mode[GNS][GREEDY].regime_error == pytest.approx((160 / 300 + 100 / 300) / 2)


def test_restatement_and_greedy_differ_and_restatement_wins_early() -> None:
    report = prediction_report(workload(TWO_REGIMES, THREE_REGIMES))
    start = report.rows[0].accuracy

    assert start[RESTATEMENT] != start[GREEDY]
    assert start[RESTATEMENT].regime_error < start[GREEDY].regime_error
    assert start[RESTATEMENT].runtime_accuracy > start[GREEDY].runtime_accuracy


def test_a_job_that_never_adapts_counts_but_not_as_adapting() -> None:
    # Declares accordion up to 128 (0.5 s an epoch) but stays at 32 (1 s) for all 100 epochs:
    # restatement still expects two 50-epoch regimes (error 0.5, P_hat = 75 s for P = 100 s).
    flat = sim_job("flat", [(32, 100, 1.0)], mode=ACCORDION)
    ladder = ThroughputProfile({32: SAMPLES / 1.0, 128: SAMPLES / 0.5})
    flat = replace(flat, spec=replace(flat.spec, batch_sizes=(32, 128), throughput=ladder))

    report = prediction_report(workload(flat, TWO_REGIMES), percents=(0,))

    assert (report.jobs, report.adapting_jobs) == (2, 1)
    assert report.overall[RESTATEMENT].regime_error == pytest.approx((0.5 + 0.30) / 2)
    assert report.overall[RESTATEMENT].runtime_accuracy == pytest.approx((0.75 + 0.75) / 2)
    assert report.overall[GREEDY].regime_error == pytest.approx((0.0 + 0.80) / 2)
    assert report.adapting[RESTATEMENT] == score_job(TWO_REGIMES, 0)[RESTATEMENT]


def test_a_workload_without_dynamic_jobs_gives_an_empty_report() -> None:
    report = prediction_report(workload(STATIC))

    assert (report.jobs, report.rows, dict(report.overall)) == (0, (), {})


def test_oracle_is_exact_on_a_generated_workload() -> None:
    rates = {
        ("ResNet-18", bs, width): 40.0 * width / 1.6**rung
        for width in VALID_WIDTHS
        for rung, bs in enumerate((16, 32, 64, 128, 256))
    }
    generated = generate_workload(
        40, seed=5, throughputs=ThroughputTable(rates), models=("ResNet-18",)
    )

    report = prediction_report(generated)

    assert report.jobs == 40
    assert report.adapting_jobs > 0
    assert [row.percent for row in report.rows] == list(PROGRESS_PERCENTS)
    for row in report.rows:
        assert row.accuracy[ORACLE].regime_error == pytest.approx(0.0, abs=1e-12)
        assert row.accuracy[ORACLE].runtime_accuracy == pytest.approx(1.0)
    oracle = report.overall_oracle()
    assert (oracle.regime_error, oracle.runtime_accuracy) == pytest.approx((0.0, 1.0), abs=1e-12)
    assert report.overall[RESTATEMENT] != report.overall[ORACLE]


def test_report_dict_is_json_ready() -> None:
    as_dict = prediction_report(workload(TWO_REGIMES), percents=(0, 20)).as_dict()

    assert as_dict["jobs"] == 1
    progress = as_dict["progress"]
    assert isinstance(progress, list)
    assert progress[0]["percent"] == 0
    assert progress[0]["greedy"] == {
        "regime_error": pytest.approx(0.8),
        "runtime_accuracy": pytest.approx(1 / 3),
    }
    overall = as_dict["overall"]
    assert isinstance(overall, dict)
    assert set(overall) == {"restatement", "population", "greedy", "oracle"}
    assert as_dict["policy_predictor"] == "population"
    assert as_dict["throughput_knowledge"] == "declared"
    assert "throughput_error" not in as_dict
    json.dumps(as_dict)


# --- the population predictor: no look-ahead -----------------------------------------------


def accordion(job_id: str, first: int, arrival: float, epochs: int = 100) -> SimJob:
    """An accordion ResNet-18 job that spends ``first`` epochs at 32 (1 s each), the rest at
    128 (0.5 s each)."""
    job = sim_job(
        job_id, [(32, first, 1.0), (128, epochs - first, 0.5)], mode=ACCORDION, arrival=arrival
    )
    return replace(job, spec=replace(job.spec, model="ResNet-18"))


def test_the_population_predictor_learns_only_from_jobs_finished_before_each_point() -> None:
    # Three jobs that all switch at 30%, each arriving after the previous one finished; the
    # first is scored with nothing learnt, the last with two finished jobs.
    jobs = [accordion(str(i), 30, arrival=1000.0 * i) for i in range(3)]

    first = prediction_report(workload(jobs[0]), percents=(0,))
    all_three = prediction_report(workload(*jobs), percents=(0,))

    alone = first.overall[POPULATION]
    assert alone == first.overall[RESTATEMENT], "nothing finished: the paper's rule"
    assert alone.regime_error == pytest.approx(0.2)
    # Jobs 1 and 2 are exact at 0% (30/70 learnt), job 0 is not.
    assert all_three.overall[POPULATION].regime_error == pytest.approx(0.2 / 3)
    assert all_three.overall[RESTATEMENT].regime_error == pytest.approx(0.2)


def test_a_slower_timeline_knows_less() -> None:
    # Job 1 arrives at 160 s; job 0 runs 30 + 35 = 65 s alone: finished by then at slowdown 2
    # (130 s), not at slowdown 3 (195 s).
    jobs = [accordion("0", 30, 0.0), accordion("1", 30, 160.0)]

    informed = prediction_report(workload(*jobs), percents=(0,), slowdown=2.0)
    blind = prediction_report(workload(*jobs), percents=(0,), slowdown=3.0)

    assert informed.overall[POPULATION].regime_error == pytest.approx(0.1)
    assert blind.overall[POPULATION].regime_error == pytest.approx(0.2)
    assert blind.slowdown == 3.0
    with pytest.raises(ValueError, match="slowdown"):
        prediction_report(workload(*jobs), slowdown=0.5)


def test_without_declared_throughputs_the_report_gives_the_throughput_error() -> None:
    jobs = [accordion(str(i), 30, arrival=1000.0 * i) for i in range(3)]
    hidden = apply_knowledge(workload(*jobs), ThroughputKnowledge("none"))

    report = prediction_report(hidden, percents=(0, 50), throughput_knowledge="none")
    as_dict = report.as_dict()

    # Job 0 at 0% knows nothing: its guess is the 60 s default for 1 s and 0.5 s epochs. Jobs
    # 1 and 2 know the rates job 0 measured, exactly.
    first_guess = (abs(60 - 1.0) / 1.0 + abs(60 - 0.5) / 0.5) / 2
    assert report.rows[0].throughput_error == pytest.approx(first_guess / 3)
    assert report.throughput_error == pytest.approx(first_guess / 3)
    assert report.rows[1].throughput_error is None, "at 50% every size has been measured"
    assert as_dict["throughput_knowledge"] == "none"
    assert as_dict["throughput_error"] == report.throughput_error
    assert as_dict["policy_predictor"] == str(POLICY_PREDICTOR) == "population"


def test_leave_one_model_out_scores_each_model_with_a_prior_that_never_saw_it() -> None:
    # Three ResNet-18 jobs, each arriving after the last finished, and one LM job: with the
    # ResNet-18 jobs held out, none of them is learnt, so each gets the paper's rule (0.2 at
    # 0%) where the whole report learns the 30/70 split from the first two.
    jobs = [accordion(str(i), 30, arrival=1000.0 * i) for i in range(3)]
    lm = replace(
        accordion("lm", 30, arrival=0.0), spec=replace(jobs[0].spec, job_id="lm", model="LM")
    )
    reports = leave_one_model_out(workload(*jobs, lm), percents=(0,))

    assert sorted(reports) == ["LM", "ResNet-18"]
    held_out = reports["ResNet-18"]
    assert held_out.jobs == 3
    assert held_out.overall[POPULATION].regime_error == pytest.approx(0.2)
    assert prediction_report(workload(*jobs), percents=(0,)).overall[
        POPULATION
    ].regime_error == pytest.approx(0.2 / 3)
    as_dict = held_out_as_dict(reports)
    models = as_dict["models"]
    assert isinstance(models, dict) and set(models) == {"LM", "ResNet-18"}
    json.dumps(as_dict)


def test_a_model_new_to_the_cluster_is_learnt_from_its_own_finished_jobs() -> None:
    # The same three ResNet-18 jobs (30/70), and three other models that switch at 20%, four
    # jobs each, all arriving after every ResNet-18 job has finished. Never seen: each
    # ResNet-18 job at 0% has the paper's even split (0.2), the others not finished yet. New
    # to the cluster: the others are the cluster's history from the start and pull the first
    # job from the even split towards their switch; the next two have finished ResNet-18 jobs
    # of their own and predict their 30/70 split exactly.
    jobs = [accordion(str(i), 30, arrival=1000.0 * i) for i in range(3)]
    others = [
        replace(job, spec=replace(job.spec, job_id=f"{model}{i}", model=model))
        for model in ("LM", "Transformer", "ResNet-50")
        for i in range(4)
        for job in [accordion(model, 20, arrival=1e6 + 1000.0 * i)]
    ]

    def held_out(way: HeldOut, *scored: SimJob) -> float:
        report = prediction_report(
            workload(*scored, *others), percents=(0,), held_out_model="ResNet-18", held_out=way
        )
        assert report.jobs == len(scored)
        return report.overall[POPULATION].regime_error

    assert held_out(HeldOut.NEVER_SEEN, *jobs) == pytest.approx(0.2)
    first = held_out(HeldOut.NEW, jobs[0])
    assert 0.05 <= first < 0.2 - 1e-6, "pulled towards the history's switch at 20%"
    assert held_out(HeldOut.NEW, *jobs) == pytest.approx(first / 3)
    reports = leave_one_model_out(workload(*jobs, *others), percents=(0,), held_out=HeldOut.NEW)
    assert reports["ResNet-18"].overall[POPULATION].regime_error == pytest.approx(first / 3)
