"""Typed clusters: parsing, speeds, the shared yardsticks, gangs on one type, the typed policies."""

from __future__ import annotations

import dataclasses

import pytest

from shockwave.domain.model import Cluster, ThroughputProfile, ValidationError
from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.market import heterogeneity as het
from shockwave.policies.gavel_family.gavel_typed import TypedPriorityState, max_min_fairness_perf
from shockwave.policies.policy import get_policy, make_params
from shockwave.policies.shockwave_market.shockwave_typed import assign_types
from shockwave.rounds.placement import place, place_into
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.workload import Workload
from tests.builders import SAMPLES, sim_job, workload

TYPED = Cluster((4, 4, 2, 2), ("fast", "fast", "slow", "slow"))


@pytest.mark.parametrize(
    ("text", "per_node", "sizes", "kinds"),
    [
        ("v100:8,k80:4", 4, (4, 4, 4), ("v100", "v100", "k80")),
        ("V100:2", 2, (2,), ("v100",)),
    ],
)
def test_parse_typed_gpus(
    text: str, per_node: int, sizes: tuple[int, ...], kinds: tuple[str, ...]
) -> None:
    parsed = het.parse_typed_gpus(text, per_node)
    assert parsed.node_gpus == sizes
    assert parsed.node_types == kinds


@pytest.mark.parametrize("text", ["v100", "v100:6", "v100:4,v100:4", ":4", "v100:x"])
def test_parse_typed_gpus_refuses_bad_input(text: str) -> None:
    with pytest.raises(ValidationError) as error:
        het.parse_typed_gpus(text, 4)
    assert error.value.field == "gpus"


def test_typed_nodes_and_cluster_checks() -> None:
    parsed = het.parse_typed_nodes("1x8:v100,2x4:k80")
    assert parsed.node_gpus == (8, 4, 4)
    assert parsed.gpus_of_type("k80") == 8
    assert parsed.type_of(8) == "k80"
    assert parsed.gpu_types == ("v100", "k80")
    with pytest.raises(ValidationError):
        Cluster((4, 4), ("v100",))
    assert not Cluster((4,)).is_typed and Cluster((4,)).type_of(0) == ""


def _two_type_job(job_id: str, fast: float, slow: float, *, gpus: int = 1) -> ActiveJob:
    """A job whose reference rate is 1 epoch per 100 s, ``fast``/``slow`` times that on the
    two types of :data:`TYPED`."""
    sim = sim_job(job_id, [(32, 10, 100.0)], gpus=gpus)
    ref = sim.spec.throughput.samples_per_second[32]
    spec = dataclasses.replace(
        sim.spec,
        type_throughput={
            "fast": ThroughputProfile({32: ref * fast}),
            "slow": ThroughputProfile({32: ref * slow}),
        },
    )
    return ActiveJob(spec, JobProgress(batch_size=32))


def test_speed_declared_measured_and_unknown() -> None:
    job = _two_type_job("a", 2.0, 0.5)
    assert het.type_speed(job, "fast") == pytest.approx(2.0)
    assert het.type_speed(job, "other") == 1.0
    measured = dataclasses.replace(job.progress, measured_by_type={"slow": {32: 400.0}})
    assert het.type_speed(ActiveJob(job.spec, measured), "slow") == pytest.approx(0.25)
    assert het.mean_speed(job, TYPED) == pytest.approx((8 * 2.0 + 4 * 0.5) / 12)


def test_exclusive_time_is_on_the_average_gpu() -> None:
    sim = sim_job("a", [(32, 10, 100.0)])
    typed = het.typed_job(
        sim,
        {"fast": ThroughputProfile({32: 20.0}), "slow": ThroughputProfile({32: 5.0})},
        "ref",
    )
    assert het.true_epoch_seconds(typed, "fast", 32) == pytest.approx(50.0)
    assert het.true_epoch_seconds(typed, "slow", 32) == pytest.approx(200.0)
    rate = 8 / 12 / 50.0 + 4 / 12 / 200.0
    assert het.t_exclusive_s(typed, TYPED) == pytest.approx(10 / rate)
    assert het.t_exclusive_s(typed, Cluster((4,))) == pytest.approx(1000.0)


def test_placement_keeps_a_gang_on_one_type() -> None:
    placed = place(TYPED, [("a", 2), ("b", 4), ("c", 4), ("d", 2)], {}, {"a": "slow"})
    kinds = {j: {TYPED.type_of(g) for g in gpus} for j, gpus in placed.assignment.items()}
    assert all(len(k) == 1 for k in kinds.values())
    assert kinds["a"] == {"slow"}
    assert set(placed.assignment) == {"a", "b", "c", "d"}
    # 2 fast + 2 slow GPUs free: a 4-GPU gang fits by count but on no single type.
    busy = [0, 1, 2, 3, 4, 5, 8, 9]
    fill = place_into(TYPED, [("e", 4), ("f", 2)], busy)
    assert "e" in fill.unplaced and "f" in fill.assignment


