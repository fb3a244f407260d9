"""Elastic workers (issue 21): the range, the elastic planner, the simulator's truth, Pollux."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest

from shockwave.domain.model import ELASTIC_GUESS_EXPONENT, ElasticRange, ValidationError
from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.market.elastic import elastic_range, make_elastic, plan_elastic
from shockwave.market.planner import PlannerParams, SolveStatus
from shockwave.policies.policy import Decision, get_policy, make_params, service_params
from shockwave.policies.pollux import Pollux, PolluxParams
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams
from shockwave.simulation.simulator import PolicyContractError, SimSettings, simulate
from shockwave.workloads.traces import ThroughputTable
from shockwave_cli.commands.knobs import ShockwaveKnobs, apply_knobs
from shockwave_sdk import CheckpointStore, InvalidEnvironment, JobEnvironment, world_size_change
from tests.builders import active_job, cluster, sim_job, snapshot, workload

LINEAR = {2: {32: 1.8}, 4: {32: 3.2}, 8: {32: 5.6}}
"""Speed-ups over one GPU of a job that scales sublinearly."""


def elastic(
    job: ActiveJob, low: int = 1, high: int = 8, speedup: dict[int, dict[int, float]] | None = None
) -> ActiveJob:
    spec = dataclasses.replace(
        job.spec, elastic=ElasticRange(low, high, LINEAR if speedup is None else speedup)
    )
    return ActiveJob(spec=spec, progress=job.progress)


# ------------------------------------------------------------------------------------ the range


def test_range_lists_its_counts_and_factors() -> None:
    r = ElasticRange(1, 4, {2: {32: 1.8, 64: 1.9}})
    assert r.widths == (1, 2, 4)
    assert r.factor(1, 1, 32) == 1.0
    assert r.factor(2, 1, 64) == pytest.approx(1.9)
    # An undeclared batch size: the geometric mean of the declared ones at that count.
    assert r.factor(2, 1, 128) == pytest.approx((1.8 * 1.9) ** 0.5)
    # No declaration at all at that count: the sublinear guess.
    assert r.factor(4, 1, 32) == pytest.approx(4**ELASTIC_GUESS_EXPONENT)


@pytest.mark.parametrize(
    ("low", "high", "field"),
    [(3, 8, "elastic.min_gpus"), (1, 2048, "elastic.max_gpus"), (8, 2, "elastic.min_gpus")],
)
def test_range_refuses_impossible_counts(low: int, high: int, field: str) -> None:
    with pytest.raises(ValidationError) as error:
        ElasticRange(low, high)
    assert error.value.field == field


def test_range_refuses_a_bad_speedup_and_a_request_outside_it() -> None:
    with pytest.raises(ValidationError) as error:
        ElasticRange(1, 8, {2: {32: -1.0}})
    assert error.value.field == "elastic.speedup[2][32]"
    job = active_job("a", gpus=4)
    with pytest.raises(ValidationError) as error:
        dataclasses.replace(job.spec, elastic=ElasticRange(1, 2))
    assert error.value.field == "elastic.max_gpus"


def test_range_from_a_table_is_the_ratio_of_its_rates() -> None:
    rates = {(32, 1): 10.0, (32, 2): 18.0, (32, 4): 30.0, (64, 2): 9.0}
    r = elastic_range(2, 4, [32, 64], rates)
    assert r.widths == (1, 2, 4)
    assert r.speedup[1] == {32: pytest.approx(10 / 18)}
    assert r.speedup[4] == {32: pytest.approx(30 / 18)}


def test_make_elastic_keeps_the_request_and_the_truth() -> None:
    table = ThroughputTable({("M", 32, 1): 10.0, ("M", 32, 2): 19.0, ("M", 32, 8): 60.0})
    job = sim_job("a", [(32, 5, 10.0)], gpus=2)
    job = dataclasses.replace(job, spec=dataclasses.replace(job.spec, model="M"))
    made = make_elastic(workload(job), table, max_gpus=4)
    spec = made.jobs[0].spec
    assert spec.gpus == 2 and spec.elastic is not None
    assert spec.elastic.widths == (1, 2, 4)
    assert spec.elastic.factor(1, 2, 32) == pytest.approx(10 / 19)
    assert made.jobs[0].epoch_seconds == job.epoch_seconds
    with pytest.raises(ValueError, match="elastic-max-gpus"):
        make_elastic(workload(job), table, max_gpus=3)


# ---------------------------------------------------------------------------------- the planner


def plan_for(jobs: list[ActiveJob], gpus: int, **knobs: object) -> tuple[Decision, ShockwaveParams]:
    params = ShockwaveParams(planner=PlannerParams(rounds=10), **knobs)  # type: ignore[arg-type]
    decision = Shockwave().decide(snapshot(jobs, gpus=gpus), params)
    return decision, params


def test_idle_gpus_go_to_an_elastic_job() -> None:
    # One job alone on 8 GPUs: it gets all of them (its speed-up pays for the restart).
    job = elastic(active_job("a", epochs=100))
    decision, _ = plan_for([job], 8)
    assert decision.jobs == ("a",)
    assert decision.width(job) == 8


def test_under_load_jobs_run_narrow() -> None:
    # Eight elastic jobs that asked for 2 GPUs each on 4 GPUs: narrow is more work per GPU,
    # so the round runs four of them on one GPU each rather than two on two.
    jobs = [
        elastic(active_job(str(i), gpus=2, epochs=100), speedup={1: {10: 0.55}, 4: {10: 1.6}})
        for i in range(8)
    ]
    decision, _ = plan_for(jobs, 4)
    by_id = {j.job_id: j for j in jobs}
    assert len(decision.jobs) == 4
    assert all(decision.width(by_id[j]) == 1 for j in decision.jobs)


def test_a_crowded_cluster_plans_no_job_wider_than_it_asked() -> None:
    # Twenty 1-GPU jobs on 8 GPUs: the jobs ask for more GPUs than there are, so no job is
    # planned wider than its request (without the rule the market widens one to finish it
    # sooner); alone on the cluster a job is still planned wider.
    jobs = [elastic(active_job(str(i), epochs=5 + i)) for i in range(20)]
    shockwave = Shockwave()

    def widths(jobs: list[ActiveJob], **knobs: object) -> dict[str, int]:
        params = ShockwaveParams(planner=PlannerParams(rounds=10), **knobs)  # type: ignore[arg-type]
        snap = snapshot(jobs, gpus=8)
        outlooks = {j.job_id: shockwave.outlook(snap, j, params, {}, {}) for j in jobs}
        return dict(shockwave.solve_widths(snap, params, outlooks)[1])

    assert max(widths(jobs).values()) == 1
    assert max(widths(jobs, elastic_widen_load=0.0).values()) > 1
    assert widths(jobs[:1])["0"] > 1


def test_rigid_jobs_keep_their_count_beside_elastic_ones() -> None:
    rigid = active_job("r", gpus=2, epochs=100)
    flexible = elastic(active_job("e", epochs=100))
    decision, _ = plan_for([rigid, flexible], 8)
    assert "r" in decision.jobs and "r" not in decision.widths
    assert sum(decision.width(j) for j in (rigid, flexible) if j.job_id in decision.jobs) <= 8


def test_elastic_plan_is_certified_and_fits_every_round() -> None:
    jobs = [elastic(active_job(str(i), epochs=20 + 7 * i)) for i in range(12)]
    params = ShockwaveParams(planner=PlannerParams(rounds=10))
    shockwave = Shockwave()
    snap = snapshot(jobs, gpus=8)
    outlooks = {j.job_id: shockwave.outlook(snap, j, params, {}, {}) for j in jobs}
    plan_jobs, priority = shockwave.elastic_jobs(snap, params, outlooks)
    solved = plan_elastic(plan_jobs, 8, params.planner, 120.0, priority)
    assert solved.plan.status is SolveStatus.OPTIMAL
    assert solved.plan.gain_gap <= params.planner.relative_gap
    assert solved.plan.bound >= solved.plan.objective - 1e-12
    for column in solved.plan.rounds:
        assert sum(solved.widths.get(j, 1) for j in column) <= 8
    # The packed rounds hold each job's count at its width.
    for job_id, count in solved.plan.counts.items():
        assert sum(job_id in column for column in solved.plan.rounds) <= count


def test_rigid_snapshot_takes_the_rigid_planner() -> None:
    jobs = [active_job(str(i), epochs=30) for i in range(3)]
    params = ShockwaveParams(planner=PlannerParams(rounds=10))
    shockwave = Shockwave()
    snap = snapshot(jobs, gpus=2)
    outlooks = {j.job_id: shockwave.outlook(snap, j, params, {}, {}) for j in jobs}
    plan, widths = shockwave.solve_widths(snap, params, outlooks)
    assert widths == {}
    assert plan == shockwave.solve(snap, params, outlooks)


def test_a_long_job_that_cannot_widen_must_run_while_the_work_bound_binds() -> None:
    # Sixty 1-GPU jobs of 15,000 s that run 5.6x faster on 8 GPUs, and one 8-GPU job of
    # 20,000 s that cannot run faster, on 48 GPUs: the work bound (22,083 s) exceeds the
    # longest remainder, so judged on requested counts no path binds; on widest counts the
    # 1-GPU jobs can end in 2,679 s, and the 8-GPU job is the path: it must run now.
    short = [elastic(active_job(str(i), epochs=150)) for i in range(60)]
    wide = elastic(active_job("wide", gpus=8, epochs=200), speedup={})
    jobs = [*short, wide]
    snap = snapshot(jobs, gpus=48)
    shockwave = Shockwave()

    def must_run(**knobs: object) -> set[str]:
        params = ShockwaveParams(planner=PlannerParams(rounds=10), **knobs)  # type: ignore[arg-type]
        outlooks = {j.job_id: shockwave.outlook(snap, j, params, {}, {}) for j in jobs}
        plan_jobs, _ = shockwave.elastic_jobs(snap, params, outlooks)
        return {j.base.job_id for j in plan_jobs if j.must_run}

    assert must_run() == {"wide"}
    assert must_run(elastic_path_at_widest=False) == set()
    decision, _ = plan_for(jobs, 48)
    assert "wide" in decision.jobs and decision.width(wide) == 8
    decision, _ = plan_for(jobs, 48, elastic_path_at_widest=False)
    assert "wide" not in decision.jobs


def test_a_running_job_past_its_deadline_is_packed_before_a_waiting_one() -> None:
    # Both jobs are long past their fairness deadlines, the waiting one 50 s more: by
    # lateness alone it would take the running job's GPU (and both would pay a restart).
    running = elastic(
        active_job("run", epochs=100, epochs_done=10, arrival=50, executed_last_round=120)
    )
    waiting = elastic(active_job("wait", epochs=100, epochs_done=10, arrival=0))
    snap = snapshot([running, waiting], gpus=1, now=100_000)

    def first(**knobs: object) -> tuple[str, ...]:
        params = ShockwaveParams(planner=PlannerParams(rounds=10), **knobs)  # type: ignore[arg-type]
        return Shockwave().decide(snap, params).jobs

    assert first() == ("run",)
    assert first(elastic_running_credit_s=0) == ("wait",)


def test_srpt_all_packs_a_short_job_before_a_late_long_one() -> None:
    # A long job far past its fairness deadline and a short one that arrived later, on one
    # GPU, both planned rounds of the window: by default the later job waits behind the more
    # late one; with the "srpt-all" order the short one takes round 0.
    late = elastic(active_job("late", epochs=100, epochs_done=10, arrival=0))
    short = elastic(active_job("short", epochs=3, arrival=50_000))
    snap = snapshot([late, short], gpus=1, now=100_000)

    def first(**knobs: object) -> tuple[str, ...]:
        params = ShockwaveParams(planner=PlannerParams(rounds=10), **knobs)  # type: ignore[arg-type]
        return Shockwave().decide(snap, params).jobs

    assert first() == ("late",)
    assert first(elastic_order="srpt-all") == ("short",)
    with pytest.raises(ValueError, match="elastic_order"):
        ShockwaveParams(elastic_order="fifo")


@pytest.mark.parametrize(
    ("rigid", "knobs", "solves"),
    [
        (False, {}, 1),
        (False, {"elastic_replan": None}, 2),
        (True, {}, 2),
    ],
)
def test_an_elastic_plan_is_not_remade_on_every_arrival(
    rigid: bool, knobs: dict[str, object], solves: int
) -> None:
    # Re-planning on every arrival re-chooses every job's width and round, and each change is
    # a restart: with elastic jobs the plan is followed until it is 8 rounds old (or runs
    # out), arrivals wait for it or for idle GPUs. A rigid workload still re-plans at once.
    def make(job_id: str) -> ActiveJob:
        job = active_job(job_id, epochs=100)
        return job if rigid else elastic(job)

    params = ShockwaveParams(planner=PlannerParams(rounds=10), **knobs)  # type: ignore[arg-type]
    shockwave = Shockwave()
    first = shockwave.decide(snapshot([make("a"), make("b")], gpus=2), params)
    later = snapshot([make("a"), make("b"), make("c")], gpus=2, now=120.0, state=first.state)
    solve = shockwave.decide(later, params).solve
    assert solve is not None and solve.solves == solves


# -------------------------------------------------------------------------------- the simulator


def test_simulator_runs_a_job_at_its_width_speed() -> None:
    # 1,000 s of work on its requested GPU; on 4 GPUs at 3.2x it takes 312.5 s (+20 s restart).
    job = sim_job("a", [(32, 10, 100.0)])
    job = dataclasses.replace(
        job, spec=dataclasses.replace(job.spec, elastic=ElasticRange(1, 4, {4: {32: 3.2}}))
    )
    policy = get_policy("shockwave")
    result = simulate(workload(job), cluster(4), policy, make_params(policy), SimSettings())
    outcome = result.jobs[0]
    assert outcome.finish_s == pytest.approx(1000 / 3.2 + 20.0)
    # FTF stays against the requested count: t_exclusive is the one-GPU time.
    assert outcome.t_exclusive_s == pytest.approx(1000.0)
    assert sum(r.busy_gpu_seconds for r in result.rounds) == pytest.approx(4 * 1000 / 3.2)


class Widen:
    """Runs job ``a`` on ``width`` GPUs every round."""

    name: ClassVar[str] = "widen"
    Params: ClassVar[type[Any]] = dict

    def __init__(self, width: int) -> None:
        self.width = width

    def decide(self, snap: Snapshot, params: Any) -> Decision:
        return Decision(jobs=("a",), widths={"a": self.width})


def test_simulator_refuses_a_width_the_job_did_not_declare() -> None:
    job = sim_job("a", [(32, 10, 100.0)])
    with pytest.raises(PolicyContractError, match="2 GPUs"):
        simulate(workload(job), cluster(4), Widen(2), {}, SimSettings())


def test_a_change_of_count_is_a_restart() -> None:
    job = sim_job("a", [(32, 10, 100.0)])
    job = dataclasses.replace(
        job, spec=dataclasses.replace(job.spec, elastic=ElasticRange(1, 2, {2: {32: 2.0}}))
    )

    class Alternate(Widen):
        def decide(self, snap: Snapshot, params: Any) -> Decision:
            self.width = 3 - self.width
            return Decision(jobs=("a",), widths={"a": self.width})

    result = simulate(
        workload(job), cluster(2), Alternate(2), {}, SimSettings(mid_round_fills=False)
    )
    # Every round changes the count: every round pays the 20 s restart.
    assert result.jobs[0].restarts == len(result.rounds)


# --------------------------------------------------------------------------------------- Pollux


def test_pollux_runs_every_job_it_can_then_spreads_gpus_by_goodput() -> None:
    good = elastic(active_job("good", epochs=50), speedup={2: {10: 2.0}, 4: {10: 4.0}})
    poor = elastic(active_job("poor", epochs=50), speedup={2: {10: 1.1}, 4: {10: 1.2}})
    decision = Pollux().decide(snapshot([good, poor], gpus=6), PolluxParams())
    assert set(decision.jobs) == {"good", "poor"}
    assert decision.width(good) == 4
    assert decision.width(poor) == 2


def test_pollux_with_more_jobs_than_gpus_runs_one_gpu_each_first() -> None:
    jobs = [elastic(active_job(str(i), gpus=2, epochs=50)) for i in range(6)]
    decision = Pollux().decide(snapshot(jobs, gpus=4), PolluxParams())
    assert decision.jobs == ("0", "1", "2", "3")
    assert all(decision.width(j) == 1 for j in jobs if j.job_id in decision.jobs)


def test_pollux_keeps_running_jobs_first() -> None:
    waiting = active_job("old", epochs=50)
    running = active_job("new", epochs=50, arrival=10.0)
    progress = dataclasses.replace(running.progress, gpus=(0,))
    running = ActiveJob(spec=running.spec, progress=progress)
    decision = Pollux().decide(snapshot([waiting, running], gpus=1), PolluxParams())
    assert decision.jobs == ("new",)
    assert "old" in decision.reasons


def test_pollux_restart_penalty_keeps_a_count() -> None:
    # Running on 2 GPUs; 4 would be 1.05x faster, less than the 10% a restart costs.
    job = elastic(active_job("a", epochs=50), speedup={2: {10: 2.0}, 4: {10: 2.1}})
    job = ActiveJob(spec=job.spec, progress=JobProgress(batch_size=10, gpus=(0, 1)))
    decision = Pollux().decide(snapshot([job], gpus=4), PolluxParams())
    assert decision.width(job) == 2


@pytest.mark.parametrize("p", [0.0, 2.0])
def test_pollux_params_refuse_a_bad_exponent(p: float) -> None:
    with pytest.raises(ValueError, match="p must be"):
        PolluxParams(p=p)


# ------------------------------------------------------------------------------------------ SDK


def test_sdk_reads_the_world_size_and_its_change(tmp_path: Path) -> None:
    env = JobEnvironment.from_environ({"SHOCKWAVE_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0"})
    assert env.world_size == 2
    assert JobEnvironment.from_environ({"CUDA_VISIBLE_DEVICES": "0,1,2"}).world_size == 3
    assert JobEnvironment.from_environ({}).world_size is None
    with pytest.raises(InvalidEnvironment, match="SHOCKWAVE_WORLD_SIZE"):
        JobEnvironment.from_environ({"SHOCKWAVE_WORLD_SIZE": "0"})
    store = CheckpointStore(tmp_path)
    first = world_size_change(JobEnvironment(world_size=1), store)
    assert (first.previous, first.current, first.changed) == (None, 1, False)
    same = world_size_change(JobEnvironment(world_size=1), store)
    assert (same.previous, same.changed) == (1, False)
    grown = world_size_change(env, store)
    assert (grown.previous, grown.current, grown.changed) == (1, 2, True)
    assert grown.describe() == "world size 1 -> 2"


def test_an_explicit_replan_holds_for_elastic_jobs_too() -> None:
    params = ShockwaveParams()
    assert params.replan == "reactive" and params.elastic_replan == "lazy"
    given = apply_knobs(params, ShockwaveKnobs(replan="reactive"), None)
    assert given.replan == "reactive" and given.elastic_replan is None
    assert apply_knobs(params, ShockwaveKnobs(), None).elastic_replan == "lazy"
    with pytest.raises(ValueError, match="elastic_replan"):
        ShockwaveParams(elastic_replan="eager")
    # The service's cluster mode is explicit too.
    served = service_params(Shockwave(), replan="reactive", solver_time_limit_s=None)
    assert served.replan == "reactive" and served.elastic_replan is None
