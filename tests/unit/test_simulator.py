"""Simulator mechanics on hand-computed cases: rounds, restart overhead, regimes, metrics."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from shockwave.domain.model import AdaptationMode, Cluster
from shockwave.domain.snapshot import Snapshot
from shockwave.policies.policy import Decision, get_policy, make_params
from shockwave.prediction.predictor import PredictedRegime, Prediction
from shockwave.simulation.metrics import contention_ftf, reference_ftf, summarize
from shockwave.simulation.simulator import PolicyContractError, SimSettings, simulate
from tests.builders import cluster, sim_job, workload


class Recorder:
    """A policy that runs every job that fits, in arrival order, and keeps the snapshots."""

    name: ClassVar[str] = "recorder"
    Params: ClassVar[type[Any]] = dict

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        self.snapshots.append(snapshot)
        free = snapshot.cluster.total_gpus
        chosen = []
        for job in snapshot.jobs:
            if job.spec.gpus <= free:
                free -= job.spec.gpus
                chosen.append(job.job_id)
        return Decision(jobs=tuple(chosen))


def run(jobs: Any, gpus: int, **settings: Any) -> Any:
    """Simulate with the reference's mechanics (no mid-round fills) unless told otherwise."""
    settings.setdefault("mid_round_fills", False)
    return simulate(workload(*jobs), cluster(gpus), Recorder(), {}, SimSettings(**settings))


@pytest.mark.parametrize(
    ("seconds", "overhead", "finish"),
    [
        # 300 s of work: 100 useful (20 s restart) + 120 + 80 -> ends at 240 + 80.
        (300.0, 20.0, 320.0),
        # Fits in one round but needs more than round - guard: charged; the round ends when its
        # task does (118 s) and the remaining 20 s run next round.
        (118.0, 20.0, 118.0 + 20.0),
        # A short job (<= 115 s) is never charged.
        (100.0, 20.0, 100.0),
        (300.0, 0.0, 300.0),
    ],
)
def test_restart_overhead_rule(seconds: float, overhead: float, finish: float) -> None:
    result = run([sim_job("a", [(32, 10, seconds / 10)])], 1, restart_overhead_s=overhead)
    assert result.jobs[0].finish_s == pytest.approx(finish)
    assert result.makespan_s == pytest.approx(finish)


def test_two_jobs_fifo_on_one_gpu() -> None:
    result = run([sim_job("a", [(32, 4, 60.0)]), sim_job("b", [(32, 1, 100.0)])], 1)
    finishes = {j.job_id: j.finish_s for j in result.jobs}
    assert finishes == {"a": pytest.approx(260.0), "b": pytest.approx(360.0)}
    metrics = summarize(result)
    assert metrics.avg_jct_s == pytest.approx(310.0)
    assert metrics.utilization == pytest.approx(340.0 / 360.0)
    # Reference FTF: N_trace / G = 2 -> rho_b = 360 / (100 * 2).
    assert list(metrics.ftf) == [pytest.approx(260 / 480), pytest.approx(1.8)]
    assert metrics.worst_ftf == pytest.approx(1.8)
    assert metrics.unfair_fraction == pytest.approx(0.5)


def test_policy_sees_regimes_only_after_they_happen() -> None:
    job = sim_job("a", [(32, 2, 10.0), (64, 3, 5.0)])
    policy = Recorder()
    result = simulate(
        workload(job), cluster(1), policy, {}, SimSettings(round_seconds=15, restart_overhead_s=0)
    )
    assert result.jobs[0].finish_s == pytest.approx(35.0)
    seen = [s.jobs[0].progress for s in policy.snapshots]
    assert [p.batch_size for p in seen] == [32, 32, 64]
    assert [p.epochs_done for p in seen] == [pytest.approx(0), pytest.approx(1.5), pytest.approx(4)]
    assert seen[1].observed_regimes == ()
    assert [(r.batch_size, r.epochs) for r in seen[2].observed_regimes] == [(32, 2)]
    assert dict(seen[0].measured_epoch_seconds) == {}
    assert dict(seen[2].measured_epoch_seconds) == {32: 10.0, 64: 5.0}
    assert [p.executed_last_round_s for p in seen] == [0.0, pytest.approx(15), pytest.approx(15)]


