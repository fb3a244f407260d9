"""The short-job lane in the Shockwave policy: a cached plan that holds back a short job past
its fairness deadline is re-planned, and the job runs this round (docs/policy.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shockwave.market.planner import PlannerParams
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams, ShockwaveState
from tests.builders import active_job, snapshot


@pytest.mark.parametrize(("lane", "runs_now"), [(True, True), (False, False)])
def test_a_due_short_job_is_not_left_to_a_later_column(lane: bool, runs_now: bool) -> None:
    # Two long jobs hold both GPUs; the plan made when the short one arrived put it in its third
    # column. Its 100-second run now falls due before this round ends (arrival + N_avg P_hat,
    # N_avg 1.5: 50 s from now) and nothing else has changed.
    now = 1200.0
    longs = [
        active_job(f"l{i}", epochs=1000, arrival=0.0, executed_last_round=120.0, gpus=1)
        for i in range(2)
    ]
    # each on its own GPU
    longs = [replace(job, progress=replace(job.progress, gpus=(i,))) for i, job in enumerate(longs)]
    short = active_job("s", epochs=1, steps_per_second=1.0, arrival=now - 100.0)
    jobs = [*longs, short]
    round_index = int(now // 120.0)
    state = ShockwaveState(
        plan_rounds=(("l0", "l1"), ("l0", "l1"), ("s", "l1")),
        planned_at_round=round_index,
        job_set=frozenset(j.job_id for j in jobs),
        regimes_seen={j.job_id: 0 for j in jobs},
        counts={"l0": 2, "l1": 3, "s": 1},
    )
    params = ShockwaveParams(planner=PlannerParams(short_lane=lane))
    decision = Shockwave().decide(snapshot(jobs, gpus=2, now=now, state=state), params)
    assert ("s" in decision.jobs) is runs_now
    assert len(decision.jobs) == 2
