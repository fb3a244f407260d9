"""The regime predictor: the restatement rule worked by hand, batch-size patterns by mode, and
the predicted trajectory's seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shockwave.domain.model import AdaptationMode, Regime
from shockwave.domain.snapshot import ActiveJob
from shockwave.prediction.predictor import (
    PredictedRegime,
    Prediction,
    PredictorParams,
    batch_size_pattern,
    greedy_remaining_seconds,
    predict,
    predict_from_truth,
    predict_greedy,
    restate,
)
from tests.builders import adaptive_job

ACCORDION = AdaptationMode.ACCORDION
GNS = AdaptationMode.GNS
CUSTOM = AdaptationMode.CUSTOM
STATIC = AdaptationMode.STATIC

# (batch size, epochs, seconds per epoch)
RegimeRow = tuple[int, float, float]


def shape(prediction: Prediction) -> list[RegimeRow]:
    return [(r.batch_size, r.epochs, r.epoch_seconds) for r in prediction.regimes]


def assert_regimes(got: Prediction, expected: Sequence[RegimeRow]) -> None:
    assert [r.batch_size for r in got.regimes] == [bs for bs, _, _ in expected], shape(got)
    for regime, (_, epochs, seconds) in zip(got.regimes, expected, strict=True):
        assert regime.epochs == pytest.approx(epochs, abs=1e-9), shape(got)
        assert regime.epoch_seconds == pytest.approx(seconds, rel=1e-12), shape(got)


def trajectory(*rows: RegimeRow, current: int = 0, done: float = 0.0) -> Prediction:
    regimes = tuple(PredictedRegime(bs, e, s) for bs, e, s in rows)
    total = round(sum(e for _, e, _ in rows))
    return Prediction(regimes=regimes, current=current, epochs_done=done, total_epochs=total)


# --- the restatement rule ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "observed", "current_done", "k_max", "expected"),
    [
        pytest.param(100, [], 0.0, 4, [25, 25, 25, 25], id="prior-E-over-K"),
        pytest.param(100, [], 10.0, 4, [25, 25, 25, 25], id="ongoing-within-its-share"),
        pytest.param(100, [20], 0.0, 4, [20, 80 / 3, 80 / 3, 80 / 3], id="after-regime-1"),
        pytest.param(100, [20, 30], 0.0, 4, [20, 30, 25, 25], id="after-regime-2"),
        pytest.param(100, [20, 30, 40], 0.0, 4, [20, 30, 40, 10], id="last-regime-takes-rest"),
        pytest.param(
            100, [20], 40.0, 4, [20, 40 + 40 / 3, 40 / 3, 40 / 3], id="ongoing-past-its-share"
        ),
        pytest.param(100, [], 70.0, 2, [85, 15], id="first-regime-past-its-share"),
        pytest.param(100, [], 30.0, 1, [100], id="one-regime-is-the-whole-job"),
        pytest.param(100, [20, 30, 10], 5.0, 2, [20, 30, 10, 40], id="K-raised-to-k-plus-1"),
        pytest.param(100, [60, 40], 0.0, 2, [60, 40, 0], id="all-epochs-observed"),
    ],
)
def test_restatement_rule(
    total: int, observed: list[float], current_done: float, k_max: int, expected: list[float]
) -> None:
    got = restate(total, observed, current_done, k_max)
    assert got == pytest.approx(expected, abs=1e-9)


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, list[int], float, int]:
    """(E, observed m_1..m_k, epochs of the ongoing regime, K): consistent with E epochs."""
    total = draw(st.integers(1, 300))
    observed: list[int] = []
    for _ in range(draw(st.integers(0, 6))):
        left = total - sum(observed)
        if left < 1:
            break
        observed.append(draw(st.integers(1, left)))
    left = total - sum(observed)
    current_done = draw(st.floats(0.0, float(left), allow_nan=False))
    return total, observed, current_done, draw(st.integers(1, 6))


@settings(max_examples=300, deadline=None)
@given(histories())
def test_restated_regimes_split_the_job(history: tuple[int, list[int], float, int]) -> None:
    total, observed, current_done, k_max = history
    got = restate(total, [float(m) for m in observed], current_done, k_max)
    assert len(got) == max(k_max, len(observed) + 1)
    assert got[: len(observed)] == observed
    assert sum(got) == pytest.approx(total, rel=1e-9)
    assert all(e >= -1e-9 for e in got), got
    assert got[len(observed)] >= current_done - 1e-9, "the ongoing regime cannot have ended"


@settings(max_examples=200, deadline=None)
@given(histories())
def test_predicted_accordion_trajectory_splits_the_job(
    history: tuple[int, list[int], float, int],
) -> None:
    total, observed, current_done, _ = history
    sizes = [32 if i % 2 == 0 else 256 for i in range(len(observed) + 1)]
    job = adaptive_job(
        mode=ACCORDION,
        initial=32,
        batch_sizes=(32, 256),
        epochs=total,
        observed=list(zip(sizes, observed, strict=False)),
        batch_size=sizes[-1],
        epochs_done=sum(observed) + current_done,
        profile={32: 2.0, 256: 1.0},
    )
    prediction = predict(job)
    assert sum(r.epochs for r in prediction.regimes) == pytest.approx(total, rel=1e-9)
    assert all(r.epochs >= -1e-9 for r in prediction.regimes)
    assert [r.batch_size for r in prediction.regimes][: len(sizes)] == sizes
    assert prediction.current == len(observed)
    left = sum(r.epochs for r in prediction.remaining_regimes())
    assert left == pytest.approx(total - sum(observed) - current_done, abs=1e-6)
    assert prediction.epochs_after(math.inf) == pytest.approx(left, abs=1e-9)


# --- batch sizes by mode ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "initial", "declared", "observed", "current", "pattern"),
    [
        pytest.param(STATIC, 32, (), [], 32, [32], id="static"),
        pytest.param(ACCORDION, 32, (32, 256), [], 32, [32, 256], id="accordion-fresh"),
        pytest.param(ACCORDION, 32, (32, 256), [(32, 10)], 256, [32, 256], id="accordion-in-large"),
        pytest.param(
            ACCORDION,
            32,
            (32, 256),
            [(32, 10), (256, 20)],
            32,
            [32, 256, 32],
            id="accordion-back-to-small",
        ),
        pytest.param(GNS, 32, (32, 64, 128, 256), [], 32, [32, 64, 128, 256], id="gns-fresh"),
        pytest.param(
            GNS, 32, (32, 64, 128, 256), [(32, 10)], 64, [32, 64, 128, 256], id="gns-climbing"
        ),
        pytest.param(
            GNS,
            32,
            (32, 64, 128, 256),
            [(32, 10), (64, 10), (128, 10)],
            256,
            [32, 64, 128, 256],
            id="gns-at-the-top",
        ),
        pytest.param(
            GNS, 32, (32, 64, 128, 256), [(32, 10)], 128, [32, 128, 256], id="gns-skipped-a-rung"
        ),
        pytest.param(CUSTOM, 64, (64, 128, 32), [], 64, [64, 128, 32], id="custom-fresh"),
        pytest.param(CUSTOM, 64, (64, 128, 32), [(64, 10)], 128, [64, 128, 32], id="custom-second"),
        pytest.param(ACCORDION, 256, (64, 256), [], 256, [256], id="accordion-starts-at-max"),
        pytest.param(GNS, 256, (64, 128, 256), [], 256, [256], id="gns-starts-at-max"),
    ],
)
def test_batch_size_pattern_follows_the_mode(
    mode: AdaptationMode,
    initial: int,
    declared: tuple[int, ...],
    observed: list[tuple[int, int]],
    current: int,
    pattern: list[int],
) -> None:
    job = adaptive_job(
        mode=mode,
        initial=initial,
        batch_sizes=declared,
        observed=observed,
        batch_size=current,
        epochs_done=sum(e for _, e in observed),
    )
    assert batch_size_pattern(job, PredictorParams()) == pattern
    assert [r.batch_size for r in predict(job).regimes] == pattern


@pytest.mark.parametrize(
    ("observed", "current"),
    [
        ([], 32),
        ([(32, 5)], 64),
        ([(32, 5), (64, 5)], 128),
        ([(32, 5), (64, 5), (128, 5)], 256),
    ],
)
def test_gns_never_goes_down(observed: list[tuple[int, int]], current: int) -> None:
    job = adaptive_job(
        mode=GNS,
        initial=32,
        batch_sizes=(32, 64, 128, 256),
        observed=observed,
        batch_size=current,
        epochs_done=sum(e for _, e in observed) + 1.0,
    )
    sizes = [r.batch_size for r in predict(job).regimes]
    assert sizes == sorted(sizes)
    assert sizes[len(observed)] == current
    assert sizes[-1] == 256


# --- predicted trajectories -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "expected", "current"),
    [
        pytest.param(
            adaptive_job(epochs=10, epochs_done=4.0, profile={32: 2.0}),
            [(32, 10, 2.0)],
            0,
            id="static-one-regime",
        ),
        pytest.param(
            adaptive_job(
                mode=ACCORDION, initial=32, batch_sizes=(32, 256), profile={32: 2.0, 256: 1.0}
            ),
            [(32, 50, 2.0), (256, 50, 1.0)],
            0,
            id="accordion-fresh",
        ),
        pytest.param(
            adaptive_job(
                mode=ACCORDION,
                initial=32,
                batch_sizes=(32, 256),
                observed=[(32, 10)],
                batch_size=256,
                epochs_done=10.0,
                profile={32: 2.0, 256: 1.0},
            ),
            [(32, 10, 2.0), (256, 90, 1.0)],
            1,
            id="accordion-after-small",
        ),
        pytest.param(
            adaptive_job(
                mode=ACCORDION,
                initial=32,
                batch_sizes=(32, 256),
                epochs_done=70.0,
                profile={32: 2.0, 256: 1.0},
            ),
            [(32, 85, 2.0), (256, 15, 1.0)],
            0,
            id="accordion-small-past-its-share",
        ),
        pytest.param(
            adaptive_job(
                mode=ACCORDION,
                initial=32,
                batch_sizes=(32, 256),
                observed=[(32, 10), (256, 20)],
                epochs_done=40.0,
                profile={32: 2.0, 256: 1.0},
            ),
            [(32, 10, 2.0), (256, 20, 1.0), (32, 70, 2.0)],
            2,
            id="accordion-more-regimes-than-K",
        ),
        pytest.param(
            adaptive_job(
                mode=GNS,
                initial=32,
                batch_sizes=(32, 64, 128, 256),
                observed=[(32, 20)],
                batch_size=64,
                epochs_done=20.0,
                profile={32: 4.0, 64: 3.0, 128: 2.0, 256: 1.0},
            ),
            [(32, 20, 4.0), (64, 80 / 3, 3.0), (128, 80 / 3, 2.0), (256, 80 / 3, 1.0)],
            1,
            id="gns-after-regime-1",
        ),
        pytest.param(
            adaptive_job(
                mode=CUSTOM,
                initial=64,
                batch_sizes=(64, 128, 32),
                epochs=90,
                profile={64: 2.0, 128: 1.0, 32: 3.0},
            ),
            [(64, 30, 2.0), (128, 30, 1.0), (32, 30, 3.0)],
            0,
            id="custom-fresh",
        ),
    ],
)
def test_predict_trajectory(job: ActiveJob, expected: list[RegimeRow], current: int) -> None:
    prediction = predict(job)
    assert_regimes(prediction, expected)
    assert prediction.current == current
    assert prediction.epochs_done == job.progress.epochs_done
    assert prediction.total_epochs == job.spec.epochs


def test_static_remaining_seconds_are_remaining_epochs_times_epoch_seconds() -> None:
    job = adaptive_job(epochs=10, epochs_done=4.0, profile={32: 2.0})
    prediction = predict(job)
    assert len(prediction.regimes) == 1
    assert prediction.total_seconds == pytest.approx(20.0)
    assert prediction.remaining_seconds == pytest.approx(6 * 2.0)


LAW = (32 / 256) ** 0.3


def blend(declared: float, scaled: float) -> float:
    """A declaration blended with the law's estimate from a measurement 8x away in batch size,
    by the default prior variances: 0.04 for the declaration, 0.09 (ln 8)^2 for the law."""
    weight = (1 / 0.04) / (1 / 0.04 + 1 / (0.09 * math.log(8) ** 2))
    return float(declared**weight * scaled ** (1 - weight))


@pytest.mark.parametrize(
    ("profile", "measured", "current", "expected"),
    [
        pytest.param(
            {32: 2.0, 256: 1.0},
            {256: 0.5},
            32,
            {32: blend(2.0, 0.5 / LAW), 256: 0.5},
            id="measured-wins",
        ),
        pytest.param(
            {32: 2.0, 256: 1.0},
            {32: 3.0},
            32,
            {32: 3.0, 256: blend(1.0, 3.0 * LAW)},
            id="profile-blended-with-the-law",
        ),
        # An unseen size scales by the batch-size law: samples/s ~ bs ** 0.3, so an epoch at
        # 256 takes (32 / 256) ** 0.3 of one at 32.
        pytest.param({32: 2.0}, {}, 32, {32: 2.0, 256: 2.0 * LAW}, id="scaled-from-profile"),
        pytest.param({}, {32: 3.0}, 32, {32: 3.0, 256: 3.0 * LAW}, id="scaled-from-measured"),
        pytest.param({}, {}, 32, {32: 7.0, 256: 7.0}, id="default"),
    ],
)
def test_epoch_seconds_precedence(
    profile: dict[int, float],
    measured: dict[int, float],
    current: int,
    expected: dict[int, float],
) -> None:
    job = adaptive_job(
        mode=ACCORDION,
        initial=32,
        batch_sizes=(32, 256),
        batch_size=current,
        profile=profile,
        measured=measured,
    )
    prediction = predict(job, PredictorParams(unknown_epoch_seconds=7.0))
    got = {r.batch_size: r.epoch_seconds for r in prediction.regimes}
    assert got == pytest.approx(expected)


# --- seconds along a trajectory ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "epochs"),
    [
        pytest.param(0.0, 0.0, id="nothing"),
        pytest.param(4.0, 2.0, id="inside-current"),
        pytest.param(10.0, 5.0, id="end-of-current"),
        pytest.param(15.0, 10.0, id="into-next-regime"),
        pytest.param(20.0, 15.0, id="exactly-the-end"),
        pytest.param(1000.0, 15.0, id="capped-at-the-end"),
    ],
)
def test_epochs_after_crosses_regimes(seconds: float, epochs: float) -> None:
    prediction = trajectory((32, 10, 2.0), (256, 10, 1.0), current=0, done=5.0)
    assert prediction.epochs_after(seconds) == pytest.approx(epochs)


@pytest.mark.parametrize(
    ("done", "current", "remaining"),
    [
        pytest.param(0.0, 0, 30.0, id="fresh"),
        pytest.param(5.0, 0, 20.0, id="mid-first"),
        pytest.param(10.0, 1, 10.0, id="start-of-second"),
        pytest.param(15.0, 1, 5.0, id="mid-second"),
        pytest.param(20.0, 1, 0.0, id="finished"),
    ],
)
def test_remaining_is_total_minus_elapsed_part(done: float, current: int, remaining: float) -> None:
    prediction = trajectory((32, 10, 2.0), (256, 10, 1.0), current=current, done=done)
    assert prediction.total_seconds == pytest.approx(30.0)
    assert prediction.remaining_seconds == pytest.approx(remaining)


def test_fresh_job_has_remaining_equal_total() -> None:
    job = adaptive_job(
        mode=GNS,
        initial=32,
        batch_sizes=(32, 64, 128, 256),
        profile={32: 4.0, 64: 3.0, 128: 2.0, 256: 1.0},
    )
    prediction = predict(job)
    assert prediction.total_seconds == pytest.approx(25 * (4.0 + 3.0 + 2.0 + 1.0))
    assert prediction.remaining_seconds == pytest.approx(prediction.total_seconds)


# --- the oracle and the greedy baseline -------------------------------------------------------


TRUTH = (Regime(32, 10), Regime(256, 90))
TRUTH_SECONDS = {32: 2.0, 256: 1.0}


@pytest.mark.parametrize(
    ("done", "current", "remaining"),
    [
        pytest.param(0.0, 0, 110.0, id="fresh"),
        pytest.param(4.0, 0, 102.0, id="in-first"),
        pytest.param(10.0, 1, 90.0, id="first-finished"),
        pytest.param(25.0, 1, 75.0, id="in-second"),
        pytest.param(100.0, 1, 0.0, id="done"),
    ],
)
def test_predict_from_truth_returns_the_truth(done: float, current: int, remaining: float) -> None:
    observed = [(32, 10)] if done >= 10 else []
    job = adaptive_job(
        mode=ACCORDION,
        initial=32,
        batch_sizes=(32, 256),
        observed=observed,
        batch_size=256 if observed else 32,
        epochs_done=done,
    )
    prediction = predict_from_truth(job, TRUTH, TRUTH_SECONDS)
    assert_regimes(prediction, [(32, 10, 2.0), (256, 90, 1.0)])
    assert prediction.current == current
    assert prediction.remaining_seconds == pytest.approx(remaining)


@pytest.mark.parametrize(
    ("job", "expected", "remaining"),
    [
        pytest.param(
            adaptive_job(
                mode=ACCORDION, initial=32, batch_sizes=(32, 256), profile={32: 2.0, 256: 1.0}
            ),
            [(32, 100, 2.0)],
            200.0,
            id="fresh-assumes-current-size-throughout",
        ),
        pytest.param(
            adaptive_job(
                mode=ACCORDION,
                initial=32,
                batch_sizes=(32, 256),
                observed=[(32, 10)],
                batch_size=256,
                epochs_done=30.0,
                measured={32: 2.0, 256: 0.5},
            ),
            [(32, 10, 2.0), (256, 90, 0.5)],
            70 * 0.5,
            id="after-a-switch",
        ),
    ],
)
def test_predict_greedy_uses_the_current_epoch_time(
    job: ActiveJob, expected: list[RegimeRow], remaining: float
) -> None:
    prediction = predict_greedy(job)
    assert_regimes(prediction, expected)
    assert prediction.current == len(job.progress.observed_regimes)
    assert prediction.remaining_seconds == pytest.approx(remaining)


@pytest.mark.parametrize("done", [0.0, 10.0, 33.3, 99.99999, 100.0])
@pytest.mark.parametrize("observed", [[], [(32, 10)], [(32, 7), (256, 3)]])
def test_greedy_remaining_seconds_is_predict_greedys_float(
    done: float, observed: list[tuple[int, int]]
) -> None:
    # the policy reads this of every job it looks at: it must be the very float, not close
    done = max(done, float(sum(e for _, e in observed)))
    job = adaptive_job(
        mode=ACCORDION,
        initial=32,
        batch_sizes=(32, 256),
        observed=observed,
        batch_size=256 if len(observed) % 2 else 32,
        epochs_done=done,
        measured={32: 2.0 / 3.0, 256: 0.1},
    )
    assert greedy_remaining_seconds(job) == predict_greedy(job).remaining_seconds