@pytest.mark.parametrize("learn", [True, False])
def test_the_prior_holds_only_jobs_finished_before_each_round(learn: bool) -> None:
    jobs = [
        sim_job("short", [(32, 1, 50.0)]),
        sim_job("long", [(32, 2, 100.0), (64, 4, 50.0)], mode=AdaptationMode.GNS),
        sim_job("late", [(32, 3, 100.0)], arrival=500.0),
    ]
    policy = Recorder()
    result = simulate(workload(*jobs), cluster(2), policy, {}, SimSettings(learn_population=learn))
    finishes = {j.job_id: j.finish_s for j in result.jobs}
    for snapshot in policy.snapshots:
        done = sum(1 for f in finishes.values() if f is not None and f <= snapshot.now)
        assert snapshot.population.learnt == (done if learn else 0), snapshot.now
        active = {j.job_id for j in snapshot.jobs}
        assert not active & {k for k, f in finishes.items() if f and f <= snapshot.now}
    last = policy.snapshots[-1].population
    if learn:
        (template,) = last.group((AdaptationMode.GNS, "", 32))
        assert (template.batch_sizes, template.lengths) == ((32, 64), (2, 4))


def test_arrivals_are_admitted_at_round_boundaries() -> None:
    jobs = [sim_job("a", [(32, 10, 30.0)]), sim_job("b", [(32, 1, 50.0)], arrival=50.0)]
    policy = Recorder()
    result = simulate(workload(*jobs), cluster(2), policy, {}, SimSettings(mid_round_fills=False))
    assert [len(s.jobs) for s in policy.snapshots[:2]] == [1, 2]
    b = result.jobs[1]
    assert b.finish_s == pytest.approx(120.0 + 50.0)
    assert b.jct_s == pytest.approx(120.0)


def test_idle_cluster_jumps_to_next_arrival() -> None:
    jobs = [sim_job("a", [(32, 1, 50.0)]), sim_job("b", [(32, 1, 50.0)], arrival=1000.0)]
    result = run(jobs, 1)
    assert [j.finish_s for j in result.jobs] == [pytest.approx(50.0), pytest.approx(1050.0)]


def test_contention_ftf_uses_active_jobs_over_the_life() -> None:
    jobs = [sim_job(str(i), [(32, 2, 60.0)]) for i in range(3)]
    result = run(jobs, 1, restart_overhead_s=0)
    by_id = {j.job_id: j for j in result.jobs}
    # Job 2 waits two rounds with 3, then 2 active jobs, and runs its round alone: mean 2.
    assert by_id["2"].mean_active_jobs == pytest.approx(2.0)
    assert contention_ftf(by_id["2"], 1) == pytest.approx(360.0 / (120.0 * 2.0))
    assert reference_ftf(by_id["2"], 3, 1) == pytest.approx(360.0 / (120.0 * 3.0))


def test_makespan_lower_bound() -> None:
    w = workload(sim_job("a", [(32, 1, 100.0)]), sim_job("b", [(32, 3, 100.0)], arrival=50.0))
    assert w.makespan_lower_bound(2) == pytest.approx(350.0)
    assert w.makespan_lower_bound(1) == pytest.approx(400.0)


def test_decision_naming_an_unknown_job_is_a_contract_error() -> None:
    class Rogue(Recorder):
        def decide(self, snapshot: Snapshot, params: Any) -> Decision:
            return Decision(jobs=("ghost",))

    with pytest.raises(PolicyContractError, match="ghost"):
        simulate(workload(sim_job("a", [(32, 1, 10.0)])), cluster(1), Rogue(), {})


def test_decision_over_capacity_is_a_contract_error() -> None:
    class Greedy(Recorder):
        def decide(self, snapshot: Snapshot, params: Any) -> Decision:
            return Decision(jobs=tuple(j.job_id for j in snapshot.jobs))

    jobs = [sim_job("a", [(32, 1, 10.0)]), sim_job("b", [(32, 1, 10.0)])]
    with pytest.raises(PolicyContractError, match="2 GPUs"):
        simulate(workload(*jobs), cluster(1), Greedy(), {})


def test_timer_measures_each_decision() -> None:
    ticks = iter(range(1000))
    result = simulate(
        workload(sim_job("a", [(32, 3, 100.0)])),
        cluster(1),
        Recorder(),
        {},
        timer=lambda: float(next(ticks)),
    )
    assert [r.decision_seconds for r in result.rounds] == [1.0] * len(result.rounds)
    assert summarize(result).decision_seconds.median == 1.0


