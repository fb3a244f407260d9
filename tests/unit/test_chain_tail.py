"""The order of the chain of wide gangs, the burst it lets run first, and its start at the
tail of a burst.

Shapes: gangs wider than half the GPUs run one after another (a chain). A round that runs one
runs the shortest; a round that runs none while the jobs outside the chain ask at most a share
of the GPUs, or their work fits beside the chain in a share of its time, and the chain sets
the makespan, runs the shortest gang that leaves GPUs beside it, the other jobs by fewest
remaining GPU-seconds. While those jobs ask more than the cluster and do not fit so, a round
planned with a gang runs them instead.
"""

from __future__ import annotations

import pytest

from shockwave.domain.snapshot import ActiveJob
from shockwave.policies.shockwave_market.shockwave import (
    JobOutlook,
    Shockwave,
    ShockwaveParams,
    _chain_burst_first,
    _chain_fits,
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


def tail(
    active: list[ActiveJob], column: list[str], share: float = 0.75, fill: float = 0.0
) -> list[str]:
    return _chain_tail(snapshot(active, gpus=GPUS), column, outlooks(active), share, fill)


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


def test_the_gang_leads_where_the_queue_fits_beside_it_in_the_fill_share() -> None:
    # ten 1-GPU jobs ask 10 of 12 GPUs, more than 0.75 of them, but their 25,000 GPU-seconds
    # fit in the 4 GPUs beside the gang within 0.75 of its 10,000 s (30,000)
    active = [*burst_tail(), *(active_job(f"m{i}", epochs=10) for i in range(4))]
    column = [j.job_id for j in active[1:]]
    assert tail(active, column, fill=0.75)[0] == "gang"
    # within half its time (20,000) they do not
    assert tail(active, column, fill=0.5) == column


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


def burst(epochs: int = 30) -> list[ActiveJob]:
    """On 12 GPUs: a gang of 8 GPUs of 10,000 s and fourteen 1-GPU jobs, ``epochs`` x 100 s
    each but the last three, 500 s shorter each: a queue wider than the cluster."""
    return [
        active_job("gang", gpus=8, epochs=100),
        *(active_job(f"b{i:02d}", epochs=epochs - max(0, i - 10) * 5) for i in range(14)),
    ]


def first(
    active: list[ActiveJob], column: list[str], fill: float = 0.75, gpus: int = GPUS
) -> list[str]:
    return _chain_burst_first(
        snapshot(active, gpus=gpus), column, outlooks(active, gpus=gpus), fill
    )


def test_the_burst_runs_before_the_chain_shortest_first() -> None:
    # 14 jobs ask 14 of 12 GPUs; their 39,000 GPU-seconds do not fit beside the gang in 0.75
    # of its time (30,000)
    active = burst()
    ran = first(active, ["gang", "b00", "b01"])
    assert "gang" not in ran
    assert ran[:2] == ["b00", "b01"]
    assert ran[2:5] == ["b13", "b12", "b11"]
    assert sorted(ran) == sorted(j.job_id for j in active[1:])
    shot, looks = snapshot(active, gpus=GPUS), outlooks(active)
    # the gang would take 8 GPUs and leave the queue 4
    assert "gang" in _fill(shot, ["gang", "b00", "b01"], looks)[0]
    assert len(_fill(shot, ran, looks)[0]) == GPUS


def test_a_queue_the_cluster_holds_keeps_the_gang() -> None:
    active = burst()[:13]  # 12 jobs on 12 GPUs
    assert first(active, ["gang", "b00"]) == ["gang", "b00"]


def test_a_burst_that_fits_beside_the_chain_keeps_the_gang() -> None:
    # fourteen jobs of 2,000 s or less: 25,000 GPU-seconds fit in 30,000
    active = burst(epochs=20)
    assert first(active, ["gang", "b00"]) == ["gang", "b00"]
    # with no fill share they are a burst
    assert "gang" not in first(active, ["gang", "b00"], fill=0.0)


def test_a_round_without_the_gang_is_left_to_the_burst_rule() -> None:
    assert first(burst(), ["b00", "b01"]) == ["b00", "b01"]


def test_a_gang_of_the_whole_cluster_does_not_yield() -> None:
    # on 8 GPUs it leaves no GPU for the burst's tail beside it
    active = [active_job("gang", gpus=8, epochs=100), *burst()[1:]]
    assert first(active, ["gang"], gpus=8) == ["gang"]


def test_the_fill_needs_gpus_beside_the_chain() -> None:
    active = [active_job("gang", gpus=8, epochs=100), active_job("n", epochs=1)]
    looks = outlooks(active)
    assert not _chain_fits(active[:1], active[1:], looks, 8, 1.0)
    assert _chain_fits(active[:1], active[1:], looks, 9, 1.0)
    assert not _chain_fits(active[:1], active[1:], looks, 9, 0.0)


@pytest.mark.parametrize("fill", [-0.1, 1.5, float("nan")])
def test_the_tail_fill_is_a_share(fill: float) -> None:
    with pytest.raises(ValueError, match="chain_tail_fill"):
        ShockwaveParams(chain_tail_fill=fill)


def test_the_burst_rule_is_on_by_default_and_can_be_turned_off() -> None:
    params = ShockwaveParams()
    assert params.chain_burst_first
    assert params.chain_tail_fill == 0.75
    shot = snapshot(burst(), gpus=GPUS)
    # the plan runs the gang with four of the queue beside it; the rule twelve of the queue
    assert "gang" in Shockwave().decide(shot, ShockwaveParams(chain_burst_first=False)).jobs
    on = Shockwave().decide(shot, params).jobs
    assert "gang" not in on
    assert len(on) == GPUS
    with pytest.raises(ValueError, match="chain_burst_first"):
        ShockwaveParams(chain_burst_first="yes")  # type: ignore[arg-type]
