"""bench/elastic_oracle.py: the all-knowing schedule's width rule, and that it runs for real."""

from __future__ import annotations

import pytest

from bench.elastic_bound import bounds
from bench.elastic_oracle import OracleParams, choose_widths, deadlines, run_oracle
from shockwave.workloads.workload import SimJob
from tests.builders import cluster, elastic_sim_job, workload

# 8 GPUs at 7x (efficient), 2 GPUs at 1.9x
SPEEDUP = {2: {32: 1.9}, 4: {32: 3.6}, 8: {32: 7.0}}


def elastic(job_id: str, epochs: int, arrival: float = 0.0) -> SimJob:
    return elastic_sim_job(job_id, epochs, SPEEDUP, arrival)


def test_a_job_with_nobody_behind_it_runs_at_its_fastest_count() -> None:
    times = [{1: 700.0, 2: 700 / 1.9, 8: 100.0}]
    assert choose_widths(times, [0], [0.0], 32, OracleParams()) == [8]


def test_a_long_queue_behind_a_job_keeps_it_narrow() -> None:
    # 8 GPUs save 600 s but spend 100 GPU-seconds more, which delay 1,000 jobs by 3 s each
    times = [{1: 700.0, 2: 700 / 1.9, 8: 100.0}]
    assert choose_widths(times, [0], [1000.0], 32, OracleParams()) == [1]
    # a higher price per GPU-second narrows it sooner
    assert choose_widths(times, [0], [100.0], 32, OracleParams(beta=1.0)) == [8]
    assert choose_widths(times, [0], [100.0], 32, OracleParams(beta=10.0)) == [1]


def test_a_change_of_width_pays_the_restart() -> None:
    # 2 GPUs now: 4 would save 10 s, less than the 20 s restart
    times = [{2: 100.0, 4: 90.0}]
    assert choose_widths(times, [2], [0.0], 32, OracleParams()) == [2]
    assert choose_widths(times, [2], [0.0], 32, OracleParams(restart_s=0.0)) == [4]


def test_deadlines_follow_the_ftf_cap_and_the_makespan_cap() -> None:
    load = workload(elastic("a", 10, arrival=5.0), elastic("b", 10))
    due = deadlines(load, cluster(1), ftf_cap=1.2, makespan_cap=242.0)
    # t_exclusive 100 s, two jobs on one GPU: share 2, so 1.2 x 2 x 100 s after arrival
    assert due == {"a": pytest.approx(242.0), "b": pytest.approx(240.0)}
    assert deadlines(load, cluster(1), ftf_cap=None, makespan_cap=None) == {}


@pytest.mark.parametrize(
    "params",
    [
        OracleParams(beta=1.0),
        OracleParams(beta=4.0, order="smith"),
        OracleParams(beta=4.0, online=True, online_ftf_cap=1.2, ftf_share=1.0),
    ],
)
def test_the_oracle_schedule_finishes_and_is_never_below_the_lp_bound(
    params: OracleParams,
) -> None:
    jobs = [elastic(str(i), 20 + 15 * i, arrival=40.0 * i) for i in range(8)]
    load = workload(*jobs)
    run = run_oracle(load, cluster(16, 4), params)
    found = bounds(load, 16, slot_s=30.0, busy=True)
    assert found.lp_s is not None and found.lp_busy_s is not None
    assert found.lp_s <= found.lp_busy_s + 1e-6
    assert found.lp_busy_s <= run.avg_jct_s
    assert run.makespan_s > 0 and run.worst_ftf > 0