def test_placement_keeps_a_lease_unless_planned_elsewhere() -> None:
    held = {"a": (8, 9)}
    assert place(TYPED, [("a", 2)], held, {}).assignment["a"] == (8, 9)
    moved = place(TYPED, [("a", 2)], held, {"a": "fast"})
    assert {TYPED.type_of(g) for g in moved.assignment["a"]} == {"fast"}
    assert moved.moved == frozenset({"a"})


def test_max_min_fairness_perf_equalises_normalised_throughput() -> None:
    speed = {"a": {"fast": 4.0, "slow": 1.0}, "b": {"fast": 1.0, "slow": 1.0}}
    workers = {"fast": 1, "slow": 1}
    x = max_min_fairness_perf(speed, {"a": 1, "b": 1}, {"a": 1.0, "b": 1.0}, workers)
    for t, m in workers.items():
        assert sum(x[j][t] for j in x) <= m + 1e-6
    norm = {
        j: sum(speed[j][t] * x[j][t] for t in workers)
        / sum(speed[j][t] * workers[t] / 2 for t in workers)
        for j in x
    }
    # b cannot beat its equal share (1); among the max-min optima, a takes the fast GPU.
    assert norm["b"] == pytest.approx(1.0, rel=1e-4)
    assert norm["a"] == pytest.approx(1.6, rel=1e-4)
    assert x["a"]["fast"] == pytest.approx(1.0, abs=1e-4)


def test_type_prices_follow_comparative_advantage() -> None:
    remaining = {"a": {"fast": 100.0, "slow": 1000.0}, "b": {"fast": 100.0, "slow": 120.0}}
    types, makespan = assign_types(remaining, {"a": 1, "b": 1}, {"fast": 1, "slow": 1})
    assert types == {"a": "fast", "b": "slow"}
    assert makespan == pytest.approx(120.0)


def _typed_workload() -> Workload:
    jobs = []
    for i in range(8):
        sim = sim_job(str(i), [(32, 4 + i % 3, 60.0)], gpus=(1, 2, 4)[i % 3], arrival=30.0 * i)
        slow = 0.25 if i % 2 else 0.8
        jobs.append(
            het.typed_job(
                sim,
                {
                    "fast": ThroughputProfile({32: SAMPLES / 60.0}),
                    "slow": ThroughputProfile({32: SAMPLES / 60.0 * slow}),
                },
                "fast",
            )
        )
    return workload(*jobs)


@pytest.mark.parametrize("policy", ["shockwave", "gavel", "fifo"])
@pytest.mark.parametrize("agnostic", [False, True])
def test_simulated_gangs_stay_on_one_type(policy: str, agnostic: bool) -> None:
    chosen = get_policy(policy)
    settings = SimSettings(heterogeneity_agnostic=agnostic)
    result = simulate(_typed_workload(), TYPED, chosen, make_params(chosen), settings)
    assert result.completed == 8
    for record in result.rounds:
        for gpus in (*record.assignment.values(), *record.fills.values()):
            assert len({TYPED.type_of(g) for g in gpus}) == 1


def test_a_job_runs_at_its_speed_on_the_type_it_lands_on() -> None:
    sim = het.typed_job(
        sim_job("a", [(32, 10, 60.0)]), {"slow": ThroughputProfile({32: SAMPLES / 240.0})}, "fast"
    )
    only_slow = Cluster((1,), ("slow",))
    fifo = get_policy("fifo")
    result = simulate(workload(sim), only_slow, fifo, make_params(fifo))
    assert result.jobs[0].finish_s == pytest.approx(10 * 240.0 + 20.0)
    assert result.jobs[0].t_exclusive_s == pytest.approx(2400.0)


def test_agnostic_view_forgets_types() -> None:
    job = _two_type_job("a", 2.0, 0.5)
    snap = Snapshot(0.0, 0, 120.0, TYPED, (job,))
    seen = het.agnostic_view(snap)
    assert not seen.cluster.is_typed and seen.cluster.total_gpus == 12
    assert het.type_speed(seen.jobs[0], "fast") == 1.0


def test_perf_with_equal_throughputs_is_the_agnostic_equal_gpu_share() -> None:
    """Published Gavel's ``max_min_fairness`` is ``max_min_fairness_perf`` with every
    throughput 1: an equal GPU share, which the untyped ``gavel`` computes by water-filling."""
    from shockwave.policies.gavel_family.gavel import water_fill

    widths = {"a": 1, "b": 2, "c": 1, "d": 4}
    ones = {j: {"x": 1.0, "y": 1.0} for j in widths}
    x = max_min_fairness_perf(ones, widths, dict.fromkeys(widths, 1.0), {"x": 2, "y": 2})
    shares = water_fill({j: float(w) for j, w in widths.items()}, dict.fromkeys(widths, 1.0), 4)
    for j, w in widths.items():
        assert sum(x[j].values()) * w == pytest.approx(shares[j], abs=1e-4)


