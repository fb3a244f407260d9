"""A job's window tables made for many jobs at once are the ones made one job at a time (the
definition, :func:`one_job_tables`)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from shockwave.domain.model import Cluster
from shockwave.domain.snapshot import ActiveJob
from shockwave.market.planner import PlanJob
from shockwave.policies.shockwave_market import shockwave as policy_module
from shockwave.policies.shockwave_market.shockwave import (
    JobOutlook,
    Shockwave,
    ShockwaveParams,
)
from shockwave.prediction.predictor import PredictedRegime, Prediction
from shockwave.simulation.simulator import simulate
from shockwave_cli.commands.inputs import load_throughputs, load_workload

N120 = "120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic"


def _bits(tables: policy_module._Tables) -> tuple[bytes, bytes, bytes]:
    utility, remaining, finish = tables
    return np.array(utility).tobytes(), np.array(remaining).tobytes(), finish.tobytes()


def _outlook(
    regimes: tuple[PredictedRegime, ...], remaining_s: float, factor: float = 1.0
) -> JobOutlook:
    epochs = sum(round(r.epochs) for r in regimes)
    prediction = Prediction(regimes=regimes, current=0, epochs_done=0.0, total_epochs=epochs)
    return JobOutlook(
        prediction=prediction,
        remaining_s=remaining_s,
        total_s=remaining_s,
        rho=1.0,
        error_factor=factor,
        deadline_s=0.0,
        fair_share_s=remaining_s,
        cautious_remaining_s=remaining_s,
        soonest_remaining_s=remaining_s,
        latest_remaining_s=remaining_s,
    )


def one_job_tables(
    look: JobOutlook,
    base: float,
    epochs: int,
    overhead: float,
    speed: float,
    window: int,
    length: float,
) -> policy_module._Tables:
    """One job's utility and remaining time after n = 0..cap rounds, and when it would finish,
    by the definition: progress interpolated along its regimes' cumulative seconds."""
    cap = min(window, max(1, math.ceil((look.remaining_s / speed + overhead) / length)))
    left_regimes = look.prediction.remaining_regimes()
    seconds = list(itertools.accumulate([0.0, *(r.epochs * r.epoch_seconds for r in left_regimes)]))
    gained = list(itertools.accumulate([0.0, *(r.epochs for r in left_regimes)]))
    n = np.arange(cap + 1, dtype=float)
    run = np.maximum(0.0, n * length - overhead) * speed
    utility = np.minimum(1.0, base + np.interp(run / look.error_factor, seconds, gained) / epochs)
    utility[0] = base
    remaining = np.maximum(0.0, look.remaining_s - run)
    remaining[0] = look.remaining_s
    finish = np.where(remaining <= 0, n * length, window * length + remaining)
    return tuple(utility.tolist()), tuple(remaining.tolist()), finish


# (regimes as (batch size, epochs, seconds per epoch), remaining s, error factor, base,
#  epochs, overhead s, speed)
CASES = [
    (((32, 10, 30.0), (64, 20, 20.0)), 700.0, 1.0, 0.0, 30, 20.0, 1.0),  # two regimes
    (((32, 10, 30.0),), 300.0, 1.0, 0.5, 20, 0.0, 1.0),  # running: no overhead
    (((32, 5, 7.0),), 35.0, 1.0, 0.0, 5, 20.0, 1.0),  # done inside one round (cap 1)
    (((32, 400, 90.0),), 36_000.0, 1.0, 0.0, 400, 20.0, 1.0),  # past the window (cap T)
    (((32, 3, 0.0), (64, 6, 40.0)), 240.0, 1.2, 0.1, 10, 20.0, 1.0),  # a regime of no time
    (((32, 50, 60.0),), 2_500.0, 0.8, 0.0, 50, 20.0, 1.7),  # error factor, speed-up
    ((), 0.0, 1.0, 1.0, 4, 20.0, 1.0),  # nothing left
]


def test_tables_of_many_jobs_are_bit_for_bit_those_of_each_job() -> None:
    window, length = 30, 120.0
    rows, looks = [], []
    for regimes, remaining, factor, base, epochs, overhead, speed in CASES:
        look = _outlook(tuple(PredictedRegime(b, e, s) for b, e, s in regimes), remaining, factor)
        key = (remaining, factor, base, epochs, overhead, speed, window, length)
        row = policy_module._TableRow(
            "j", 1, speed, overhead, epochs, base, False, window, length, key
        )
        rows.append(row)
        looks.append(look)
    many = policy_module._plan_tables_many(rows, looks)
    for row, look, made in zip(rows, looks, many, strict=True):
        alone = one_job_tables(look, row.base, row.epochs, row.overhead, row.speed, window, length)
        assert _bits(made) == _bits(alone)
        assert len(made[0]) == len(alone[0])
    assert policy_module._plan_tables_many([], []) == []


def test_a_plan_sees_every_job_as_the_job_alone_would(
    reference_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Along a real run (half the reference cluster: jobs wait, run, finish), every solve's
    jobs as :func:`_plan_jobs` made them are those :func:`_plan_job` makes one by one."""
    workload = load_workload(
        reference_dir / "traces" / f"{N120}.trace",
        reference_dir / "trajectories" / f"{N120}.tacc.trajectories.json",
        load_throughputs(reference_dir / "throughputs" / "tacc_throughputs.json"),
    )
    real = policy_module._plan_jobs
    checked = [0]

    def both(
        jobs: list[ActiveJob],
        looks: list[JobOutlook],
        params: ShockwaveParams,
        window: int,
        length: float,
    ) -> list[PlanJob]:
        planned = real(jobs, looks, params, window, length)
        alone = [
            policy_module._plan_job(job, look, params, window, length)
            for job, look in zip(jobs, looks, strict=True)
        ]
        assert planned == alone
        checked[0] += len(planned)
        return planned

    monkeypatch.setattr(policy_module, "_plan_jobs", both)
    simulate(workload, Cluster.of_gpus(16, 4), Shockwave(), ShockwaveParams())
    assert checked[0] > 1_000
