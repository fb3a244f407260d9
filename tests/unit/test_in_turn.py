"""Like jobs take their rounds in turn (``like_ratio``): where jobs of one width and alike in run
time ask more GPUs than the cluster has, the rounds the market gave them go to the most advanced
first, then the longest waiting, each up to its cap; a member keeps as much of its count as the
makespan's path asks of it.

Shapes: 60 s rounds, a 10-round window; run times and remainders in seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from shockwave.market.planner import (
    PlanJob,
    PlannerParams,
    build_problem,
    in_turn,
    like_groups,
    path_floors,
    plan,
)
from tests.builders import plan_job

ROUND = 60.0
T = 10


def like_job(
    job_id: str,
    left: float,
    *,
    run_time: float = 3_000.0,
    gpus: int = 1,
    running: bool = False,
    age: float = 0.0,
) -> PlanJob:
    """A job of ``left`` seconds to run out of ``run_time``: utility is its progress share,
    so the market's log utility values a round most for the job with the least progress."""
    done = run_time - left
    cap = min(T, math.ceil(left / ROUND))
    utility = [min(1.0, (done + ROUND * n) / run_time) for n in range(cap + 1)]
    base = plan_job(job_id, utility, gpus=gpus, running=running)
    return replace(
        base,
        remaining=tuple(max(0.0, left - ROUND * n) for n in range(cap + 1)),
        run_time_s=run_time,
        overdue=(0.0,) * (cap + 1),
        age_s=age,
    )


def params(ratio: float = 1.25) -> PlannerParams:
    return PlannerParams(rounds=T, critical_path_margin=0.0, like_ratio=ratio, use_scip="never")


def test_like_jobs_on_a_full_cluster_run_the_most_advanced_first() -> None:
    # four like jobs on two GPUs: the market shares the 20 GPU-rounds out in equal parts;
    # in turn, the two most advanced run the whole window and the others wait
    jobs = [like_job(f"j{i}", left) for i, left in enumerate((2_400.0, 1_200.0, 2_000.0, 1_800.0))]
    off = plan(jobs, 2, params(0.0), ROUND)
    on = plan(jobs, 2, params(), ROUND)
    assert sorted(off.counts.values()) != [0, 0, 10, 10]  # the market alone shares them out
    assert on.counts == {"j0": 0, "j1": 10, "j2": 0, "j3": 10}
    assert sum(on.counts.values()) == sum(off.counts.values())
    assert set(on.rounds[0]) == {"j1", "j3"}


def test_a_job_near_its_end_takes_only_its_cap() -> None:
    # j1 ends in 2 rounds: it takes 2, the next in order the rest of the group's rounds
    jobs = [like_job("j0", 2_900.0), like_job("j1", 120.0), like_job("j2", 2_500.0)]
    problem = build_problem(jobs, 2, params(), ROUND)
    counts = np.array([7, 2, 7], dtype=np.int64)
    dealt = in_turn(problem, counts, like_groups(problem, 1.25))
    assert dealt.tolist() == [4, 2, 10]
    assert int(dealt.sum()) == int(counts.sum())


def test_a_tie_goes_to_the_running_job() -> None:
    jobs = [like_job("a", 1_500.0), like_job("b", 1_500.0, running=True), like_job("c", 2_000.0)]
    problem = build_problem(jobs, 1, params(), ROUND)
    dealt = in_turn(problem, np.array([4, 3, 3], dtype=np.int64), like_groups(problem, 1.25))
    assert dealt.tolist() == [0, 10, 0]


def test_groups_need_one_width_alike_run_times_and_more_gpus_than_the_cluster() -> None:
    a = like_job("a", 1_000.0, run_time=3_000.0)
    b = like_job("b", 1_000.0, run_time=3_700.0)  # within 1.25x of a's
    c = like_job("c", 1_000.0, run_time=3_800.0)  # over 1.25x of a's: a group of its own
    d = like_job("d", 1_000.0, run_time=3_000.0, gpus=2)
    e = like_job("e", 1_000.0, run_time=3_000.0, gpus=2)
    # a and b ask 2 GPUs of 2: they all run at once, nothing to take in turn
    assert like_groups(build_problem([a, b], 2, params(), ROUND), 1.25) == []
    # with c the 1-GPU jobs ask 3 GPUs of 2, but a and b, the alike ones, still fit: only
    # d and e (4 GPUs of 2) take turns; at 1.5 a, b and c are alike and ask 3
    problem = build_problem([a, b, c, d, e], 2, params(), ROUND)
    assert like_groups(problem, 1.25) == [[3, 4]]
    assert like_groups(problem, 1.5) == [[0, 1, 2], [3, 4]]
    # on one GPU a and b cannot run at once
    assert like_groups(build_problem([a, b, c], 1, params(), ROUND), 1.25) == [[0, 1]]


