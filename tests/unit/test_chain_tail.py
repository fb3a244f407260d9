"""The order of the chain of wide gangs and its start at the tail of a burst.

Shapes: gangs wider than half the GPUs run one after another (a chain). A round that runs one
runs the shortest; a round that runs none while the jobs outside the chain ask at most a share
of the GPUs, and the chain sets the makespan, runs the shortest gang that leaves GPUs beside
it, the other jobs by fewest remaining GPU-seconds.
"""

from __future__ import annotations

import pytest

from shockwave.domain.snapshot import ActiveJob
from shockwave.policies.shockwave_market.shockwave import (
    JobOutlook,
    Shockwave,
    ShockwaveParams,
    _chain_shortest_first,
    _chain_tail,
    _fill,
)
from tests.builders import active_job, snapshot

GPUS = 12


def outlooks(active: list[ActiveJob], gpus: int = GPUS) -> dict[str, JobOutlook]:
    shot = snapshot(active, gpus=gpus)
    policy, params = Shockwave(), ShockwaveParams()
    return {j.job_id: policy.outlook(shot, j, params, {}, {}) for j in active}


def tail(active: list[ActiveJob], column: list[str], share: float = 0.75) -> list[str]:
    return _chain_tail(snapshot(active, gpus=GPUS), column, outlooks(active), share)


NARROW = [f"n{i}" for i in range(6)]


def burst_tail(gang_epochs: int = 100) -> list[ActiveJob]:
    """On 12 GPUs (100 s epochs): a gang of 8 GPUs and six 1-GPU jobs of 6,000 down to 1,000
    s, the tail of a burst. With the defaults the chain's 10,000 s outlast the work bound
    (8,417 s)."""
    return [
        active_job("gang", gpus=8, epochs=gang_epochs),
        *(active_job(f"n{i}", epochs=10 * (6 - i)) for i in range(6)),
    ]


def test_the_gang_leads_the_round_at_the_tail_with_the_shortest_jobs_beside_it() -> None:
    active = burst_tail()
    led = tail(active, NARROW)
    assert led == ["gang", *reversed(NARROW)]
    shot, looks = snapshot(active, gpus=GPUS), outlooks(active)
    # the gang's 8 GPUs and the four shortest jobs on the 4 GPUs it leaves
    assert _fill(shot, led, looks)[0] == ["gang", "n5", "n4", "n3", "n2"]
    # without the rule the round runs the burst's jobs and the gang waits
    assert "gang" not in _fill(shot, NARROW, looks)[0]


def test_a_queue_of_narrow_jobs_is_no_tail() -> None:
    # ten 1-GPU jobs ask 10 of 12 GPUs, more than 0.75 of them
    active = [*burst_tail(), *(active_job(f"m{i}", epochs=10) for i in range(4))]
    column = [j.job_id for j in active[1:]]
    assert tail(active, column) == column
    # a share of 0.9 takes them for a tail
    assert tail(active, column, share=0.9)[0] == "gang"


def test_a_round_that_runs_the_chain_is_left_as_planned() -> None:
    assert tail(burst_tail(), ["gang", "n0", "n1"]) == ["gang", "n0", "n1"]


def test_the_gang_waits_where_the_work_bound_outlasts_the_chain() -> None:
    # a gang of 2,000 s: the work bound (3,083 s) and not the chain sets the makespan
    active = burst_tail(gang_epochs=20)
    assert tail(active, NARROW) == NARROW


def test_a_gang_of_the_whole_cluster_is_not_started_at_the_tail() -> None:
    # it leaves no GPU beside it, and the work bound counts its remainder whole
    active = [active_job("gang", gpus=8, epochs=100), active_job("n", epochs=10)]
    shot = snapshot(active, gpus=8)
    assert _chain_tail(shot, ["n"], outlooks(active, gpus=8), 0.75) == ["n"]


def gangs() -> list[ActiveJob]:
    """On 12 GPUs: gangs of 8 GPUs of 10,000 and 3,000 s and a 1-GPU job."""
    return [
        active_job("long", gpus=8, epochs=100),
        active_job("short", gpus=8, epochs=30),
        active_job("n", epochs=10),
    ]


def shortest(column: list[str]) -> list[str]:
    active = gangs()
    return _chain_shortest_first(snapshot(active, gpus=GPUS), column, outlooks(active))


def test_the_round_runs_the_shortest_gang_of_the_chain() -> None:
    assert shortest(["long", "n"]) == ["short", "n"]
    assert shortest(["short", "n"]) == ["short", "n"]


def test_a_round_without_a_gang_of_the_chain_is_left_as_planned() -> None:
    assert shortest(["n"]) == ["n"]


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_the_tail_share_is_a_share(share: float) -> None:
    with pytest.raises(ValueError, match="chain_tail_share"):
        ShockwaveParams(chain_tail_share=share)


def test_the_rules_are_on_by_default_and_can_be_turned_off() -> None:
    params = ShockwaveParams()
    assert params.chain_shortest_first
    assert params.chain_tail_share == 0.75
    off = ShockwaveParams(chain_shortest_first=False, chain_tail_share=0.0)
    shot = snapshot(gangs(), gpus=GPUS)
    # the plan runs the longest gang, on the makespan's path; the rule the shortest
    assert "long" in Shockwave().decide(shot, off).jobs
    on = Shockwave().decide(shot, params).jobs
    assert "short" in on
    assert "long" not in on


def test_a_cluster_of_gangs_alone_keeps_the_markets_order() -> None:
    # on one GPU every job is a gang of the chain: the chain is the whole market, and neither
    # rule reorders it
    active = [active_job("long", epochs=100), active_job("short", epochs=3)]
    shot, looks = snapshot(active, gpus=1), outlooks(active, gpus=1)
    assert _chain_shortest_first(shot, ["long"], looks) == ["long"]
    assert _chain_tail(shot, [], looks, 0.75) == []