@pytest.mark.parametrize(
    "name", ["fifo", "gavel", "mst", "themis", "allox", "gandiva_fair", "ossp"]
)
def test_every_baseline_finishes_a_mixed_workload(name: str) -> None:
    jobs = [
        sim_job(
            str(i),
            [(32, 2 + i % 3, 40.0 + 7 * i), (64, 1 + i % 2, 30.0)],
            gpus=(1, 2, 4)[i % 3],
            arrival=60.0 * i,
        )
        for i in range(12)
    ]
    w = workload(*jobs)
    policy = get_policy(name)
    result = simulate(w, cluster(8, 4), policy, make_params(policy))
    assert result.completed == 12
    assert result.makespan_s >= w.makespan_lower_bound(8) - 1e-6
    for r in result.rounds:
        used = [g for gpus in r.assignment.values() for g in gpus]
        assert len(used) == len(set(used)) <= 8


def test_a_gpu_freed_mid_round_starts_a_waiting_job_at_once() -> None:
    jobs = [sim_job("a", [(32, 1, 30.0)]), sim_job("b", [(32, 1, 50.0)])]
    result = run(jobs, 1, mid_round_fills=True)
    # b starts when a finishes (30 s), not at the boundary (120 s); a 50 s stretch in a 90 s
    # lease is short, so (as at a boundary) no restart is charged.
    assert [j.finish_s for j in result.jobs] == [pytest.approx(30.0), pytest.approx(80.0)]
    assert result.rounds[0].fills == {"b": (0,)}
    assert result.notes["fills"] == 1


def test_an_arrival_on_free_gpus_starts_at_once() -> None:
    jobs = [sim_job("a", [(32, 10, 30.0)]), sim_job("b", [(32, 1, 50.0)], arrival=50.0)]
    result = run(jobs, 2, mid_round_fills=True)
    assert result.jobs[1].finish_s == pytest.approx(100.0)
    assert result.jobs[1].jct_s == pytest.approx(50.0)


