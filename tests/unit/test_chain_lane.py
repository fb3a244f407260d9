"""The chain of wide gangs and the jobs it holds on the makespan's path.

Shapes: gangs wider than half the GPUs run one after another (a chain); a job that cannot run
beside any of them ends no sooner than its remainder plus the chain's, and while that bound
outlasts the work bound it runs in every round that runs no gang of the chain.
"""

from __future__ import annotations

import pytest

from shockwave.domain.snapshot import ActiveJob
from shockwave.market.planner import chain_blocked
from shockwave.policies.shockwave_market.shockwave import (
    JobOutlook,
    Shockwave,
    ShockwaveParams,
    ShockwaveState,
    _chain_held,
    _chain_lane,
    _fill,
)
from tests.builders import active_job, snapshot


@pytest.mark.parametrize(
    ("gpus", "soonest", "total", "flags"),
    [
        # a gang of 6 of 8 and a 3-GPU job that cannot run beside it: W = 1,087.5 s, its
        # bound 900 + 1,000 s
        ([6, 3], [1_000.0, 900.0], 8, [False, True]),
        # a 2-GPU job fits beside the gang: never held by the chain
        ([6, 2], [1_000.0, 900.0], 8, [False, False]),
        # two gangs of 5 of 8 chain (1,000 + 800 s); the 4-GPU job's bound 2,100 s > W
        ([5, 5, 4], [1_000.0, 800.0, 300.0], 8, [False, False, True]),
        # a gang of exactly half is no chain
        ([4, 4, 4], [1_000.0, 1_000.0, 900.0], 8, [False, False, False]),
        # the work bound outlasts the job's bound (eight 1-GPU jobs of 5,000 s: W = 5,862.5 s)
        ([6, 3, *[1] * 8], [1_000.0, 900.0, *[5_000.0] * 8], 8, [False, False, *[False] * 8]),
        # no gang at all
        ([1, 2], [500.0, 400.0], 4, [False, False]),
    ],
)
def test_chain_blocked_table(
    gpus: list[int], soonest: list[float], total: int, flags: list[bool]
) -> None:
    assert chain_blocked(gpus, soonest, total) == flags


def jobs(narrow: int) -> list[ActiveJob]:
    """On 8 GPUs (100 s epochs): a gang of all 8 GPUs of 5,000 s, a 2-GPU job of 10,000 s and
    ``narrow`` 1-GPU jobs of 1,000 s. With six, W = 8,250 s; the 2-GPU job's chain bound is
    15,000 s."""
    return [
        active_job("gang", gpus=8, epochs=50),
        active_job("held", gpus=2, epochs=100),
        *(active_job(f"n{i}", epochs=10) for i in range(narrow)),
    ]


def outlooks(active: list[ActiveJob]) -> dict[str, JobOutlook]:
    shot = snapshot(active, gpus=8)
    policy, params = Shockwave(), ShockwaveParams()
    return {j.job_id: policy.outlook(shot, j, params, {}, {}) for j in active}


def held(active: list[ActiveJob]) -> frozenset[str]:
    return _chain_held(snapshot(active, gpus=8), outlooks(active))


def test_the_chain_holds_the_job_that_cannot_run_beside_it() -> None:
    assert held(jobs(6)) == {"held"}
    # 1-GPU jobs of 20,000 s cannot run beside a gang of all 8 GPUs either (W = 13,250 s)
    longer = [active_job(f"m{i}", epochs=200) for i in range(2)]
    assert held(jobs(6) + longer) == {"held", "m0", "m1"}
    # fourteen 1-GPU jobs of 10,000 s: W = 25,750 s outlasts every job's chain bound
    assert held(jobs(6) + [active_job(f"m{i}", epochs=100) for i in range(14)]) == set()


def test_the_held_job_goes_first_in_a_round_without_the_chain() -> None:
    active = jobs(6)
    column = [f"n{i}" for i in range(6)]
    lane = _chain_lane(snapshot(active, gpus=8), column, held(active))
    assert lane == ["held", *column]


def test_the_held_job_displaces_the_last_planned_jobs_of_a_full_round() -> None:
    active = jobs(8)
    shot, looks = snapshot(active, gpus=8), outlooks(active)
    full = [f"n{i}" for i in range(8)]
    lane = _chain_lane(shot, full, held(active))
    assert lane == ["held", *full]
    chosen, _, _ = _fill(shot, lane, looks)
    assert chosen == ["held", "n0", "n1", "n2", "n3", "n4", "n5"]
    # without the lane the plan's column runs as it is
    assert _fill(shot, full, looks)[0] == full


def test_a_round_that_runs_the_chain_is_left_as_planned() -> None:
    active = jobs(6)
    assert _chain_lane(snapshot(active, gpus=8), ["gang"], held(active)) == ["gang"]


def test_nothing_is_held_without_a_gang_wider_than_half() -> None:
    active = [active_job("wide", gpus=4, epochs=50), active_job("long", gpus=4, epochs=100)]
    assert held(active) == set()


def test_the_policy_keeps_the_held_jobs_of_its_last_plan() -> None:
    active = jobs(6)
    decided = Shockwave().decide(snapshot(active, gpus=8), ShockwaveParams())
    assert isinstance(decided.state, ShockwaveState)
    assert decided.state.chain_held == {"held"}
    off = Shockwave().decide(snapshot(active, gpus=8), ShockwaveParams(chain_lane=False))
    assert isinstance(off.state, ShockwaveState)
    assert off.state.chain_held == set()
