"""The Shockwave policy with tenants: the share pass follows the plan inside each tenant's share
in the packing's order of groups, judged at this round (docs/tenants.md)."""

from __future__ import annotations

from dataclasses import replace

from shockwave.domain.snapshot import ActiveJob
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams, ShockwaveState
from tests.builders import active_job, snapshot


def _of(tenant: str, job: ActiveJob) -> ActiveJob:
    return replace(job, spec=replace(job.spec, tenant=tenant))


def test_a_job_past_its_deadline_takes_its_tenants_share_before_one_that_has_time() -> None:
    # 4 GPUs, tenants a and b of equal weight: 2 GPUs each. The plan, made rounds ago and still
    # followed, put a's new job before a's old one; the old one has since passed its fairness
    # deadline (arrived at 0, 1,000 s of work, now 5,000 s) and the new one has time to spare.
    # a's share holds a_run and one more: the late job, not the one the cached order named first.
    now = 5000.0
    a_run = _of("a", active_job("a_run", arrival=now - 200.0, executed_last_round=120.0))
    a_new = _of("a", active_job("a_new", arrival=now - 10.0))
    a_late = _of("a", active_job("a_late", arrival=0.0))
    bs = [_of("b", active_job(f"b{i}", arrival=now - 300.0)) for i in range(2)]
    jobs = [a_late, *bs, a_run, a_new]
    column = ("a_run", "a_new", "a_late", "b0")
    state = ShockwaveState(
        plan_rounds=(column, column, column),
        planned_at_round=int(now // 120.0) - 1,
        job_set=frozenset(j.job_id for j in jobs),
        regimes_seen={j.job_id: 0 for j in jobs},
        counts={"a_run": 3, "a_new": 2, "a_late": 2, "b0": 3, "b1": 0},
    )
    decision = Shockwave().decide(snapshot(jobs, gpus=4, now=now, state=state), ShockwaveParams())
    assert {"a_run", "a_late"} <= set(decision.jobs)
    assert "a_new" not in decision.jobs
    assert sorted(decision.jobs) == ["a_late", "a_run", "b0", "b1"]


def test_deciding_a_round_again_counts_it_once() -> None:
    # The service plans the next round at each change during the current one: the contention
    # tallies and the tenants' balances must count the round once, as the simulator does.
    jobs = [_of("a", active_job(f"a{i}", gpus=2)) for i in range(3)]
    jobs += [_of("b", active_job("b0", gpus=4))]
    policy, params = Shockwave(), ShockwaveParams()
    first = policy.decide(snapshot(jobs, gpus=6, now=120.0), params).state
    again = policy.decide(snapshot(jobs, gpus=6, now=130.0, state=first), params).state
    assert isinstance(first, ShockwaveState) and isinstance(again, ShockwaveState)
    assert (
        dict(again.contention_rounds)
        == dict(first.contention_rounds)
        == dict.fromkeys(("a0", "a1", "a2", "b0"), 1)
    )
    assert dict(again.tenant_owed) == dict(first.tenant_owed)
    # 3 GPUs each: b's 4-GPU gang cannot match its share, so a balance is carried
    assert first.tenant_owed
    after = policy.decide(snapshot(jobs, gpus=6, now=240.0, state=again), params).state
    assert isinstance(after, ShockwaveState)
    assert set(after.contention_rounds.values()) == {2}
