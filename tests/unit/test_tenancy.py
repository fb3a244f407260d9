"""Tenants: hierarchical water filling, job budgets, the market view, limits in the engine."""

from __future__ import annotations

import math

import pytest

from shockwave.domain.model import Cluster, JobSpec, ValidationError
from shockwave.domain.tenancy import (
    AT_LIMIT,
    AT_SHARE,
    Tenant,
    entitlements,
    job_budgets,
    limit_column,
    market,
    owed_after,
    share_order,
    share_quotas,
    share_round,
    water_fill_floors,
    within_caps,
)
from shockwave.rounds import engine
from shockwave.rounds.engine import Plan, Waiting

A, B, C = "a", "b", "c"


def _t(path: str, **kw: object) -> Tenant:
    return Tenant(path, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "tenants", "demand", "capacity", "expected"),
    [
        ("equal weights split evenly", {}, {A: 100, B: 100}, 32, {A: 16, B: 16}),
        ("weights 3:1", {A: _t(A, weight=3)}, {A: 100, B: 100}, 32, {A: 24, B: 8}),
        ("idle share lent to the sibling", {}, {A: 100, B: 5}, 32, {A: 27, B: 5}),
        ("demands fit: each its demand", {}, {A: 10, B: 5}, 32, {A: 10, B: 5}),
        ("no demand, no share", {}, {A: 40, B: 0}, 32, {A: 32, B: 0}),
        (
            "max_gpus caps, the rest to others",
            {A: _t(A, max_gpus=8)},
            {A: 99, B: 99},
            32,
            {A: 8, B: 24},
        ),
        (
            "max_gpus caps even when idle GPUs remain",
            {A: _t(A, max_gpus=8)},
            {A: 99, B: 4},
            32,
            {A: 8, B: 4},
        ),
        (
            "guarantee above the weighted share",
            {B: _t(B, guaranteed_gpus=20)},
            {A: 99, B: 99, C: 99},
            32,
            {A: 6, B: 20, C: 6},
        ),
        (
            "guarantee capped by demand",
            {B: _t(B, guaranteed_gpus=20)},
            {A: 99, B: 3},
            32,
            {A: 29, B: 3},
        ),
        (
            "guarantees over capacity scale down",
            {A: _t(A, guaranteed_gpus=30), B: _t(B, guaranteed_gpus=30)},
            {A: 99, B: 99},
            30,
            {A: 15, B: 15},
        ),
        (
            "hierarchy: org split first, then its teams",
            {},
            {"org/x": 100, "org/y": 100, "solo": 100},
            32,
            {"org/x": 8, "org/y": 8, "solo": 16},
        ),
        (
            "hierarchy: a team's idle share stays in its org",
            {},
            {"org/x": 100, "org/y": 2, "solo": 100},
            32,
            {"org/x": 14, "org/y": 2, "solo": 16},
        ),
        (
            "hierarchy: an org's idle share goes up the tree",
            {},
            {"org/x": 3, "org/y": 2, "solo": 100},
            32,
            {"org/x": 3, "org/y": 2, "solo": 27},
        ),
        (
            "hierarchy: an org's cap holds over its teams",
            {"org": _t("org", max_gpus=10)},
            {"org/x": 100, "org/y": 100, "solo": 100},
            32,
            {"org/x": 5, "org/y": 5, "solo": 22},
        ),
        (
            "hierarchy: team weights inside the org",
            {"org/x": _t("org/x", weight=3)},
            {"org/x": 100, "org/y": 100, "solo": 100},
            32,
            {"org/x": 12, "org/y": 4, "solo": 16},
        ),
        (
            "a job at an inner tenant is one more child",
            {},
            {"org": 100, "org/x": 100},
            32,
            {"org": 16, "org/x": 16},
        ),
        ("the default tenant alone takes the cluster", {}, {"": 120}, 32, {"": 32}),
    ],
)
def test_entitlements(
    name: str,
    tenants: dict[str, Tenant],
    demand: dict[str, float],
    capacity: float,
    expected: dict[str, float],
) -> None:
    got = entitlements(tenants, demand, capacity)
    assert got.keys() == expected.keys(), name
    for path, gpus in expected.items():
        assert got[path] == pytest.approx(gpus), (name, path, got)


