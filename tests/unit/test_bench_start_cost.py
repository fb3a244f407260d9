"""bench/start_cost.py: the lagged view a policy decides on there."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from bench.start_cost import (
    JITTER_S,
    jittered,
    lagged,
    main,
    positive,
    seconds_list,
    this_attempt,
    views_list,
)
from shockwave.domain.snapshot import ActiveJob
from shockwave.workloads.workload import Workload
from tests.builders import active_job, sim_job, snapshot


def test_running_jobs_are_seen_lag_seconds_of_training_behind() -> None:
    waiting = active_job("w", epochs_done=3.0)
    job = active_job("r", epochs_done=3.0)
    running = ActiveJob(job.spec, dataclasses.replace(job.progress, gpus=(0,)))
    seen = lagged(snapshot([waiting, running]), 150.0)
    assert seen.job("w") == waiting
    assert seen.job("r").progress.epochs_done == pytest.approx(1.5)  # 100 s an epoch
    assert lagged(snapshot([running]), 1000.0).job("r").progress.epochs_done == 0.0
    assert lagged(snapshot([running]), 0.0).jobs == (running,)


def test_the_whole_epochs_view_floors_every_job() -> None:
    waiting = active_job("w", epochs_done=3.7)
    job = active_job("r", epochs_done=3.0)
    running = ActiveJob(job.spec, dataclasses.replace(job.progress, gpus=(0,)))
    seen = lagged(snapshot([waiting, running]), 50.0, whole=True)
    assert seen.job("w").progress.epochs_done == 3.0
    assert seen.job("r").progress.epochs_done == 2.0  # 2.5 after the lag, then floored
    exact = active_job("e", epochs_done=4.0)
    assert lagged(snapshot([exact]), 0.0, whole=True).job("e") == exact


def running(job_id: str, epochs_done: float) -> ActiveJob:
    job = active_job(job_id, epochs_done=epochs_done)
    return ActiveJob(job.spec, dataclasses.replace(job.progress, gpus=(0,)))


def test_the_attempt_view_sees_only_this_attempts_part_of_the_epoch() -> None:
    """100 s an epoch. A job at 3.7 epochs that started its attempt 40 s ago is seen at 3.4
    (what it trained before it was stopped is not seen); queued, at 3; one running for longer
    than its part, at its true part; once it stops, its attempt is forgotten."""
    started = {"r": 60.0, "long": 0.0}
    seen = this_attempt(
        snapshot(
            [running("r", 3.7), active_job("q", epochs_done=3.7), running("long", 2.5)], now=100.0
        ),
        started,
    )
    assert seen.job("r").progress.epochs_done == pytest.approx(3.4)
    assert seen.job("q").progress.epochs_done == 3.0
    assert seen.job("long").progress.epochs_done == pytest.approx(2.5)
    this_attempt(snapshot([active_job("r", epochs_done=3.7)], now=200.0), started)
    assert "r" not in started


def test_jittered_arrivals_move_later_by_at_most_the_jitter_and_stay_in_order() -> None:
    workload = Workload(
        tuple(sim_job(str(i), [(32, 5, 10.0)], arrival=10.0 * i) for i in range(20))
    )
    assert jittered(workload, 0) is workload
    moved = jittered(workload, 3)
    assert moved == jittered(workload, 3), "the seed decides"
    by_id = {j.spec.job_id: j.spec.arrival_s for j in moved.jobs}
    assert all(0 <= by_id[str(i)] - 10.0 * i <= JITTER_S for i in range(20))
    assert any(by_id[str(i)] != 10.0 * i for i in range(20))
    arrivals = [j.spec.arrival_s for j in moved.jobs]
    assert arrivals == sorted(arrivals)


def test_bad_input_is_named_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert seconds_list("20,30.5") == [20.0, 30.5]
    for text, why in (("20,x", "not a comma-separated list"), ("0,-5", ">= 0"), ("nan", ">= 0")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            seconds_list(text)
    assert views_list("exact,whole,attempt") == ["exact", "whole", "attempt"]
    assert positive("8") == 8
    for text in ("0", "x", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive(text)
    with pytest.raises(argparse.ArgumentTypeError, match="'fractional': each must be one of"):
        views_list("exact,fractional")
    with pytest.raises(SystemExit) as exited:
        main(["--overheads", "20,x"])
    assert exited.value.code == 2
    assert "--overheads" in capsys.readouterr().err
    assert main(["--reference", str(tmp_path), "--overheads", "20", "--lags", "0"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_seeds_run_in_worker_processes(
    reference_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--workers 2``: each process reads and jitters the reference workload itself (a
    workload holds read-only mappings, which do not pickle), and the table has one row."""
    argv = ["--reference", str(reference_dir), "--policy", "fifo", "--overheads", "20"]
    assert main([*argv, "--lags", "0", "--seeds", "2", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "fifo: start cost and progress lag (simulate, 2 seeds" in out
    assert " ± " in out
