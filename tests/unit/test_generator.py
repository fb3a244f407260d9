"""Synthetic workloads: the paper's mix, the mode rules, determinism by seed, round trips."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shockwave.domain.model import VALID_WIDTHS, AdaptationMode, ValidationError
from shockwave.workloads.generator import (
    MODE_MIX,
    SIZE_CLASSES,
    WIDTH_MIX,
    generate_workload,
    size_class_of,
)
from shockwave.workloads.traces import (
    ThroughputTable,
    build_workload,
    format_trace,
    format_trajectories,
    parse_throughputs,
    parse_trace,
    parse_trajectories,
)
from shockwave.workloads.workload import SimJob, Workload


def literal_table() -> ThroughputTable:
    """Three models: ResNet-18 and LM on every width, Recommendation on one GPU only."""
    ladders = {"ResNet-18": (16, 32, 64, 128, 256), "LM": (5, 10, 20, 40, 80)}
    rates: dict[tuple[str, int, int], float] = {}
    for model, ladder in ladders.items():
        for width in VALID_WIDTHS:
            for rung, bs in enumerate(ladder):
                rates[(model, bs, width)] = 40.0 * width / (1.6**rung)
    for rung, bs in enumerate((512, 1024, 2048, 4096, 8192)):
        rates[("Recommendation", bs, 1)] = 150.0 / (1.7**rung)
    return ThroughputTable(rates)


TABLE = literal_table()
MODELS = ("ResNet-18", "LM", "Recommendation")


def generate(num_jobs: int, seed: int = 7, **options: Any) -> Workload:
    return generate_workload(num_jobs, seed=seed, throughputs=TABLE, models=MODELS, **options)


@pytest.fixture(scope="module")
def big() -> Workload:
    return generate(2000, seed=11)


def target_gpu_hours(job: SimJob) -> float:
    """The drawn size: the trace's duration field (target exclusive seconds) times the width."""
    return float(job.trace_fields["duration_s"]) * job.spec.gpus / 3600


# ------------------------------------------------------------------------------- determinism


def test_same_seed_gives_the_same_workload_and_text() -> None:
    first, second = generate(150, seed=3), generate(150, seed=3)

    assert first == second
    assert format_trace(first) == format_trace(second)
    assert generate(150, seed=4) != first


def test_generator_and_int_seed_agree() -> None:
    by_int = generate(40, seed=5)
    by_generator = generate_workload(
        40, seed=np.random.default_rng(5), throughputs=TABLE, models=MODELS, name=by_int.name
    )

    assert by_generator == by_int


def test_first_jobs_do_not_depend_on_how_many_follow() -> None:
    assert generate(60, seed=9).jobs[:25] == generate(25, seed=9).jobs


# --------------------------------------------------------------------------------------- mix


@pytest.mark.parametrize("size_class", SIZE_CLASSES, ids=lambda c: c.name)
def test_size_classes_occur_at_their_probability(big: Workload, size_class: Any) -> None:
    counts = Counter(size_class_of(target_gpu_hours(job)) for job in big.jobs)

    assert counts[size_class.name] / len(big.jobs) == pytest.approx(
        size_class.probability, abs=0.03
    )


@pytest.mark.parametrize(("width", "share"), sorted(WIDTH_MIX.items()))
def test_widths_occur_at_their_share(big: Workload, width: int, share: float) -> None:
    counts = Counter(job.spec.gpus for job in big.jobs)

    assert counts[width] / len(big.jobs) == pytest.approx(share, abs=0.03)
    assert set(counts) <= set(VALID_WIDTHS)


@pytest.mark.parametrize(("mode", "share"), sorted(MODE_MIX.items()))
def test_modes_occur_at_their_share(big: Workload, mode: AdaptationMode, share: float) -> None:
    counts = Counter(job.spec.mode for job in big.jobs)

    assert counts[mode] / len(big.jobs) == pytest.approx(share, abs=0.03)


def test_arrivals_are_poisson_from_zero_in_whole_seconds(big: Workload) -> None:
    arrivals = np.array([job.spec.arrival_s for job in big.jobs])

    assert arrivals[0] == 0
    assert np.all(np.diff(arrivals) >= 0)
    assert np.all(arrivals == np.round(arrivals))
    assert np.diff(arrivals).mean() == pytest.approx(100.0, rel=0.1)
    assert generate(300, mean_interarrival_s=10.0).jobs[-1].spec.arrival_s < 4000


def test_jobs_use_only_configurations_the_table_knows(big: Workload) -> None:
    for job in big.jobs:
        spec = job.spec
        assert spec.batch_sizes == TABLE.batch_sizes(spec.model, spec.gpus)
        assert spec.initial_batch_size in spec.batch_sizes
        for bs, seconds in job.epoch_seconds.items():
            expected = TABLE.epoch_seconds(spec.model, bs, spec.gpus, spec.samples_per_epoch)
            assert seconds == expected
    assert {job.spec.gpus for job in big.jobs if job.spec.model == "Recommendation"} == {1}


