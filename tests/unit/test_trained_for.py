"""A running job as it stands some seconds after its last report
(:meth:`shockwave.domain.snapshot.ActiveJob.trained_for`): the service's policy sees what the
simulator's sees (fractional progress) from whole-epoch reports and the time since."""

from __future__ import annotations

import pytest

from shockwave.domain.model import ElasticRange, JobSpec, ThroughputProfile
from shockwave.domain.snapshot import PART_OF_NEXT_EPOCH, ActiveJob, JobProgress

SAMPLES = 1000
RATE = 10.0
"""Declared samples per second at batch size 32: 100 s an epoch."""


def job(
    epochs_done: float = 3.0,
    gpus: tuple[int, ...] = (0, 1),
    measured: dict[int, float] | None = None,
    elastic: ElasticRange | None = None,
    epochs: int = 10,
    throughput: dict[int, float] | None = None,
) -> ActiveJob:
    spec = JobSpec(
        job_id="j",
        gpus=2,
        epochs=epochs,
        samples_per_epoch=SAMPLES,
        initial_batch_size=32,
        throughput=ThroughputProfile({32: RATE} if throughput is None else throughput),
        elastic=elastic,
    )
    progress = JobProgress(
        batch_size=32,
        epochs_done=epochs_done,
        measured_epoch_seconds=measured or {},
        gpus=gpus,
    )
    return ActiveJob(spec, progress)


def test_a_running_job_gains_the_part_of_its_next_epoch_it_has_trained() -> None:
    assert job().trained_for(30.0).progress.epochs_done == pytest.approx(3.3)


def test_a_measured_epoch_time_wins_over_the_declared_one() -> None:
    seen = job(measured={32: 60.0}).trained_for(30.0)
    assert seen.progress.epochs_done == pytest.approx(3.5)


def test_the_part_stays_under_one_epoch_and_short_of_the_end() -> None:
    assert job().trained_for(1_000.0).progress.epochs_done == pytest.approx(3 + PART_OF_NEXT_EPOCH)
    last = job(epochs_done=9.0, epochs=10).trained_for(1_000.0)
    assert last.progress.epochs_done < 10
    assert last.remaining_epochs > 0


@pytest.mark.parametrize(
    ("seconds", "gpus", "throughput"),
    [(30.0, (), None), (0.0, (0, 1), None), (-5.0, (0, 1), None), (30.0, (0, 1), {})],
    ids=["not running", "no time", "clock behind", "epoch time unknown"],
)
def test_unchanged_without_running_time_or_an_epoch_time(
    seconds: float, gpus: tuple[int, ...], throughput: dict[int, float] | None
) -> None:
    before = job(gpus=gpus, throughput=throughput)
    assert before.trained_for(seconds) is before


def test_fractional_progress_is_never_moved_back() -> None:
    """The simulator hands over fractional epochs: a shorter time since adds nothing."""
    exact = job(epochs_done=3.6)
    assert exact.trained_for(30.0) is exact
    assert exact.trained_for(80.0).progress.epochs_done == pytest.approx(3.8)


def test_an_elastic_job_off_its_requested_count_runs_at_its_speed_up() -> None:
    elastic = ElasticRange(1, 8, {4: {32: 2.0}})
    wide = job(gpus=(0, 1, 2, 3), elastic=elastic).trained_for(30.0)
    assert wide.progress.epochs_done == pytest.approx(3.6), "twice as fast on 4 GPUs"
    narrow = job(gpus=(0,), elastic=elastic).trained_for(30.0)
    assert 3.0 < narrow.progress.epochs_done < 3.3, "slower on one GPU than on two"


def test_a_queued_job_keeps_what_its_stopped_attempt_trained_of_the_epoch() -> None:
    """Stopped mid-epoch, a program resumes from its checkpoint: the 40 s it trained after
    its last report are part of its next epoch, queued (no GPU) as much as running."""
    queued = job(gpus=()).trained_for(0.0, carried_s=40.0)
    assert queued.progress.epochs_done == pytest.approx(3.4)


def test_carried_and_running_time_add_up_under_one_epoch() -> None:
    assert job().trained_for(30.0, carried_s=40.0).progress.epochs_done == pytest.approx(3.7)
    capped = job().trained_for(60.0, carried_s=90.0).progress.epochs_done
    assert capped == pytest.approx(3 + PART_OF_NEXT_EPOCH)


def test_carried_time_counts_at_the_requested_count_for_an_elastic_job() -> None:
    """The carry is banked in seconds without the widths of the attempts that trained it: it
    counts at the requested count; the held GPUs' time at their speed-up."""
    elastic = ElasticRange(1, 8, {4: {32: 2.0}})
    wide = job(gpus=(0, 1, 2, 3), elastic=elastic).trained_for(10.0, carried_s=30.0)
    assert wide.progress.epochs_done == pytest.approx(3.5), "0.3 carried + 0.2 on 4 GPUs"
