"""bench/elastic_bound.py: its bounds are exact where they can be and below real schedules."""

from __future__ import annotations

import pytest

from bench.elastic_bound import (
    ElasticJob,
    alone_bound,
    bounds,
    elastic_jobs,
    lp_bound,
    srpt_bound,
)
from shockwave.policies.policy import get_policy, make_params
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.workload import SimJob
from tests.builders import cluster, workload
from tests.builders import elastic_sim_job as elastic_job

SPEEDUP = {2: {32: 1.8}, 4: {32: 3.2}, 8: {32: 5.6}}


def elastic_sim_job(job_id: str, epochs: int, arrival: float = 0.0) -> SimJob:
    return elastic_job(job_id, epochs, SPEEDUP, arrival)


def test_a_jobs_work_and_rates_come_from_its_most_efficient_count() -> None:
    (job,) = elastic_jobs(workload(elastic_sim_job("a", 10)))
    assert job.work == pytest.approx(100.0)  # 10 epochs of 10 s on one GPU
    assert job.rate[1] == pytest.approx(1.0)
    assert job.rate[8] == pytest.approx(5.6)  # 5.6x faster, in one-GPU units
    assert alone_bound([job]) == pytest.approx(100 / 5.6)


def test_srpt_bound_is_exact_on_one_machine() -> None:
    # Sizes 1 s and 2 s on 32 GPUs, both at 0: done at 1 and 3; the 3 s job arriving at 0.5 waits.
    jobs = [ElasticJob(0.0, 32.0, {1: 1.0}), ElasticJob(0.0, 64.0, {1: 1.0})]
    assert srpt_bound(jobs, 32) == pytest.approx(2.0)
    late = [*jobs, ElasticJob(0.5, 96.0, {1: 1.0})]
    assert srpt_bound(late, 32) == pytest.approx((1 + 3 + (6 - 0.5)) / 3)


def test_lp_bound_is_close_to_a_lone_jobs_run_and_never_above_it() -> None:
    job = ElasticJob(0.0, 400.0, {1: 1.0, 8: 4.0})  # 100 s at its fastest
    value = lp_bound([job], 8, slot_s=10.0, horizon_s=200.0)
    assert 90.0 <= value <= 100.0 + 1e-6


def test_every_bound_is_below_what_a_real_schedule_achieves() -> None:
    jobs = [elastic_sim_job(str(i), 20 + 15 * i, arrival=40.0 * i) for i in range(8)]
    load = workload(*jobs)
    policy = get_policy("pollux")
    result = simulate(load, cluster(16, 4), policy, make_params(policy), SimSettings())
    real = sum(j.jct_s or 0.0 for j in result.jobs) / len(result.jobs)
    found = bounds(load, 16, slot_s=30.0)
    assert found.lp_s is not None
    assert found.alone_s <= found.lp_s <= real
    assert found.srpt_s <= real
    # The LP is the useful one: it sees that no job runs on more than 8 GPUs.
    assert found.lp_s > found.srpt_s


def test_busy_time_cuts_charge_a_lone_job_its_whole_run() -> None:
    # without the cuts the LP counts the job's mean busy time plus half its shortest run (95 s)
    job = ElasticJob(0.0, 400.0, {1: 1.0, 8: 4.0})  # 100 s at its fastest
    assert lp_bound([job], 8, slot_s=10.0, horizon_s=200.0) == pytest.approx(95.0)
    assert lp_bound([job], 8, slot_s=10.0, horizon_s=200.0, busy=True) == pytest.approx(100.0)