def test_water_fill_floors_sums_to_the_amount_and_respects_floors_and_caps() -> None:
    claims = {"x": (1.0, 0.0, 3.0), "y": (2.0, 5.0, 100.0), "z": (1.0, 0.0, 100.0)}
    shares = water_fill_floors(claims, 20.0)
    assert sum(shares.values()) == pytest.approx(20.0)
    assert shares["x"] == pytest.approx(3.0)
    assert shares["y"] == pytest.approx(2 * shares["z"])
    assert shares["y"] >= 5.0


def test_tenant_settings_are_checked() -> None:
    with pytest.raises(ValidationError) as error:
        Tenant("a", weight=0)
    assert error.value.field == "weight"
    with pytest.raises(ValidationError) as error:
        Tenant("a", guaranteed_gpus=9, max_gpus=8)
    assert error.value.field == "guaranteed_gpus"
    for bad in ("a//b", "../x", "a b", "/a", "a/", "x" * 300):
        with pytest.raises(ValidationError) as error:
            Tenant(bad)
        assert error.value.field == "tenant"


def test_job_spec_carries_a_checked_tenant_and_priority() -> None:
    spec = JobSpec("j", 1, 1, 10, 1, tenant="org/team", priority="high")
    assert spec.tenant == "org/team"
    assert JobSpec("j", 1, 1, 10, 1).tenant == ""
    with pytest.raises(ValidationError) as error:
        JobSpec("j", 1, 1, 10, 1, tenant="no spaces")
    assert error.value.field == "tenant"


def test_budgets_give_each_tenant_its_share_and_one_tenant_keeps_the_job_budgets() -> None:
    jobs = {f"a{i}": A for i in range(100)} | {f"b{i}": B for i in range(20)}
    budgets = job_budgets(jobs, {A: 16.0, B: 16.0})
    total_a = sum(v for k, v in budgets.items() if k.startswith("a"))
    total_b = sum(v for k, v in budgets.items() if k.startswith("b"))
    assert total_a == pytest.approx(total_b)
    assert sum(budgets.values()) == pytest.approx(120)
    single = job_budgets({"x": "", "y": ""}, {"": 32.0}, {"x": 1.0, "y": 7.5})
    assert single == {"x": 1.0, "y": 7.5}


def _spec(job_id: str, tenant: str, gpus: int = 1, **kw: object) -> JobSpec:
    return JobSpec(job_id, gpus, 1, 10, 1, tenant=tenant, **kw)  # type: ignore[arg-type]


def test_a_priority_class_moves_a_job_only_within_its_tenant() -> None:
    specs = [_spec(f"a{i}", A) for i in range(4)] + [_spec(f"b{i}", B) for i in range(4)]
    plain = market(specs, {}, {"high": 4.0}, 4)
    specs[0] = _spec("a0", A, priority="high")
    boosted = market(specs, {}, {"high": 4.0}, 4)
    # the market divides by budget shares: b's part of all budgets is unchanged
    b_plain = sum(plain.budgets[f"b{i}"] for i in range(4)) / sum(plain.budgets.values())
    b_boosted = sum(boosted.budgets[f"b{i}"] for i in range(4)) / sum(boosted.budgets.values())
    assert b_boosted == pytest.approx(b_plain) == pytest.approx(0.5)
    assert boosted.entitled == plain.entitled
    assert boosted.budgets["a0"] == pytest.approx(4 * boosted.budgets["a1"])
    assert boosted.budgets["a0"] > plain.budgets["a0"]


