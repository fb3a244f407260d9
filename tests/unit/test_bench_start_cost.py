"""bench/start_cost.py: the lagged view a policy decides on there."""

from __future__ import annotations

import dataclasses

import pytest

from bench.start_cost import lagged
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
