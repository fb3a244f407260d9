"""Jobs that differ from their declared figures (``--variation``): each job's own speed and
regime lengths, drawn per job from the seed, the declared profile untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shockwave.domain.model import AdaptationMode
from shockwave.workloads.variation import Variation, apply_variation, speed_factor, varied_lengths
from shockwave.workloads.workload import SimJob
from tests.builders import sim_job, workload

ACCORDION = AdaptationMode.ACCORDION


def jobs(count: int = 200) -> list[SimJob]:
    return [sim_job(f"j{i}", [(32, 30, 2.0), (128, 70, 1.0)], mode=ACCORDION) for i in range(count)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("throughput:0.3,trajectory:0.2", Variation(0.3, 0.2)),
        ("trajectory:0.5", Variation(0.0, 0.5)),
        (" Throughput:0 ", Variation()),
        ("none", Variation()),
        ("", Variation()),
    ],
)
def test_parse(text: str, expected: Variation) -> None:
    assert Variation.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("speed:0.3", "throughput:S"),
        ("throughput", "throughput:S"),
        ("throughput:x", "takes a number"),
        ("throughput:0.1,throughput:0.2", "twice"),
        ("throughput:-0.1", "throughput spread"),
        ("trajectory:nan", "trajectory spread"),
        ("trajectory:9", "trajectory spread"),
    ],
)
def test_parse_refuses_what_it_cannot_read_and_names_it(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Variation.parse(text)


def test_no_variation_is_the_workload_itself() -> None:
    given = workload(*jobs(3))
    assert apply_variation(given, Variation(), seed=5) is given


def test_each_job_runs_at_its_own_speed_and_declares_the_tables() -> None:
    given = workload(*jobs())
    varied = apply_variation(given, Variation(throughput=0.3), seed=1)

    factors = []
    for before, after in zip(given.jobs, varied.jobs, strict=True):
        assert after.spec == before.spec, "the declared profile stays the table's"
        assert after.trajectory == before.trajectory
        ratio = {bs: before.epoch_seconds[bs] / after.epoch_seconds[bs] for bs in (32, 128)}
        assert ratio[32] == pytest.approx(ratio[128]), "one factor at every batch size"
        factors.append(math.log(ratio[32]))
    # log-normal of spread 0.3: mean about 0, standard deviation about 0.3
    assert abs(float(np.mean(factors))) < 0.06
    assert float(np.std(factors)) == pytest.approx(0.3, abs=0.05)


def test_draws_are_per_job_and_seed_so_runs_compare_job_for_job() -> None:
    assert speed_factor("a", 0.3, seed=1) == speed_factor("a", 0.3, seed=1)
    assert speed_factor("a", 0.3, seed=1) != speed_factor("a", 0.3, seed=2)
    assert speed_factor("a", 0.3, seed=1) != speed_factor("b", 0.3, seed=1)
    alone = apply_variation(workload(*jobs(1)), Variation(0.3, 0.2), seed=4).jobs[0]
    among = apply_variation(workload(*jobs(5)), Variation(0.3, 0.2), seed=4).jobs[0]
    assert alone == among


def test_switch_points_move_and_the_regimes_keep_their_sizes_and_sum() -> None:
    varied = apply_variation(workload(*jobs()), Variation(trajectory=0.2), seed=0)

    firsts = []
    for job in varied.jobs:
        assert [r.batch_size for r in job.trajectory] == [32, 128]
        assert sum(r.epochs for r in job.trajectory) == 100
        assert all(r.epochs >= 1 for r in job.trajectory)
        firsts.append(job.trajectory[0].epochs)
    assert len(set(firsts)) > 5, "jobs switch at their own points"
    assert 22 < float(np.mean(firsts)) < 38, "around the given switch at 30"


@pytest.mark.parametrize("lengths", [(1, 1), (1, 99), (50, 1, 49), (3,), (10, 20, 30, 40)])
def test_varied_lengths_are_whole_epochs_of_at_least_one_summing_to_the_total(
    lengths: tuple[int, ...],
) -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        out = varied_lengths(lengths, 1.5, rng)
        assert len(out) == len(lengths)
        assert sum(out) == sum(lengths)
        assert min(out) >= 1