def test_market_contention_is_jobs_per_gpu_inside_the_tenant_share() -> None:
    specs = [_spec(f"a{i}", A) for i in range(10)] + [_spec("b0", B)]
    shares = market(specs, {}, {}, 4)
    assert shares.entitled == {A: 3.0, B: 1.0}
    assert shares.contention["a0"] == pytest.approx(10 / 3)
    assert shares.contention["b0"] == 1.0
    assert not shares.single
    single = market([_spec("x", ""), _spec("y", "")], {}, {}, 4)
    assert single.single and single.budgets == {"x": 1.0, "y": 1.0}


def test_limit_column_caps_a_tenant_and_names_the_reason() -> None:
    width = {f"a{i}": 4 for i in range(4)} | {"b0": 4}
    tenant_of = {j: j[0] for j in width}
    column = ["a0", "a1", "a2", "a3", "b0"]
    kept, refused = limit_column(column, column, width, tenant_of, {A: _t(A, max_gpus=8)}, 32)
    assert kept == ["a0", "a1", "b0"]
    assert refused == {"a2": AT_LIMIT, "a3": AT_LIMIT}


def test_limit_column_puts_a_guaranteed_tenant_first_and_makes_room() -> None:
    width = {f"a{i}": 4 for i in range(8)} | {"b0": 2, "b1": 2, "b2": 2}
    tenant_of = {j: j[0] for j in width}
    column = [f"a{i}" for i in range(8)]  # the policy gave everything to a
    order = [*column, "b0", "b1", "b2"]
    kept, _ = limit_column(column, order, width, tenant_of, {B: _t(B, guaranteed_gpus=4)}, 32)
    assert kept[:2] == ["b0", "b1"]
    assert sum(width[j] for j in kept) <= 32
    assert sum(width[j] for j in kept if tenant_of[j] == B) == 4


def test_within_caps_counts_what_a_tenant_already_holds() -> None:
    width = {"a0": 4, "a1": 4, "b0": 1}
    tenant_of = {"a0": A, "a1": A, "b0": B, "run": A}
    kept, refused = within_caps(
        ["a0", "a1", "b0"], {"run": 4}, width, tenant_of, {A: _t(A, max_gpus=8)}
    )
    assert kept == ["a0", "b0"] and refused == {"a1": AT_LIMIT}


def test_engine_never_places_a_tenant_over_its_max_gpus() -> None:
    cluster = Cluster.uniform(4, 4)
    jobs = [Waiting(f"a{i}", 4, A) for i in range(4)] + [Waiting("b0", 1, B)]
    plan = Plan(0, (tuple(j.job_id for j in jobs),), 1, 0.0)
    tenants = {A: _t(A, max_gpus=8)}
    changes = engine.boundary(
        r=0,
        now=0.0,
        state_version=1,
        jobs=jobs,
        plans=[plan],
        leases={},
        cluster=cluster,
        conserve=True,
        tenants=tenants,
    )
    held_a = sum(len(g) for j, g in changes.assignment.items() if j.startswith("a"))
    assert held_a == 8
    assert "b0" in changes.assignment
    assert changes.waiting["a2"] == f"waits: {AT_LIMIT}"
    # mid-round: the free GPUs do not go to a either
    filled = engine.fill(
        jobs=jobs, leases=dict(changes.assignment), cluster=cluster, tenants=tenants
    )
    assert not filled.assignment
    assert filled.waiting["a2"] == f"waits: {AT_LIMIT}"


def test_engine_without_limits_is_unchanged() -> None:
    cluster = Cluster.uniform(2, 4)
    jobs = [Waiting(f"a{i}", 4, A) for i in range(3)]
    plan = Plan(0, (("a0", "a1", "a2"),), 1, 0.0)
    kwargs = dict(
        r=0,
        now=0.0,
        state_version=1,
        jobs=jobs,
        plans=[plan],
        leases={},
        cluster=cluster,
        conserve=True,
    )
    plain = engine.boundary(**kwargs)  # type: ignore[arg-type]
    weighted = engine.boundary(**kwargs, tenants={A: _t(A, weight=5)})  # type: ignore[arg-type]
    assert plain == weighted