def test_exclusive_time_matches_the_drawn_size_within_an_epoch_per_regime(big: Workload) -> None:
    for job in big.jobs:
        target_s = float(job.trace_fields["duration_s"])
        slack = len(job.trajectory) * max(job.epoch_seconds.values()) + 0.5
        assert abs(job.t_exclusive_s - target_s) <= slack


# -------------------------------------------------------------------------------- mode rules


def only(mode: AdaptationMode) -> dict[AdaptationMode, float]:
    return {m: float(m is mode) for m in MODE_MIX}


@pytest.mark.parametrize("mode", list(MODE_MIX), ids=str)
def test_trajectories_start_at_initial_size_and_sum_to_epochs(mode: AdaptationMode) -> None:
    for job in generate(300, mode_mix=only(mode)).jobs:
        assert job.spec.mode is mode
        assert job.trajectory[0].batch_size == job.spec.initial_batch_size
        assert sum(r.epochs for r in job.trajectory) == job.spec.epochs


def test_static_jobs_keep_one_batch_size() -> None:
    workload = generate(200, mode_mix=only(AdaptationMode.STATIC))

    assert {len(job.trajectory) for job in workload.jobs} == {1}


def test_accordion_alternates_between_initial_and_largest_size() -> None:
    shapes: Counter[int] = Counter()
    for job in generate(300, mode_mix=only(AdaptationMode.ACCORDION)).jobs:
        sizes = [r.batch_size for r in job.trajectory]
        initial, largest = job.spec.initial_batch_size, job.spec.max_batch_size
        expected = [initial, largest, initial, largest][: len(sizes)]
        assert sizes == ([initial] if initial == largest else expected)
        if len(sizes) > 1 and job.spec.epochs >= 100:
            assert 0.08 <= job.trajectory[0].epochs / job.spec.epochs <= 0.32
        shapes[len(sizes)] += 1
    assert shapes[2] > 50 and shapes[4] > 50


def test_gns_climbs_the_ladder_to_the_largest_size_and_never_goes_down() -> None:
    for job in generate(300, mode_mix=only(AdaptationMode.GNS)).jobs:
        sizes = [r.batch_size for r in job.trajectory]
        ladder = [bs for bs in job.spec.batch_sizes if bs >= job.spec.initial_batch_size]
        assert sizes == ladder[: len(sizes)]
        if job.spec.epochs >= 2 * len(ladder):
            assert sizes == ladder


# ---------------------------------------------------------------------------------- round trip


def test_written_workload_reads_back_equal() -> None:
    workload = generate(200, seed=21)

    back = build_workload(
        parse_trace(format_trace(workload), "synthetic.trace"),
        parse_trajectories(json.loads(json.dumps(format_trajectories(workload))), "synthetic.json"),
        TABLE,
        workload.name,
    )

    assert back == workload


@pytest.mark.parametrize("kind", ["tacc", "wisr"])
def test_reference_tables_generate_the_paper_models(reference_dir: Path, kind: str) -> None:
    path = reference_dir / "throughputs" / f"{kind}_throughputs.json"
    table = parse_throughputs(json.loads(path.read_text()), path.name)

    workload = generate_workload(400, seed=1, throughputs=table)

    assert {job.spec.model for job in workload.jobs} == {
        "ResNet-18", "ResNet-50", "Transformer", "LM", "Recommendation",
    }  # fmt: skip
    assert parse_trace(format_trace(workload), "x") == parse_trace(format_trace(workload), "y")


# ------------------------------------------------------------------------------- bad options


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mode_mix": {AdaptationMode.ACCORDION: 0.5, AdaptationMode.GNS: 0.4}}, "mode_mix"),
        ({"mode_mix": {AdaptationMode.CUSTOM: 1.0}}, "mode_mix"),
        ({"width_mix": {1: 1.5, 2: -0.5}}, "width_mix"),
        ({"width_mix": {3: 1.0}}, "width_mix"),
        ({"width_mix": {8: 1.0}, "models": ("Recommendation",)}, "width_mix"),
        ({"models": ("A3C",)}, "models"),
        ({"mean_interarrival_s": -1.0}, "mean_interarrival_s"),
    ],
)
def test_impossible_options_are_rejected(options: dict[str, Any], field: str) -> None:
    options = {"models": MODELS, **options}

    with pytest.raises(ValidationError) as caught:
        generate_workload(10, seed=1, throughputs=TABLE, **options)

    assert caught.value.field == field