def test_a_gang_no_type_holds_is_left_out_and_the_others_are_planned() -> None:
    wide = _two_type_job("wide", 1.0, 1.0, gpus=8)
    narrow = _two_type_job("narrow", 2.0, 0.5)
    small = Cluster((4, 2), ("fast", "slow"))
    policy = get_policy("shockwave")
    decision = policy.decide(Snapshot(0.0, 0, 120.0, small, (wide, narrow)), make_params(policy))
    assert decision.jobs == ("narrow",) and decision.types["narrow"] == "fast"
    assert "wide" not in decision.types


def _typed_round(jobs: tuple[ActiveJob, ...], index: int, state: object | None) -> Snapshot:
    """The snapshot of round ``index`` (120 s rounds) of ``jobs`` on :data:`TYPED`."""
    return Snapshot(
        now=120.0 * index, round_index=index, round_seconds=120.0, cluster=TYPED,
        jobs=jobs, policy_state=state,
    )  # fmt: skip


def test_typed_gavel_decides_a_round_again_as_if_once() -> None:
    """Typed Gavel keeps the untyped mechanism's round rule (time_fraction): a second plan of
    the same round, with a job that arrived in between, is the one decision made at the
    round's start with both jobs; its received time is not counted twice."""
    gavel = get_policy("gavel")
    params = make_params(gavel)
    a, b = _two_type_job("a", 2.0, 0.5), _two_type_job("b", 1.5, 1.0)

    first = gavel.decide(_typed_round((a,), 0, None), params)
    ran = dataclasses.replace(a, progress=dataclasses.replace(a.progress, gpus=(0,)))
    ran = dataclasses.replace(
        ran, progress=dataclasses.replace(ran.progress, executed_last_round_s=120.0)
    )
    early = gavel.decide(_typed_round((ran,), 1, first.state), params)
    again = gavel.decide(_typed_round((ran, b), 1, early.state), params)
    once = gavel.decide(_typed_round((ran, b), 1, first.state), params)
    assert again.jobs == once.jobs and again.types == once.types
    got, want, start = again.state, once.state, first.state
    assert isinstance(got, TypedPriorityState) and isinstance(want, TypedPriorityState)
    assert isinstance(start, TypedPriorityState)
    assert got == dataclasses.replace(want, before=got.before)
    assert got.before == dataclasses.replace(start, before=None)
    assert got.received["a"] == want.received["a"]


def test_typed_gavel_counts_a_late_arrival_in_the_recompute_it_arrived_before() -> None:
    """The untyped mechanism's late-arrival rule (time_fraction.late_arrivals): b arrived at
    110 s, before the recompute at 120 s, but the shell decided round 1 without it; the next
    decision solves that recompute again with b, at 120 s, as if b had been in it."""
    gavel = get_policy("gavel")
    params = make_params(gavel)

    def arrived(job: ActiveJob, at: float) -> ActiveJob:
        return dataclasses.replace(job, spec=dataclasses.replace(job.spec, arrival_s=at))

    a = arrived(_two_type_job("a", 2.0, 0.5), 0.0)
    c = arrived(_two_type_job("c", 1.5, 1.0, gpus=2), 60.0)
    b = arrived(_two_type_job("b", 1.0, 1.0, gpus=4), 110.0)

    first = gavel.decide(_typed_round((a,), 0, None), params)
    without_b = gavel.decide(_typed_round((a, c), 1, first.state), params)
    with_b = gavel.decide(_typed_round((a, c, b), 1, first.state), params)
    late = gavel.decide(_typed_round((a, c, b), 2, without_b.state), params)
    got, want = late.state, with_b.state
    assert isinstance(got, TypedPriorityState) and isinstance(want, TypedPriorityState)
    assert got.recomputed_at == want.recomputed_at == 120.0
    assert got.job_set == {"a", "b", "c"}
    assert "b" not in without_b.allocation
    assert late.allocation == pytest.approx(dict(with_b.allocation))
    assert got.deficit == want.deficit


def test_typed_gavel_state_stays_flat_over_many_rounds_without_a_recompute() -> None:
    """The allocation handed from round to round is copied, not wrapped again: thousands of
    rounds between recomputes (a long job alone on the cluster) must not nest the state."""
    gavel = get_policy("gavel")
    params = make_params(gavel)
    job = _two_type_job("a", 2.0, 0.5)
    state: object | None = None
    for index in range(1500):
        decision = gavel.decide(_typed_round((job,), index, state), params)
        state = decision.state
    assert decision.jobs == ("a",)
    assert isinstance(state, TypedPriorityState)
    assert type(dict(state.allocation["a"])) is dict
    assert state.allocation["a"].get("fast", 0.0) == pytest.approx(1.0)
