"""The core's round engine: which plan a boundary takes, the changes it returns, mid-round fills,
nodes of different sizes and jobs that cannot fit."""

from __future__ import annotations

import pytest

from shockwave.domain.model import Cluster, ValidationError
from shockwave.rounds.engine import (
    ChangeKind,
    Plan,
    RoundChanges,
    Waiting,
    boundary,
    choose_plan,
    fill,
    unfit_reason,
)

MIXED = Cluster.parse("2x8,3x4,2x2")


def kinds(changes: RoundChanges) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for change in changes.changes:
        out.setdefault(change.kind.value, []).append(change.job_id)
    return out


def test_cluster_parse_and_numbering() -> None:
    assert MIXED.node_gpus == (8, 8, 4, 4, 4, 2, 2)
    assert (MIXED.nodes, MIXED.total_gpus, MIXED.largest_node) == (7, 32, 8)
    assert [MIXED.first_gpu(n) for n in range(7)] == [0, 8, 16, 20, 24, 28, 30]
    assert (MIXED.node_of(15), MIXED.node_of(16), MIXED.node_of(31)) == (1, 2, 6)
    assert MIXED.describe() == "2x8 + 3x4 + 2x2"
    assert Cluster.of_gpus(32, 4) == Cluster.uniform(8, 4)
    with pytest.raises(ValidationError, match="COUNTxGPUS"):
        Cluster.parse("2x8,four")


def test_the_freshest_usable_plan_wins() -> None:
    old = Plan(0, (("a",), ("a",), ("a",)), state_version=1, usable_from=0.0)
    new = Plan(1, (("b",), ("b",)), state_version=2, usable_from=10.0)
    assert choose_plan([old, new], 1, now=5.0) is old, "the new plan is not back yet"
    assert choose_plan([old, new], 1, now=10.0) is new
    assert choose_plan([old, new], 3, now=10.0) is None, "no plan covers round 3"


def test_boundary_sources_extend_issue_and_revoke() -> None:
    cluster = Cluster.uniform(2, 4)
    jobs = [Waiting("a", 4), Waiting("b", 2), Waiting("c", 2), Waiting("d", 4)]
    plan = Plan(5, (("a", "b"),), state_version=7, usable_from=0.0, plan_id=12)
    leases = {"a": (0, 1, 2, 3), "c": (4, 5)}
    fresh = boundary(
        r=5, now=1.0, state_version=7, jobs=jobs, plans=[plan], leases=leases, cluster=cluster
    )
    assert fresh.source == "plan" and list(fresh.assignment) == ["a", "b"]
    assert kinds(fresh) == {"revoke": ["c"], "extend": ["a"], "issue": ["b"]}
    assert "plan 12, column 0" in fresh.changes[0].reason
    stale = boundary(
        r=5, now=1.0, state_version=8, jobs=jobs, plans=[plan], leases=leases, cluster=cluster
    )
    assert stale.source == "previous_plan"
    assert list(stale.assignment) == ["a", "b", "c"], "a stale column is filled in arrival order"
    assert kinds(stale)["extend"] == ["a", "c"]
    greedy = boundary(
        r=6, now=1.0, state_version=8, jobs=jobs, plans=[], leases={}, cluster=cluster
    )
    assert greedy.source == "greedy" and list(greedy.assignment) == ["a", "b", "c"]


def test_a_late_plan_repeats_the_latest_decision_rather_than_going_first_in_first_out() -> None:
    """A one-round plan (Gavel's) for round 5 and none yet for round 6: the boundary repeats
    its column (the policy's latest decision), filled up running jobs first; first in, first
    out would preempt ``d`` and ``b`` for ``c``, and the next plan would put them back."""
    cluster = Cluster.uniform(2, 4)
    jobs = [Waiting("a", 4), Waiting("c", 4), Waiting("b", 2), Waiting("d", 2)]
    one_round = Plan(5, (("d", "b"),), state_version=7, usable_from=0.0, plan_id=12)
    not_back = Plan(6, (("c",),), state_version=8, usable_from=9.0)
    leases = {"d": (4, 5), "b": (6, 7), "a": (0, 1, 2, 3)}
    out = boundary(
        r=6,
        now=1.0,
        state_version=8,
        jobs=jobs,
        plans=[one_round, not_back],
        leases=leases,
        cluster=cluster,
    )
    assert out.source == "previous_plan" and out.plan is one_round
    assert list(out.assignment) == ["d", "b", "a"]
    assert kinds(out) == {"extend": ["d", "b", "a"]}
    assert "previous plan 12, column 0" in out.changes[0].reason
    assert out.waiting["c"].startswith("waits: not in round 6")


