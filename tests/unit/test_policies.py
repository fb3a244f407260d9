"""The baseline policies' allocators on literal inputs, and the contract every policy keeps."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.policies.fifo import Fifo, FifoParams
from shockwave.policies.gavel_family.allox import Allox, AlloxParams
from shockwave.policies.gavel_family.gandiva_fair import GandivaFair, GandivaFairParams
from shockwave.policies.gavel_family.gavel import MaxMinFairness, MaxMinFairnessParams, water_fill
from shockwave.policies.gavel_family.mst import MaxSumThroughput, MaxSumThroughputParams
from shockwave.policies.gavel_family.ossp import Ossp, OsspParams, min_common_deadline
from shockwave.policies.gavel_family.themis import Themis, ThemisParams, min_max_ftf_shares
from shockwave.policies.gavel_family.time_fraction import AllocationJob
from shockwave.policies.policy import (
    Decision,
    UnknownPolicyError,
    get_policy,
    make_params,
    policy_names,
)
from tests.builders import active_job, snapshot

# (job_id, gpus, steps per second, remaining seconds, age in seconds)
JobRow = tuple[str, int, float, float, float]


def alloc_job(
    job_id: str,
    gpus: int = 1,
    steps_per_second: float = 1.0,
    remaining_s: float = 100.0,
    age: float = 0.0,
    weight: float = 1.0,
) -> AllocationJob:
    return AllocationJob(
        job_id=job_id,
        gpus=gpus,
        steps_per_second=steps_per_second,
        remaining_steps=remaining_s * steps_per_second,
        age_s=age,
        weight=weight,
    )


def alloc_jobs(rows: Sequence[JobRow]) -> list[AllocationJob]:
    return [alloc_job(i, g, sps, rem, age) for i, g, sps, rem, age in rows]


def widths(jobs: Sequence[AllocationJob]) -> dict[str, int]:
    return {j.job_id: j.gpus for j in jobs}


def gpu_share(shares: Mapping[str, float], jobs: Sequence[AllocationJob]) -> float:
    return sum(j.gpus * shares[j.job_id] for j in jobs)


def assert_shares(got: Mapping[str, float], expected: Mapping[str, float]) -> None:
    assert set(got) == set(expected)
    for job_id, share in expected.items():
        assert got[job_id] == pytest.approx(share, rel=1e-6, abs=1e-9), job_id


# --- water_fill -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demands", "weights", "capacity", "expected"),
    [
        pytest.param({"a": 4, "b": 4}, {}, 4, {"a": 2, "b": 2}, id="equal-split"),
        pytest.param(
            {"a": 1, "b": 4, "c": 4}, {}, 6, {"a": 1, "b": 2.5, "c": 2.5}, id="capped-redistributes"
        ),
        pytest.param(
            {"a": 1, "b": 2, "c": 8}, {}, 9, {"a": 1, "b": 2, "c": 6}, id="two-capped-rounds"
        ),
        pytest.param({"a": 10, "b": 10}, {"a": 3, "b": 1}, 4, {"a": 3, "b": 1}, id="weights"),
        pytest.param(
            {"a": 1, "b": 10}, {"a": 3, "b": 1}, 4, {"a": 1, "b": 3}, id="weighted-capped"
        ),
        pytest.param({"a": 1, "b": 2}, {}, 10, {"a": 1, "b": 2}, id="capacity-above-demand"),
        pytest.param({"a": 0, "b": 2}, {}, 1, {"a": 0, "b": 1}, id="zero-demand"),
        pytest.param({"a": 3, "b": 1}, {}, 0, {"a": 0, "b": 0}, id="zero-capacity"),
        pytest.param({}, {}, 4, {}, id="no-jobs"),
    ],
)
def test_water_fill(
    demands: dict[str, float],
    weights: dict[str, float],
    capacity: float,
    expected: dict[str, float],
) -> None:
    full_weights = {k: weights.get(k, 1.0) for k in demands}
    assert_shares(water_fill(demands, full_weights, capacity), expected)


@given(
    st.lists(st.floats(0.0, 8.0), min_size=1, max_size=8),
    st.lists(st.floats(0.1, 5.0), min_size=8, max_size=8),
    st.floats(0.0, 40.0),
)
def test_water_fill_uses_the_capacity_within_demands(
    demand_list: list[float], weight_list: list[float], capacity: float
) -> None:
    demands = {f"j{i}": d for i, d in enumerate(demand_list)}
    weights = {f"j{i}": weight_list[i] for i in range(len(demand_list))}
    shares = water_fill(demands, weights, capacity)
    assert all(-1e-9 <= shares[k] <= demands[k] + 1e-9 for k in demands)
    assert sum(shares.values()) == pytest.approx(min(capacity, sum(demand_list)), abs=1e-6)
    level = {k: shares[k] / weights[k] for k in demands if shares[k] < demands[k] - 1e-6}
    if level:
        # Every job below its demand sits at one common weighted level, the highest of all.
        assert max(level.values()) == pytest.approx(min(level.values()), rel=1e-6)
        top = max(level.values())
        assert all(shares[k] / weights[k] <= top * (1 + 1e-6) + 1e-9 for k in demands)


# --- gavel: max-min fairness ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_gpus", "job_widths", "budgets", "expected"),
    [
        pytest.param(4, (1, 1, 2, 4), (), {"j0": 1, "j1": 1, "j2": 0.5, "j3": 0.25}, id="n=m"),
        pytest.param(
            4,
            (1, 2, 4, 1, 2, 4, 1, 8),
            (),
            {f"j{i}": 4 / (8 * w) for i, w in enumerate((1, 2, 4, 1, 2, 4, 1, 8))},
            id="n>m-equal-gpu-share",
        ),
        pytest.param(8, (1, 1, 1), (), {"j0": 1, "j1": 1, "j2": 1}, id="fewer-jobs-than-gpus"),
        pytest.param(8, (1, 2, 4), (), {"j0": 1, "j1": 1, "j2": 1}, id="all-demands-fit"),
        pytest.param(4, (1, 4), (), {"j0": 1, "j1": 0.75}, id="narrow-capped-wide-gets-rest"),
        pytest.param(4, (4, 4), (), {"j0": 0.5, "j1": 0.5}, id="two-wide"),
        pytest.param(2, (1, 1, 1), (2, 1, 1), {"j0": 1, "j1": 0.5, "j2": 0.5}, id="budget"),
    ],
)
def test_gavel_gives_an_equal_weighted_gpu_share(
    total_gpus: int,
    job_widths: tuple[int, ...],
    budgets: tuple[float, ...],
    expected: dict[str, float],
) -> None:
    jobs = [
        alloc_job(f"j{i}", w, weight=budgets[i] if budgets else 1.0)
        for i, w in enumerate(job_widths)
    ]
    shares, _ = MaxMinFairness().allocate(jobs, total_gpus, {}, {}, MaxMinFairnessParams())
    assert_shares(shares, expected)
    assert gpu_share(shares, jobs) <= total_gpus + 1e-9


# --- mst: max-sum-throughput ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_gpus", "rows", "expected"),
    [
        pytest.param(
            4,
            [("a", 1, 10.0, 1, 0), ("b", 2, 30.0, 1, 0), ("c", 4, 8.0, 1, 0)],
            {"a": 1, "b": 1, "c": 0.25},
            id="by-rate-per-gpu",
        ),
        pytest.param(
            2,
            [("slow", 1, 1.0, 1, 0), ("fast", 1, 100.0, 1, 0), ("mid", 1, 5.0, 1, 0)],
            {"slow": 0, "fast": 1, "mid": 1},
            id="slowest-starves",
        ),
        pytest.param(
            8, [("a", 1, 1.0, 1, 0), ("b", 2, 1.0, 1, 0)], {"a": 1, "b": 1}, id="under-capacity"
        ),
        pytest.param(
            1, [("a", 1, 5.0, 1, 0), ("b", 1, 5.0, 1, 0)], {"a": 1, "b": 0}, id="tie-arrival-order"
        ),
        pytest.param(
            8,
            [("wide", 8, 80.0, 1, 0), ("one", 1, 20.0, 1, 0)],
            {"wide": 0.875, "one": 1},
            id="per-gpu-not-per-gang",
        ),
    ],
)
def test_mst_fills_gpus_by_steps_per_gpu(
    total_gpus: int, rows: list[JobRow], expected: dict[str, float]
) -> None:
    jobs = alloc_jobs(rows)
    shares, _ = MaxSumThroughput().allocate(jobs, total_gpus, {}, {}, MaxSumThroughputParams())
    assert_shares(shares, expected)


@given(
    st.lists(
        st.tuples(st.sampled_from((1, 2, 4, 8)), st.floats(0.01, 200.0)), min_size=1, max_size=12
    ),
    st.integers(1, 32),
)
def test_mst_uses_min_of_cluster_and_demand(
    shape: list[tuple[int, float]], total_gpus: int
) -> None:
    jobs = [alloc_job(f"j{i}", w, sps) for i, (w, sps) in enumerate(shape)]
    shares, _ = MaxSumThroughput().allocate(jobs, total_gpus, {}, {}, MaxSumThroughputParams())
    assert all(0.0 <= x <= 1.0 for x in shares.values())
    expected_total = min(total_gpus, sum(j.gpus for j in jobs))
    assert gpu_share(shares, jobs) == pytest.approx(expected_total, abs=1e-9)


# --- themis: finish-time fairness -------------------------------------------------------------


def ftf(job: AllocationJob, share: float, denominator: float) -> float:
    return (job.age_s + job.remaining_seconds / share) / denominator


GOLDEN = (math.sqrt(5) - 1) / 2

THEMIS_CASES: list[tuple[str, int, list[JobRow], dict[str, float], dict[str, float], float]] = [
    # (id, total GPUs, rows, denominators D_j, expected shares, expected worst rho)
    (
        "symmetric",
        1,
        [("a", 1, 1.0, 100, 0), ("b", 1, 1.0, 100, 0)],
        {"a": 200, "b": 200},
        {"a": 0.5, "b": 0.5},
        1.0,
    ),
    (
        "symmetric-three-rates-differ",
        1,
        [("a", 1, 2.0, 100, 0), ("b", 1, 1.0, 100, 0), ("c", 1, 0.5, 100, 0)],
        {"a": 300, "b": 300, "c": 300},
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
        1.0,
    ),
    (
        # Capacity does not bind: the worst job gets x = 1, the other only what keeps it at rho.
        "capacity-slack",
        4,
        [("a", 1, 1.0, 100, 50), ("b", 1, 1.0, 100, 0)],
        {"a": 100, "b": 100},
        {"a": 1, "b": 2 / 3},
        1.5,
    ),
    (
        # 100 + 100/x = 100/(1-x): x = (sqrt 5 - 1)/2, rho = (3 + sqrt 5)/4.
        "older-job-gets-more-golden-ratio",
        1,
        [("a", 1, 1.0, 100, 100), ("b", 1, 1.0, 100, 0)],
        {"a": 200, "b": 200},
        {"a": GOLDEN, "b": 1 - GOLDEN},
        (3 + math.sqrt(5)) / 4,
    ),
    (
        "widths-binding",
        2,
        [("a", 2, 1.0, 100, 0), ("b", 1, 1.0, 100, 0)],
        {"a": 100, "b": 100},
        {"a": 2 / 3, "b": 2 / 3},
        1.5,
    ),
    (
        "longer-job-gets-more",
        1,
        [("a", 1, 1.0, 100, 0), ("b", 1, 1.0, 300, 0)],
        {"a": 200, "b": 200},
        {"a": 0.25, "b": 0.75},
        2.0,
    ),
]


@pytest.mark.parametrize(
    ("total_gpus", "rows", "denominators", "shares", "rho"),
    [pytest.param(*case[1:], id=case[0]) for case in THEMIS_CASES],
)
def test_themis_min_max_ftf_known_optimum(
    total_gpus: int,
    rows: list[JobRow],
    denominators: dict[str, float],
    shares: dict[str, float],
    rho: float,
) -> None:
    jobs = alloc_jobs(rows)
    got, worst = min_max_ftf_shares(jobs, total_gpus, denominators, 1e-9)
    assert worst == pytest.approx(rho, rel=1e-6)
    assert_shares(got, shares)
    assert gpu_share(got, jobs) <= total_gpus * (1 + 1e-9)
    assert max(ftf(j, got[j.job_id], denominators[j.job_id]) for j in jobs) <= worst * (1 + 1e-9)


@pytest.mark.parametrize(
    ("total_gpus", "rows", "denominators"),
    [pytest.param(*case[1:4], id=case[0]) for case in THEMIS_CASES if len(case[2]) == 2]
    + [
        pytest.param(
            3,
            [("a", 2, 3.0, 400, 700), ("b", 4, 1.0, 90, 10)],
            {"a": 900, "b": 150},
            id="uneven-widths-and-ages",
        ),
        pytest.param(
            1,
            [("a", 1, 1.0, 50, 300), ("b", 1, 7.0, 500, 0)],
            {"a": 120, "b": 800},
            id="late-job-already-unfair",
        ),
    ],
)
def test_themis_no_feasible_two_job_allocation_beats_it(
    total_gpus: int, rows: list[JobRow], denominators: dict[str, float]
) -> None:
    """Grid search over x_a (x_b takes the GPUs left) finds nothing better, and about as good."""
    a, b = jobs = alloc_jobs(rows)
    got, worst = min_max_ftf_shares(jobs, total_gpus, denominators, 1e-9)
    best_on_grid = math.inf
    for x_a in np.linspace(1e-3, 1.0, 20_000):
        x_b = min(1.0, (total_gpus - a.gpus * x_a) / b.gpus)
        if x_b <= 0:
            continue
        rho = max(ftf(a, x_a, denominators["a"]), ftf(b, x_b, denominators["b"]))
        best_on_grid = min(best_on_grid, rho)
    assert best_on_grid >= worst * (1 - 1e-6)
    assert best_on_grid <= worst * (1 + 1e-3)
    assert gpu_share(got, jobs) <= total_gpus * (1 + 1e-9)


def test_themis_credit_accumulates_across_recomputes() -> None:
    policy, params = Themis(), ThemisParams()
    first = [alloc_job("a", remaining_s=100), alloc_job("b", remaining_s=100)]
    shares, memory = policy.allocate(first, 1, {}, {}, params)
    assert_shares(shares, {"a": 0.5, "b": 0.5})
    assert dict(memory["credit"]) == {"a": 0.0, "b": 0.0}

    # a made 60 steps of progress at an isolated rate of 0.5 step/s: 120 s of credit.
    second = [alloc_job("a", remaining_s=40), alloc_job("b", remaining_s=100)]
    shares, memory = policy.allocate(second, 1, shares, memory, params)
    assert dict(memory["credit"]) == pytest.approx({"a": 120.0, "b": 0.0})
    # D_a = 120 + 40/0.5 = 200 = D_b, so x_a/x_b = 40/100.
    assert_shares(shares, {"a": 2 / 7, "b": 5 / 7})

    third = [alloc_job("a", remaining_s=10), alloc_job("b", remaining_s=100)]
    _, memory = policy.allocate(third, 1, shares, memory, params)
    assert dict(memory["credit"]) == pytest.approx({"a": 180.0, "b": 0.0})


def test_themis_credit_uses_the_isolated_rate_of_the_previous_recompute() -> None:
    policy, params = Themis(), ThemisParams()
    _, memory = policy.allocate([alloc_job("a"), alloc_job("b")], 1, {}, {}, params)
    # b left; a, now alone, ran at 0.5 step/s isolated at the last recompute.
    _, memory = policy.allocate([alloc_job("a", remaining_s=50)], 1, {}, memory, params)
    assert dict(memory["credit"]) == pytest.approx({"a": 100.0})
    assert dict(memory["isolated_rate"]) == pytest.approx({"a": 1.0})


@pytest.mark.parametrize(
    ("total_gpus", "rows", "isolated"),
    [
        pytest.param(
            2,
            [("a", 2, 4.0, 100, 0), ("b", 1, 1.0, 100, 0), ("c", 1, 3.0, 100, 0)],
            {"a": 4 / 3, "b": 2 / 3, "c": 2.0},
            id="contended-m-sf-above-m",
        ),
        pytest.param(
            8,
            [("a", 4, 4.0, 100, 0), ("b", 1, 1.0, 100, 0)],
            {"a": 4.0, "b": 1.0},
            id="uncontended-full-rate",
        ),
    ],
)
def test_themis_isolated_rate_is_an_equal_gpu_share(
    total_gpus: int, rows: list[JobRow], isolated: dict[str, float]
) -> None:
    _, memory = Themis().allocate(alloc_jobs(rows), total_gpus, {}, {}, ThemisParams())
    assert dict(memory["isolated_rate"]) == pytest.approx(isolated)


# --- allox ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_gpus", "rows", "previous", "expected"),
    [
        pytest.param(
            1,
            [("a", 1, 1.0, 1000, 0), ("b", 1, 1.0, 1, 100)],
            {"a": 1.0},
            {"a": 1, "b": 0},
            id="pinned-one-gpu-job-stays",
        ),
        pytest.param(
            2,
            [("a", 1, 1.0, 1000, 0), ("b", 1, 1.0, 50, 10), ("c", 1, 1.0, 5, 20)],
            {"a": 1.0},
            {"a": 1, "b": 0, "c": 1},
            id="pinned-plus-one-free-worker",
        ),
        pytest.param(
            1,
            [("j0", 1, 1.0, 50, 100), ("j1", 1, 1.0, 20, 90)]
            + [(f"k{i}", 1, 1.0, 1, 80 - i) for i in range(8)],
            {},
            {"j0": 0, "j1": 1} | {f"k{i}": 0 for i in range(8)},
            id="shortest-of-the-oldest-fifth",
        ),
        pytest.param(
            4,
            [
                ("a", 2, 1.0, 10, 10),
                ("b", 4, 1.0, 20, 10),
                ("c", 1, 1.0, 30, 10),
                ("d", 1, 1.0, 40, 10),
                ("e", 1, 1.0, 5, 0),
            ],
            {},
            {"a": 0.5, "b": 0.25, "c": 1, "d": 1, "e": 0},
            id="one-over-scale-factor",
        ),
        pytest.param(
            1,
            [("a", 2, 1.0, 1000, 0), ("b", 1, 1.0, 10, 50)],
            {"a": 0.5},
            {"a": 0.5, "b": 1},
            id="earlier-share-carries-forward",
        ),
        pytest.param(
            1,
            [("j0", 1, 4.0, 100, 100), ("j1", 1, 1.0, 200, 90)]
            + [(f"k{i}", 1, 1.0, 1, 80 - i) for i in range(8)],
            {},
            {"j0": 1, "j1": 0} | {f"k{i}": 0 for i in range(8)},
            id="shortest-in-seconds-not-steps",
        ),
    ],
)
def test_allox_runs_the_shortest_of_the_oldest(
    total_gpus: int, rows: list[JobRow], previous: dict[str, float], expected: dict[str, float]
) -> None:
    shares, _ = Allox().allocate(alloc_jobs(rows), total_gpus, previous, {}, AlloxParams())
    assert_shares(shares, expected)


# --- gandiva_fair -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_gpus", "job_widths", "share"),
    [
        pytest.param(4, (1, 1), 1.0, id="fewer-jobs-than-gpus"),
        pytest.param(4, (1, 2, 4, 8, 1, 1, 2, 4), 0.5, id="more-jobs-than-gpus"),
        pytest.param(3, (8, 8, 8, 8), 0.75, id="oversubscribes-regardless-of-width"),
        pytest.param(2, (), 0.0, id="no-jobs"),
    ],
)
def test_gandiva_fair_gives_an_equal_time_share(
    total_gpus: int, job_widths: tuple[int, ...], share: float
) -> None:
    jobs = [alloc_job(f"j{i}", w) for i, w in enumerate(job_widths)]
    shares, _ = GandivaFair().allocate(jobs, total_gpus, {}, {}, GandivaFairParams())
    assert_shares(shares, {j.job_id: share for j in jobs})


# --- ossp -------------------------------------------------------------------------------------

OSSP_CASES = [
    # (total GPUs, rows); rows' remaining seconds set the closed form
    pytest.param(4, [("a", 1, 2.0, 50, 0)], id="one-job-own-length"),
    pytest.param(
        1, [("a", 1, 1.0, 10, 0), ("b", 1, 3.0, 20, 0), ("c", 1, 0.5, 30, 0)], id="capacity-binds"
    ),
    pytest.param(4, [("a", 4, 1.0, 100, 0), ("b", 1, 1.0, 200, 0)], id="longest-job-binds"),
    pytest.param(
        4,
        [("a", 2, 2.0, 300, 0), ("b", 4, 10.0, 200, 0), ("c", 1, 0.1, 100, 0)],
        id="wide-jobs-make-capacity-bind",
    ),
    pytest.param(
        32,
        [(f"j{i}", (1, 2, 4, 8)[i % 4], 1.0 + i, 500.0 + 137 * i, 0) for i in range(20)],
        id="twenty-jobs",
    ),
]


def closed_form_deadline(jobs: Sequence[AllocationJob], total_gpus: int) -> float:
    longest = max(j.remaining_seconds for j in jobs)
    gpu_seconds = sum(j.gpus * j.remaining_seconds for j in jobs)
    return max(longest, gpu_seconds / total_gpus)


@pytest.mark.parametrize(("total_gpus", "rows"), OSSP_CASES)
def test_ossp_lp_finds_the_closed_form_deadline(total_gpus: int, rows: list[JobRow]) -> None:
    jobs = alloc_jobs(rows)
    got = min_common_deadline(jobs, total_gpus)
    assert got == pytest.approx(closed_form_deadline(jobs, total_gpus), rel=1e-6)


@pytest.mark.parametrize("slack", [0.0, 0.025])
@pytest.mark.parametrize(("total_gpus", "rows"), OSSP_CASES)
def test_ossp_allocation_meets_the_deadline_and_capacity(
    total_gpus: int, rows: list[JobRow], slack: float
) -> None:
    jobs = alloc_jobs(rows)
    deadline = closed_form_deadline(jobs, total_gpus) * (1 + slack)
    shares, _ = Ossp().allocate(jobs, total_gpus, {}, {}, OsspParams(deadline_slack=slack))
    for job in jobs:
        assert shares[job.job_id] >= job.remaining_seconds / deadline * (1 - 1e-6), job.job_id
        assert shares[job.job_id] <= 1 + 1e-9
    assert gpu_share(shares, jobs) <= total_gpus + 1e-9
    assert gpu_share(shares, jobs) == pytest.approx(
        min(total_gpus, sum(j.gpus for j in jobs)), rel=1e-6
    )


# --- fifo -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_widths", "backfill", "expected"),
    [
        pytest.param((1, 4, 1), False, ("j0",), id="wide-head-blocks"),
        pytest.param((1, 4, 1), True, ("j0", "j2"), id="backfill-runs-narrow"),
        pytest.param((2, 2, 1), False, ("j0", "j1"), id="fits-in-order"),
        pytest.param((1, 1, 1, 1, 1), False, ("j0", "j1", "j2", "j3"), id="full"),
        pytest.param((4, 1), True, ("j0",), id="head-fills-cluster"),
    ],
)
def test_fifo_runs_in_arrival_order(
    job_widths: tuple[int, ...], backfill: bool, expected: tuple[str, ...]
) -> None:
    jobs = [active_job(f"j{i}", gpus=w, arrival=float(i)) for i, w in enumerate(job_widths)]
    decision = Fifo().decide(snapshot(jobs, gpus=4), FifoParams(backfill=backfill))
    assert decision.jobs == expected
    assert set(decision.reasons) == {j.job_id for j in jobs} - set(expected)


def test_fifo_orders_by_arrival_time_not_list_position() -> None:
    jobs = [active_job("late", arrival=50.0), active_job("early", arrival=10.0)]
    decision = Fifo().decide(snapshot(jobs, gpus=1), FifoParams())
    assert decision.jobs == ("early",)


# --- every registered policy ------------------------------------------------------------------


def random_jobs(seed: int, count: int, total_gpus: int) -> list[ActiveJob]:
    rng = np.random.default_rng(seed)
    allowed = [w for w in (1, 2, 4, 8) if w <= total_gpus]
    jobs = []
    for i in range(count):
        epochs = int(rng.integers(1, 40))
        jobs.append(
            active_job(
                f"j{i:02d}",
                gpus=int(rng.choice(allowed)),
                steps_per_second=float(rng.uniform(0.2, 50.0)),
                epochs=epochs,
                epochs_done=float(rng.uniform(0, epochs - 0.5)),
                arrival=float(rng.uniform(0, 500)) if i else 0.0,
                executed_last_round=float(rng.choice([0.0, 120.0, 45.0])),
                budget=float(rng.choice([1.0, 1.0, 2.0])),
            )
        )
    return sorted(jobs, key=lambda j: j.spec.arrival_s)


def assert_valid_decision(decision: Decision, snap: Snapshot) -> None:
    active = {j.job_id: j.spec.gpus for j in snap.jobs}
    assert len(decision.jobs) == len(set(decision.jobs)), "a job chosen twice"
    assert set(decision.jobs) <= set(active), "a chosen job is not active"
    assert sum(active[j] for j in decision.jobs) <= snap.cluster.total_gpus
    assert set(decision.reasons) <= set(active) - set(decision.jobs)
    assert all(0.0 <= x <= 1.0 + 1e-9 for x in decision.allocation.values())
    assert decision.rounds[0] == decision.jobs
    for column in decision.planned:
        assert set(column) <= set(active), "a planned job is not active"
        assert sum(active[j] for j in column) <= snap.cluster.total_gpus


SNAPSHOT_SHAPES = [
    pytest.param(1, 12, 16, 8, id="12-jobs-16-gpus"),
    pytest.param(2, 40, 32, 8, id="40-jobs-32-gpus"),
    pytest.param(3, 3, 8, 4, id="3-jobs-8-gpus"),
    pytest.param(4, 9, 4, 4, id="9-jobs-4-gpus"),
    pytest.param(5, 0, 4, 4, id="no-jobs"),
]


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize(("seed", "count", "total_gpus", "per_node"), SNAPSHOT_SHAPES)
def test_every_policy_decides_validly_and_deterministically(
    name: str, seed: int, count: int, total_gpus: int, per_node: int
) -> None:
    policy = get_policy(name)
    params = make_params(policy)
    snap = snapshot(
        random_jobs(seed, count, total_gpus), gpus=total_gpus, per_node=per_node, now=600.0
    )
    first = policy.decide(snap, params)
    assert_valid_decision(first, snap)
    if count:
        assert first.jobs, "an idle cluster with waiting jobs"
    again = policy.decide(snap, params)
    assert again.jobs == first.jobs
    assert again.allocation == first.allocation
    assert again.reasons == first.reasons
    assert again.state == first.state


@pytest.mark.parametrize("name", policy_names())
def test_a_decision_carries_the_planned_rounds_and_the_solve(name: str) -> None:
    """What the service stores with a plan comes from the decision, never from the state: a
    policy that plans ahead says which rounds it planned and what its solve reported."""
    policy = get_policy(name)
    snap = snapshot(random_jobs(2, 40, 32), gpus=32, per_node=8, now=600.0)
    decision = policy.decide(snap, make_params(policy))
    if name == "shockwave":
        assert len(decision.planned) >= 1
        assert decision.solve is not None and decision.solve.solves == 1
        assert decision.solve.status != "empty"
        later = policy.decide(
            dataclasses.replace(
                snap, round_index=snap.round_index + 1, policy_state=decision.state
            ),
            make_params(policy),
        )
        assert later.planned == decision.planned[1:], "a followed plan moves on by a round"
        assert later.solve == decision.solve, "no new solve while the plan is followed"
    else:
        assert decision.planned == () and decision.solve is None


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_keeps_its_contract_over_rounds(name: str) -> None:
    """Eight rounds with arrivals and completions, each decision's state handed back."""
    policy = get_policy(name)
    params = make_params(policy)
    pool = random_jobs(seed=7, count=14, total_gpus=8)
    done: dict[str, float] = {j.job_id: j.progress.epochs_done for j in pool}
    ran: dict[str, float] = {}
    state: object | None = None
    for round_index in range(8):
        now = 120.0 * round_index
        active = [
            dataclasses.replace(
                job,
                progress=JobProgress(
                    batch_size=job.progress.batch_size,
                    epochs_done=done[job.job_id],
                    executed_last_round_s=ran.get(job.job_id, 0.0),
                ),
            )
            for job in pool
            if job.spec.arrival_s <= now and done[job.job_id] < job.spec.epochs
        ]
        snap = snapshot(active, gpus=8, now=now, state=state)
        decision = policy.decide(snap, params)
        assert_valid_decision(decision, snap)
        state = decision.state
        ran = {}
        for job in active:
            if job.job_id in decision.jobs:
                seconds = job.epoch_seconds()
                assert seconds is not None
                done[job.job_id] = min(job.spec.epochs, done[job.job_id] + 120.0 / seconds)
                ran[job.job_id] = 120.0


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError) as raised:
        get_policy("nope")
    message = str(raised.value)
    assert "'nope'" in message
    for name in policy_names():
        assert name in message
    assert raised.value.known == policy_names()


def test_registry_holds_the_baselines() -> None:
    assert {"fifo", "gavel", "mst", "themis", "allox", "gandiva_fair", "ossp"} <= set(
        policy_names()
    )
    assert all(get_policy(name).name == name for name in policy_names())


@pytest.mark.parametrize("name", policy_names())
def test_make_params_rejects_unknown_keys(name: str) -> None:
    with pytest.raises(ValueError, match="no_such_knob"):
        make_params(get_policy(name), {"no_such_knob": 1})


@pytest.mark.parametrize(
    ("name", "overrides", "field", "value"),
    [
        ("fifo", {"backfill": True}, "backfill", True),
        ("allox", {"alpha": 0.5}, "alpha", 0.5),
        ("ossp", {"deadline_slack": 0.0}, "deadline_slack", 0.0),
        ("themis", {}, "tolerance", 1e-7),
    ],
)
def test_make_params_applies_overrides(
    name: str, overrides: dict[str, object], field: str, value: object
) -> None:
    assert getattr(make_params(get_policy(name), overrides), field) == value