def test_no_gpu_idles_on_mixed_nodes_while_a_fitting_job_waits() -> None:
    # 2 nodes of 8, 3 of 4 and 2 of 2 GPUs (32 in all): 32 GPUs' worth of gangs of every width
    # run together in the first round, whatever node each lands on.
    nodes = Cluster.parse("2x8,3x4,2x2")
    widths = [8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    jobs = [sim_job(f"j{i}", [(32, 2, 60.0)], gpus=w) for i, w in enumerate(widths)]
    result = simulate(workload(*jobs), nodes, Recorder(), {}, SimSettings())
    first = result.rounds[0].assignment
    assert set(first) == {f"j{i}" for i in range(len(widths))}
    used = [g for gpus in first.values() for g in gpus]
    assert sorted(used) == list(range(32))


class PlansAhead(Recorder):
    """Plans the same jobs for the next three rounds too."""

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        jobs = super().decide(snapshot, params).jobs
        return Decision(jobs=jobs, planned=(jobs, jobs, jobs))


@pytest.mark.parametrize("latency", [0.0, 60.0, 500.0])
def test_plan_latency_uses_previous_plans_and_the_fallback(latency: float) -> None:
    jobs = [sim_job(str(i), [(32, 4, 60.0)], arrival=40.0 * i) for i in range(6)]
    settings = SimSettings(plan_latency_s=latency)
    result = simulate(workload(*jobs), cluster(2), PlansAhead(), {}, settings)
    assert result.completed == 6
    sources = result.notes["sources"]
    assert sum(sources.values()) == len(result.rounds)
    if latency == 0:
        assert sources["plan"] == len(result.rounds)
    else:
        # A plan is never usable at the boundary it was asked at: the first round falls back,
        # later ones take the plan of a round before (fresh only while the state stays put).
        assert result.rounds[0].source == "greedy"
        assert sources["previous_plan"] > 0 if latency < 120 else sources["greedy"] > 1


@pytest.mark.parametrize("name", ["gavel", "shockwave"])
def test_on_mixed_nodes_no_gpu_idles_at_a_boundary_while_a_job_that_fits_waits(name: str) -> None:
    nodes = Cluster.parse("2x8,3x4,2x2")
    jobs = [
        sim_job(
            str(i),
            [(32, 2 + i % 4, 50.0 + 13 * (i % 7))],
            gpus=(8, 4, 2, 1)[i % 4],
            arrival=25.0 * i,
        )
        for i in range(32)
    ]
    policy = get_policy(name)
    result = simulate(workload(*jobs), nodes, policy, make_params(policy))
    assert result.completed == len(jobs)
    for r in result.rounds:
        used = sum(len(gpus) for gpus in r.assignment.values())
        waiting = [
            j
            for j in result.jobs
            if j.arrival_s <= r.start_s
            and j.finish_s is not None
            and j.finish_s > r.start_s
            and j.job_id not in r.assignment
        ]
        assert all(j.gpus > nodes.total_gpus - used for j in waiting), (r.index, used, waiting)


def test_batch_size_changes_are_noted_when_they_happen() -> None:
    """A job whose trajectory changes batch size notes each change at the simulated time it
    crossed the regime boundary: alone on the cluster, 2 epochs of 10 s at 16, then 32."""
    job = sim_job("j", [(16, 2, 10.0), (32, 3, 5.0), (64, 1, 2.0)], mode=AdaptationMode.GNS)
    settings = SimSettings(round_seconds=7.0, restart_overhead_s=0.0)
    result = simulate(
        workload(job), cluster(1), get_policy("fifo"), make_params(get_policy("fifo")), settings
    )
    (outcome,) = result.jobs
    assert [size for _, size in outcome.scalings] == [32, 64]
    assert [moment for moment, _ in outcome.scalings] == pytest.approx([20.0, 35.0])
    assert outcome.finish_s == pytest.approx(37.0)


class StaticGuess(Recorder):
    """Runs every job that fits, and reads for each job the prediction that it never changes
    batch size again (whole epochs at its current size and declared speed)."""

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        decision = super().decide(snapshot, params)
        guesses = {
            job.job_id: Prediction(
                regimes=(
                    PredictedRegime(
                        job.progress.batch_size,
                        float(job.spec.epochs),
                        job.spec.samples_per_epoch
                        / job.spec.throughput.samples_per_second[job.progress.batch_size],
                    ),
                ),
                current=0,
                epochs_done=job.progress.epochs_done,
                total_epochs=job.spec.epochs,
            )
            for job in snapshot.jobs
        }
        return Decision(jobs=decision.jobs, predictions=guesses)


def test_predictions_are_scored_against_the_truth_at_each_decision_that_reads_them() -> None:
    # An accordion job: 20 epochs at 32 (2 s each), then 80 at 128 (1 s each): 120 s alone.
    # Read at 32 as "100 epochs at 32" (200 s): regime error (|100 - 20| + |0 - 80|) / 2 / 100
    # = 0.8, run-time accuracy 1 - 80 / 120. A static job's reads are not scored (the
    # progress grid scores dynamic jobs only). Every read of the accordion job counts.
    adaptive = sim_job("acc", [(32, 20, 2.0), (128, 80, 1.0)], mode=AdaptationMode.ACCORDION)
    static = sim_job("static", [(32, 10, 1.0)])
    policy = StaticGuess()

    result = simulate(
        workload(adaptive, static),
        cluster(2),
        policy,
        {},
        SimSettings(round_seconds=30, restart_overhead_s=0),
    )

    at_use = result.notes["predictions"]
    reads_at_32 = sum(
        1
        for s in policy.snapshots
        for j in s.jobs
        if j.job_id == "acc" and j.progress.batch_size == 32
    )
    assert at_use.uses == sum(1 for s in policy.snapshots if any(j.job_id == "acc" for j in s.jobs))
    assert reads_at_32 >= 1 and at_use.uses > reads_at_32, "read before and after its switch"
    # once at 128 the guess is "100 epochs at 128": |100 - 20| + |0 - 80| again, 100 s
    assert at_use.mean().regime_error == pytest.approx(0.8)
    expected = (reads_at_32 * (1 - 80 / 120) + (at_use.uses - reads_at_32) * (1 - 20 / 120)) / (
        at_use.uses
    )
    assert at_use.mean().runtime_accuracy == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "overrides", "reads"),
    [("shockwave", {"oracle": True}, True), ("fifo", {}, False)],
)
def test_a_policy_that_predicts_reports_its_reads_and_the_oracle_scores_perfectly(
    name: str, overrides: dict[str, Any], reads: bool
) -> None:
    # Shockwave planning with the true trajectories reads them at every use: error 0,
    # accuracy 1. FIFO predicts nothing and reports no read.
    jobs = [
        sim_job(f"j{i}", [(32, 5, 30.0), (64, 10, 20.0)], mode=AdaptationMode.GNS) for i in range(4)
    ]
    policy = get_policy(name)
    result = simulate(
        workload(*jobs),
        cluster(2),
        policy,
        make_params(policy, overrides),
        SimSettings(reveal_trajectories=True),
    )

    at_use = result.notes["predictions"]
    assert (at_use.uses > 0) is reads
    if reads:
        assert at_use.mean().regime_error == pytest.approx(0.0)
        assert at_use.mean().runtime_accuracy == pytest.approx(1.0)