def test_a_stale_or_later_column_keeps_the_running_fillers_before_arrival_order() -> None:
    """The policy filled its first column itself (Shockwave: most work left, here ``long``);
    a later column or a previous plan's names only the planned jobs. Filled up in arrival
    order, it preempted the running filler for ``early`` for a round (two restarts)."""
    cluster = Cluster.uniform(2, 4)
    jobs = [Waiting("a", 4), Waiting("early", 2), Waiting("long", 4)]
    plan = Plan(5, (("a", "long"), ("a",)), state_version=7, usable_from=0.0)
    leases = {"a": (0, 1, 2, 3), "long": (4, 5, 6, 7)}
    for r, version, source in ((6, 7, "plan"), (5, 8, "previous_plan")):
        out = boundary(
            r=r,
            now=1.0,
            state_version=version,
            jobs=jobs,
            plans=[plan],
            leases=leases,
            cluster=cluster,
        )
        assert out.source == source
        assert list(out.assignment) == ["a", "long"], "the running filler, not arrival order"
        assert kinds(out) == {"extend": ["a", "long"]}
    fresh_jobs = [*jobs[:2], Waiting("other", 2)]
    out = boundary(
        r=6,
        now=1.0,
        state_version=7,
        jobs=fresh_jobs,
        plans=[plan],
        leases={"a": (0, 1, 2, 3)},
        cluster=cluster,
    )
    assert list(out.assignment) == ["a", "early", "other"], "nobody running: arrival order"


def test_conserve_gives_free_gpus_to_waiting_jobs_the_next_column_first() -> None:
    cluster = Cluster.uniform(2, 4)
    jobs = [Waiting("a", 4), Waiting("b", 2), Waiting("c", 2), Waiting("d", 2)]
    plan = Plan(0, (("a",), ("d",)), state_version=1, usable_from=0.0)
    out = boundary(
        r=0,
        now=0.0,
        state_version=1,
        jobs=jobs,
        plans=[plan],
        leases={},
        cluster=cluster,
        conserve=True,
    )
    assert list(out.assignment) == ["a", "d", "b"]
    assert "work conservation" in next(c.reason for c in out.changes if c.job_id == "d")
    assert set(out.waiting) == {"c"}


def test_no_ready_node_revokes_everything() -> None:
    out = boundary(
        r=1,
        now=0.0,
        state_version=1,
        jobs=[Waiting("a", 1)],
        plans=[],
        leases={"a": (0,)},
        cluster=None,
    )
    assert kinds(out) == {"revoke": ["a"]} and "no ready node" in out.changes[0].reason


def test_mixed_nodes_leave_no_gpu_idle_while_a_fitting_job_waits() -> None:
    widths = [8, 8, 4, 4, 4, 2, 1, 1]
    jobs = [Waiting(f"j{i}", w) for i, w in enumerate(widths)]
    out = boundary(r=0, now=0.0, state_version=0, jobs=jobs, plans=[], leases={}, cluster=MIXED)
    used = sorted(g for gpus in out.assignment.values() for g in gpus)
    assert used == list(range(32))
    for job_id in ("j0", "j1"):
        assert {MIXED.node_of(g) for g in out.assignment[job_id]} in ({0}, {1})


def test_fill_starts_waiting_jobs_on_free_gpus_without_moving_anyone() -> None:
    leases = {"a": tuple(range(8)), "b": (16, 17, 18, 19)}
    jobs = [Waiting("a", 8), Waiting("b", 4), Waiting("w", 8), Waiting("x", 2), Waiting("y", 1)]
    out = fill(jobs=jobs, leases=leases, cluster=MIXED, prefer=("y",), busy=(30, 31))
    assert out.source == "fill" and list(out.assignment) == ["y", "w", "x"]
    taken = {g for gpus in out.assignment.values() for g in gpus}
    assert not taken & ({*leases["a"], *leases["b"], 30, 31})
    assert set(out.assignment["w"]) == set(range(8, 16)), "the free 8-GPU node, whole"
    assert all(c.kind is ChangeKind.ISSUE for c in out.changes)


def test_a_job_wider_than_the_inventory_waits_with_a_reason_and_holds_no_one_up() -> None:
    cluster = Cluster.uniform(1, 4)
    jobs = [Waiting("wide", 8), Waiting("small", 1)]
    plan = Plan(0, (("wide", "small"),), state_version=0, usable_from=0.0)
    out = boundary(
        r=0, now=0.0, state_version=0, jobs=jobs, plans=[plan], leases={}, cluster=cluster
    )
    assert list(out.assignment) == ["small"]
    assert out.unfit["wide"] == "not enough READY GPUs: it needs 8, the READY nodes have 4"
    assert fill(jobs=jobs, leases={}, cluster=cluster).unfit.keys() == {"wide"}
    assert unfit_reason(4, cluster) is None


def test_every_job_of_a_width_gets_that_widths_reason() -> None:
    cluster = Cluster.uniform(2, 4)
    jobs = [Waiting("a", 16), Waiting("b", 1), Waiting("c", 16), Waiting("d", 12)]
    out = fill(jobs=jobs, leases={}, cluster=cluster)
    assert out.unfit == {
        "a": unfit_reason(16, cluster),
        "c": unfit_reason(16, cluster),
        "d": unfit_reason(12, cluster),
    }
    assert out.unfit["d"] == "not enough READY GPUs: it needs 12, the READY nodes have 8"