def test_entitlements_reject_bad_input() -> None:
    with pytest.raises(ValidationError):
        entitlements({}, {A: -1}, 4)
    with pytest.raises(ValidationError):
        entitlements({}, {A: 1}, math.inf)


def test_share_round_holds_a_tenant_to_its_share_and_lends_idle_gpus() -> None:
    width = {"a0": 4, "a1": 4, "a2": 4, "b0": 2, "b1": 2}
    tenant_of = {j: j[0] for j in width}
    order = ["a0", "a1", "a2", "b0", "b1"]  # the policy would give a everything first
    kept, held = share_round(order, width, tenant_of, {A: 8.0, B: 4.0}, 14)
    assert kept == ["a0", "a1", "b0", "b1"]
    assert held == {"a2": AT_SHARE}
    # b has no more demand: its idle share is lent to a in the second pass
    kept, held = share_round(["a0", "a1", "a2", "b0"], width, tenant_of, {A: 8.0, B: 4.0}, 14)
    assert kept == ["a0", "a1", "b0", "a2"] and not held


def test_balances_carry_what_gangs_could_not_match_and_lending_is_free() -> None:
    width = {"a0": 4, "a1": 4, "b0": 4}
    tenant_of = {j: j[0] for j in width}
    # 6 + 6 GPUs of 4-GPU gangs on 12: a gets 8, b 4: b is owed 2, a owes 2
    owed = owed_after({}, {A: 6.0, B: 6.0}, ["a0", "a1", "b0"], width, tenant_of)
    assert owed == {A: -2.0, B: 2.0}
    assert share_quotas({A: 6.0, B: 6.0}, owed) == {A: 4.0, B: 8.0}
    # a borrowed GPUs b could not use (b entitled to, and got, all its demand): a owes nothing
    owed = owed_after({}, {A: 4.0, B: 4.0}, ["a0", "a1", "b0"], width, tenant_of)
    assert owed == {A: 0.0, B: 0.0}


def test_share_round_keeps_a_tenants_later_jobs_behind_one_its_share_held_back() -> None:
    # a's share is 3: a0 (2) fits, a1 (2) does not; a2 (1) comes after a1 in the order and does
    # not take the GPU a1 is next in line for. The GPUs left over are lent in the same order.
    width = {"a0": 2, "a1": 2, "a2": 1, "b0": 1}
    tenant_of = {j: j[0] for j in width}
    kept, held = share_round(["a0", "a1", "a2", "b0"], width, tenant_of, {A: 3.0, B: 3.0}, 6)
    assert kept == ["a0", "b0", "a1", "a2"] and not held
    kept, held = share_round(["a0", "a1", "a2", "b0"], width, tenant_of, {A: 3.0, B: 3.0}, 4)
    assert kept == ["a0", "b0", "a2"]
    assert held == {"a1": AT_SHARE}


def test_share_order_puts_whole_window_jobs_then_late_ones_then_running_ones() -> None:
    planned = ["p0", "late_later", "p1", "run", "late_sooner", "whole"]
    late = {"late_later": 900.0, "late_sooner": 100.0}
    order = share_order(planned, {"whole"}, late, {"run"})
    assert order == ["whole", "late_sooner", "late_later", "run", "p0", "p1"]
    # a job held for the whole window comes first even when another is later past its deadline;
    # a running job that is late ranks with the late ones, by its deadline
    assert share_order(planned, {"late_sooner"}, late, {"late_later", "run"}) == [
        "late_sooner",
        "late_later",
        "run",
        "p0",
        "p1",
        "whole",
    ]
    assert share_order(planned, set(), {}) == planned