def test_unstarted_like_jobs_go_oldest_first() -> None:
    # none has started: the one that has waited longest goes first, not the one predicted
    # shortest (their predictions are all that tells them apart)
    jobs = [
        like_job("new", 2_900.0, run_time=2_900.0, age=100.0),
        like_job("old", 3_200.0, run_time=3_200.0, age=900.0),
        like_job("mid", 3_000.0, run_time=3_000.0, age=500.0),
    ]
    problem = build_problem(jobs, 1, params(), ROUND)
    dealt = in_turn(problem, np.array([3, 3, 4], dtype=np.int64), like_groups(problem, 1.25))
    assert dealt.tolist() == [0, 10, 0]


def test_held_and_unknown_jobs_keep_the_markets_counts() -> None:
    unknown = replace(like_job("unknown", 400.0), run_time_s=None)
    probe = replace(like_job("probe", 300.0), probe=True)
    late = replace(like_job("late", 2_500.0), overdue=(30.0,) * (T + 1))
    jobs = [unknown, probe, like_job("x", 2_000.0), late]
    problem = build_problem(jobs, 1, params(), ROUND)
    assert like_groups(problem, 1.25) == [[2, 3]]  # a late job takes its turn too
    counts = np.array([2, 1, 3, 4], dtype=np.int64)
    dealt = in_turn(problem, counts, like_groups(problem, 1.25))
    assert dealt.tolist() == [2, 1, 7, 0]


def test_off_and_where_nothing_is_alike_the_plan_is_the_markets() -> None:
    jobs = [like_job(f"j{i}", 600.0 * (i + 1), run_time=3_000.0 * 2**i) for i in range(4)]
    assert plan(jobs, 2, params(), ROUND) == plan(jobs, 2, params(0.0), ROUND)
    lefts = (2_400.0, 1_200.0, 2_000.0, 1_800.0)
    like = [like_job(f"j{i}", left) for i, left in enumerate(lefts)]
    problem = build_problem(like, 2, params(0.0), ROUND)
    counts = np.array([5, 5, 5, 5], dtype=np.int64)
    assert in_turn(problem, counts, like_groups(problem, 1.25)) is not counts
    assert plan(like, 2, params(0.0), ROUND).counts != plan(like, 2, params(), ROUND).counts


@pytest.mark.parametrize("ratio", [-1.0, 0.5, float("nan"), float("inf")])
def test_like_ratio_must_be_zero_or_at_least_one(ratio: float) -> None:
    with pytest.raises(ValueError, match="like_ratio"):
        PlannerParams(like_ratio=ratio)


def test_the_rule_is_on_by_default_at_a_ratio_of_one_and_a_half() -> None:
    jobs = [like_job(f"j{i}", left) for i, left in enumerate((2_400.0, 1_200.0, 2_000.0, 1_800.0))]
    default = PlannerParams(rounds=T, critical_path_margin=0.0, use_scip="never")
    assert default.like_ratio == 1.5
    assert plan(jobs, 2, default, ROUND) == plan(jobs, 2, params(1.5), ROUND)
    assert plan(jobs, 2, default, ROUND) != plan(jobs, 2, params(0.0), ROUND)


def tail_jobs() -> list[PlanJob]:
    # a cluster's last jobs, long in the system (their own deadlines passed): W is 2,100 s,
    # and the least advanced one's 2,900 s left outlast W after the 600-s window by 1,400 s
    return [
        like_job("behind", 2_900.0, age=3_000.0),
        like_job("ahead", 600.0, age=3_000.0),
        like_job("next", 700.0, age=3_000.0),
    ]


def test_a_member_on_the_makespans_path_keeps_its_count_up_to_its_floor() -> None:
    problem = build_problem(tail_jobs(), 2, params(), ROUND)
    held = path_floors(problem, 0.0, ROUND, 0.05)
    assert held.tolist() == [10, 0, 0]  # every round of the window is the makespan's
    counts = np.array([6, 7, 7], dtype=np.int64)
    like = like_groups(problem, 1.25)
    assert in_turn(problem, counts, like).tolist() == [0, 10, 10]  # without the floors
    assert in_turn(problem, counts, like, held).tolist() == [6, 10, 4]
    # through the planner: the market gives the path job the whole window and it keeps it
    # (without the floors it would get none: the two others take 10 each)
    off = plan(tail_jobs(), 2, params(0.0), ROUND)
    on = plan(tail_jobs(), 2, params(), ROUND)
    assert sum(off.counts.values()) == 20
    assert on.counts == {"behind": off.counts["behind"], "ahead": 10, "next": 0}


def test_rounds_past_the_floor_are_dealt_in_turn() -> None:
    problem = build_problem(tail_jobs(), 2, params(), ROUND)
    counts = np.array([8, 6, 6], dtype=np.int64)
    like = like_groups(problem, 1.25)
    # a floor of 5 of its 8: the other 3 go to the most advanced, then the next
    assert in_turn(problem, counts, like, np.array([5, 0, 0])).tolist() == [5, 10, 5]
    # a floor above the count keeps the count, no more: the group's total is the market's
    assert in_turn(problem, counts, like, np.array([10, 0, 0])).tolist() == [8, 10, 2]
    few = np.array([2, 2, 2], dtype=np.int64)
    assert in_turn(problem, few, like, np.array([10, 0, 10])).tolist() == [2, 2, 2]
