"""bench/start_cost.py: the lagged view a policy decides on there."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from bench.start_cost import lagged, main, seconds_list, views_list
from shockwave.snapshot import ActiveJob
from tests.builders import active_job, snapshot


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


def test_bad_input_is_named_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert seconds_list("20,30.5") == [20.0, 30.5]
    for text, why in (("20,x", "not a comma-separated list"), ("0,-5", ">= 0"), ("nan", ">= 0")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            seconds_list(text)
    assert views_list("exact,whole") == ["exact", "whole"]
    with pytest.raises(argparse.ArgumentTypeError, match="'fractional': each must be one of"):
        views_list("exact,fractional")
    with pytest.raises(SystemExit) as exited:
        main(["--overheads", "20,x"])
    assert exited.value.code == 2
    assert "--overheads" in capsys.readouterr().err
    assert main(["--reference", str(tmp_path), "--overheads", "20", "--lags", "0"]) == 2
    assert "does not exist" in capsys.readouterr().err
