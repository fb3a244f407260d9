"""The critical-path reservation of wide gangs weighs the work projected to arrive.

Shapes: 60 s rounds, a 10-round window, remainders in seconds; a gang wider than a quarter of
the GPUs keeps its floor only while theta_c L outlasts the work bound W plus the arriving work A.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from shockwave.domain.state_codec import decode, encode
from shockwave.market.planner import PlanJob, PlannerParams, build_problem, critical_path_s, plan
from shockwave.policies.policy import Decision
from shockwave.policies.shockwave_market import shockwave as policy
from shockwave.policies.shockwave_market.shockwave import (
    ArrivalHistory,
    Shockwave,
    ShockwaveParams,
    ShockwaveState,
    arriving_work_s,
)
from tests.builders import active_job, plan_job, snapshot

ROUND = 60.0
T = 10


def gang(job_id: str, gpus: int, soonest: float) -> PlanJob:
    """A long gang whose market value is tiny (its fairness deadline is far)."""
    base = plan_job(job_id, [0.01 * n / T for n in range(T + 1)], gpus=gpus, weight=1e-6)
    return replace(
        base,
        remaining=tuple(soonest - ROUND * n for n in range(T + 1)),
        soonest_remaining_s=soonest,
        latest_remaining_s=soonest,
    )


def crowd() -> list[PlanJob]:
    """On 8 GPUs: a 4-GPU gang of 40,000 s (half the GPUs) and a 1-GPU job of 40,000 s, both
    worth nothing to the market, beside 80 one-round jobs worth a lot. W = 25,600 s, below
    theta_c L = 30,000 s, so the path holds while nothing is projected to arrive."""
    shorts = [plan_job(str(i), [0.0, 1.0], weight=1e6) for i in range(80)]
    return [*shorts, gang("wide", 4, 40_000.0), gang("narrow", 1, 40_000.0)]


PARAMS = PlannerParams(rounds=T, deadline_weight=0.0, makespan_weight=0.0)


def floors(params: PlannerParams) -> dict[str, int]:
    problem = build_problem(crowd(), 8, params, ROUND)
    assert problem.floors is not None
    return {j.job_id: int(f) for j, f in zip(problem.jobs, problem.floors, strict=True)}


def test_arriving_work_turns_the_gate_off() -> None:
    jobs = crowd()
    assert critical_path_s(jobs, 8, 0.75) == pytest.approx(30_000.0)
    assert critical_path_s(jobs, 8, 0.75, arriving_s=4_000.0) == pytest.approx(30_000.0)
    # W + A = 25,600 + 4,400 s reaches theta_c L: no path
    assert critical_path_s(jobs, 8, 0.75, arriving_s=4_400.0) is None
    # the path, where it holds, is max(W, theta_c L) whatever A
    assert critical_path_s(jobs, 8, 0.75, 1.0, arriving_s=10_000.0) == pytest.approx(30_000.0)


def test_a_wide_gang_loses_its_floor_to_arriving_work_and_a_narrow_job_keeps_it() -> None:
    assert floors(PARAMS)["wide"] == T and floors(PARAMS)["narrow"] == T
    flowing = replace(PARAMS, arriving_s=10_000.0)
    assert floors(flowing)["wide"] == 0
    assert floors(flowing)["narrow"] == T
    # every gang judged as narrow: the rule before
    assert floors(replace(flowing, wide_path_share=1.0))["wide"] == T
    # a gang of exactly the share is not wider than it
    assert floors(replace(flowing, wide_path_share=0.5))["wide"] == T


def test_the_market_decides_a_wide_gang_while_work_keeps_arriving() -> None:
    held = plan(crowd(), 8, PARAMS, ROUND)
    assert held.counts["wide"] == T
    flowing = plan(crowd(), 8, replace(PARAMS, arriving_s=10_000.0), ROUND)
    assert flowing.counts["wide"] < T
    assert flowing.counts["narrow"] == T


def test_knobs_outside_their_range_are_refused() -> None:
    for share in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="wide_path_share"):
            PlannerParams(wide_path_share=share)
    with pytest.raises(ValueError, match="arriving_s"):
        PlannerParams(arriving_s=-1.0)


def test_arriving_work_is_the_stream_rate_for_as_long_again_less_its_silence() -> None:
    # 8,000 GPU-seconds arrived over 1,000 s on 4 GPUs: 2 cluster-seconds per second
    history = ArrivalHistory(first_s=0.0, last_s=1_000.0, work_gpu_s=8_000.0)
    assert arriving_work_s(history, 1_000.0, 5_000.0, 4) == pytest.approx(2_000.0)
    # 400 s of silence: 600 s ahead
    assert arriving_work_s(history, 1_400.0, 5_000.0, 4) == pytest.approx(1_200.0)
    # no further than the longest job runs
    assert arriving_work_s(history, 1_000.0, 300.0, 4) == pytest.approx(600.0)
    # silent as long as it ran: stopped
    assert arriving_work_s(history, 2_000.0, 5_000.0, 4) == 0.0
    # a single instant is no stream, and nothing seen projects nothing
    assert arriving_work_s(replace(history, first_s=1_000.0), 1_000.0, 5_000.0, 4) == 0.0
    assert arriving_work_s(ArrivalHistory(), 0.0, 5_000.0, 4) == 0.0


def spy_plans(monkeypatch: pytest.MonkeyPatch) -> list[PlannerParams]:
    seen: list[PlannerParams] = []

    def spy(jobs: object, gpus: int, planner: PlannerParams, *args: object) -> object:
        seen.append(planner)
        return plan(jobs, gpus, planner, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(policy, "plan", spy)
    return seen


def state_of(decision: Decision) -> ShockwaveState:
    assert isinstance(decision.state, ShockwaveState)
    return decision.state


def test_the_policy_remembers_arrivals_after_their_jobs_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = spy_plans(monkeypatch)
    shockwave, params = Shockwave(), ShockwaveParams()
    first = [active_job("a", arrival=0.0), active_job("b", arrival=0.0, gpus=2)]
    decided = shockwave.decide(snapshot(first, gpus=4, now=0.0), params)
    history = state_of(decided).arrivals
    assert (history.first_s, history.last_s, history.at_last) == (0.0, 0.0, frozenset({"a", "b"}))
    assert history.work_gpu_s > 0
    assert seen[-1].arriving_s == 0.0  # one instant: no stream yet
    # "a" and "b" have finished; "c" arrives 600 s later: both still count
    later = [active_job("c", arrival=600.0)]
    decided = shockwave.decide(snapshot(later, gpus=4, now=600.0, state=decided.state), params)
    after = state_of(decided).arrivals
    assert (after.first_s, after.last_s, after.at_last) == (0.0, 600.0, frozenset({"c"}))
    assert after.work_gpu_s > history.work_gpu_s
    assert seen[-1].arriving_s > 0.0
    # the same snapshot again counts nothing twice
    again = shockwave.decide(snapshot(later, gpus=4, now=720.0, state=decided.state), params)
    assert state_of(again).arrivals.work_gpu_s == after.work_gpu_s


def test_without_the_projection_the_policy_plans_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = spy_plans(monkeypatch)
    params = ShockwaveParams(project_arrivals=False)
    state = ShockwaveState()
    for now, name in ((0.0, "a"), (600.0, "b")):
        decided = Shockwave().decide(
            snapshot([active_job(name, arrival=now)], gpus=4, now=now, state=state), params
        )
        state = state_of(decided)
    assert state.arrivals == ArrivalHistory()
    assert [p.arriving_s for p in seen] == [0.0, 0.0]


def test_the_history_goes_through_strict_json() -> None:
    # stored state is JSON (Postgres refuses Infinity and NaN): finite numbers from the start
    shockwave, params = Shockwave(), ShockwaveParams()
    empty = shockwave.decide(snapshot([], gpus=4, now=0.0), params)
    decided = shockwave.decide(
        snapshot([active_job("a", arrival=120.0)], gpus=4, now=120.0, state=empty.state), params
    )
    for state in (state_of(empty), state_of(decided)):
        text = json.dumps(encode(state), allow_nan=False)
        assert decode(json.loads(text)) == state
    assert state_of(decided).arrivals.first_s == 120.0
