"""Tenants in the service on Postgres and SQLite: who may set a job's weight (``budget`` and
``priority``), the tenant tree's API and its history, and the ``max_jobs`` limit."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from api.schemas import JobCreate
from store import jobs, tenants
from store.principals import Principal, Role
from store.settings import DatabaseSettings
from store.snapshot import load_snapshot
from store.tables import JobRow, TenantChangeRow
from store.tokens import create_token
from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import (
    NODE,
    TENANT_A,
    TENANT_B,
    Database,
    Tokens,
    migrated_postgres,
)
from tests.integration.driving import register


def _jobs(database: Database) -> list[JobRow]:
    with Session(database.engine) as session:
        return list(session.exec(select(JobRow).order_by(col(JobRow.created_at))).all())


def _submit(client: TestClient, token: str, **overrides: Any) -> Any:
    return client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(token))


# budget and priority ---------------------------------------------------------------------------


def test_a_users_budget_is_refused_naming_budget_and_nothing_is_stored(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    refused = _submit(client, tokens.user_a, budget=1e6)

    problem = assert_problem(refused, 422, field="budget", path="/v1/jobs")
    assert "admins" in problem["detail"]
    assert _jobs(database) == [], "a refused submission must not be written"
    accepted = _submit(client, tokens.admin, budget=3.0, tenant=TENANT_A)
    assert accepted.status_code == 201, accepted.json()
    assert accepted.json()["budget"] == 3.0


def test_a_priority_class_is_stored_and_an_unknown_one_is_refused(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    high = _submit(client, tokens.user_a, priority="high")
    plain = _submit(client, tokens.user_a)
    unknown = _submit(client, tokens.user_a, priority="urgent")

    assert high.status_code == 201 and plain.status_code == 201
    assert (high.json()["priority"], high.json()["budget"]) == ("high", 1.0)
    assert (plain.json()["priority"], plain.json()["budget"]) == (None, 1.0)
    problem = assert_problem(unknown, 422, field="priority")
    assert "high" in problem["detail"], "the refusal lists the classes there are"
    assert len(_jobs(database)) == 2


# the tenant tree --------------------------------------------------------------------------------


def _tenant(client: TestClient, token: str, path: str) -> Any:
    return client.get(f"/v1/tenants/{path}", headers=bearer(token))


def test_admins_create_change_and_list_the_tree_with_its_history(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    created = client.post(
        "/v1/tenants",
        json={"path": "org/vision", "weight": 3.0, "max_gpus": 8, "max_jobs": 10},
        headers=bearer(tokens.admin),
    )
    assert created.status_code == 201, created.json()
    assert created.json()["parent"] == "org" and created.json()["version"] == 1
    again = client.post("/v1/tenants", json={"path": "org/vision"}, headers=bearer(tokens.admin))
    assert_problem(again, 409, field="path")

    changed = client.patch(
        "/v1/tenants/org/vision",
        json={"max_gpus": None, "weight": 2.0},
        headers=bearer(tokens.admin),
    )
    assert changed.status_code == 200, changed.json()
    body = changed.json()
    assert (body["weight"], body["max_gpus"], body["max_jobs"], body["version"]) == (
        2.0,
        None,
        10,
        2,
    )
    assert [c["version"] for c in body["history"]] == [2, 1]
    assert body["history"][1]["max_gpus"] == 8, "the history keeps the settings of each change"
    assert body["history"][0]["changed_at"] >= body["history"][1]["changed_at"]

    client.post("/v1/tenants", json={"path": "org/nlp"}, headers=bearer(tokens.admin))
    assert _submit(client, tokens.admin, tenant=TENANT_A).status_code == 201
    tree = client.get("/v1/tenants", headers=bearer(tokens.admin)).json()
    by_path = {t["path"]: t for t in tree["items"]}
    assert set(by_path) == {"org", "org/nlp", "org/vision", TENANT_A}
    assert by_path["org"]["children"] == ["org/nlp", "org/vision"]
    assert by_path["org"]["configured"] is False and by_path["org"]["weight"] == 1.0
    assert by_path[TENANT_A]["active_jobs"] == 1
    assert sorted(tree["roots"]) == ["org", TENANT_A]
    with Session(database.engine) as session:
        assert len(session.exec(select(TenantChangeRow)).all()) == 3


def test_bad_settings_are_422_problems_naming_the_setting(
    client: TestClient, tokens: Tokens
) -> None:
    admin = bearer(tokens.admin)
    cases = [
        ({"path": "t", "weight": 0}, "weight"),
        ({"path": "t", "weight": float("1e300")}, "weight"),
        ({"path": "t", "max_jobs": -1}, "max_jobs"),
        ({"path": "t", "guaranteed_gpus": 8, "max_gpus": 4}, "guaranteed_gpus"),
        ({"path": "bad//path"}, "path"),
        ({"path": "t", "color": "red"}, "color"),
    ]
    for body, field in cases:
        assert_problem(client.post("/v1/tenants", json=body, headers=admin), 422, field=field)
    refused = client.patch("/v1/tenants/t", json={"weight": None}, headers=admin)
    assert_problem(refused, 422, field="weight")
    assert client.get("/v1/tenants", headers=admin).json()["items"] == []


def test_a_user_reads_only_its_own_tenant_and_changes_none(
    client: TestClient, tokens: Tokens
) -> None:
    admin = bearer(tokens.admin)
    for path in (TENANT_A, TENANT_B):
        client.post("/v1/tenants", json={"path": path, "max_jobs": 5}, headers=admin)

    own = _tenant(client, tokens.user_a, TENANT_A)
    assert own.status_code == 200 and own.json()["max_jobs"] == 5
    assert_problem(_tenant(client, tokens.user_a, TENANT_B), 404)
    listed = client.get("/v1/tenants", headers=bearer(tokens.user_a)).json()
    assert [t["path"] for t in listed["items"]] == [TENANT_A]
    assert TENANT_B not in str(listed)
    patch = {"max_jobs": 500}
    own_change = client.patch(f"/v1/tenants/{TENANT_A}", json=patch, headers=bearer(tokens.user_a))
    assert_problem(own_change, 403)
    other = client.patch(f"/v1/tenants/{TENANT_B}", json=patch, headers=bearer(tokens.user_a))
    assert_problem(other, 404)
    created = client.post("/v1/tenants", json={"path": "mine"}, headers=bearer(tokens.user_a))
    assert_problem(created, 403)
    assert _tenant(client, tokens.admin, TENANT_A).json()["max_jobs"] == 5
    assert _tenant(client, tokens.admin, TENANT_B).json()["version"] == 1


# max_jobs -----------------------------------------------------------------------------------------


def test_a_submission_past_max_jobs_is_refused_naming_the_limit(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    admin = bearer(tokens.admin)
    client.post("/v1/tenants", json={"path": TENANT_A, "max_jobs": 2}, headers=admin)
    first = _submit(client, tokens.user_a).json()["id"]
    assert _submit(client, tokens.user_a).status_code == 201

    refused = _submit(client, tokens.user_a)
    problem = assert_problem(refused, 409, field="max_jobs", path="/v1/jobs")
    assert (problem["limit"], problem["tenant"], problem["max_jobs"]) == ("max_jobs", TENANT_A, 2)
    assert "max_jobs" in problem["detail"]
    assert _submit(client, tokens.user_b).status_code == 201, "another tenant is not limited"
    assert len(_jobs(database)) == 3

    client.post(f"/v1/jobs/{first}/cancel", headers=bearer(tokens.user_a))
    assert _submit(client, tokens.user_a).status_code == 201, "a finished job frees its place"
    client.patch(f"/v1/tenants/{TENANT_A}", json={"max_jobs": None}, headers=admin)
    assert _submit(client, tokens.user_a).status_code == 201, "null clears the limit"


def test_a_parents_max_jobs_counts_its_whole_subtree(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    client.post("/v1/tenants", json={"path": "org", "max_jobs": 2}, headers=bearer(tokens.admin))
    with Session(database.engine) as session:
        vision = create_token(session, Role.USER, tenant="org/vision", name="v")
        nlp = create_token(session, Role.USER, tenant="org/nlp", name="n")

    assert _submit(client, vision).status_code == 201
    assert _submit(client, nlp).status_code == 201
    problem = assert_problem(_submit(client, vision), 409, field="max_jobs")
    assert problem["tenant"] == "org"
    assert _jobs(database)[0].tenant == "org/vision"


# shares -------------------------------------------------------------------------------------------


def _market(database: Database) -> Any:
    with Session(database.engine) as session:
        snapshot, _ = load_snapshot(
            session, "default", 0, datetime.now(UTC), DatabaseSettings().priority_classes
        )
    return snapshot.market()


def _budget_share(market: Any, jobs: set[str]) -> float:
    return float(sum(market.budgets[j] for j in jobs) / sum(market.budgets.values()))


def test_a_users_priority_class_changes_no_other_tenants_share(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Tenant A (weight 3) and B (weight 1) share 4 GPUs; A's user then swaps a plain job for
    one of class ``high``: A's jobs' budgets move among themselves, B's entitlement and B's
    part of the market stay exactly where they were."""
    register(client, tokens.agent, gpus=4, node=NODE)
    client.post("/v1/tenants", json={"path": TENANT_A, "weight": 3.0}, headers=bearer(tokens.admin))
    a1 = _submit(client, tokens.user_a, gpus=4).json()["id"]
    a2 = _submit(client, tokens.user_a, gpus=4).json()["id"]
    b_jobs = {_submit(client, tokens.user_b, gpus=4).json()["id"] for _ in range(2)}
    before = _market(database)
    shown_before = {
        t["path"]: t["entitled_gpus"]
        for t in client.get("/v1/tenants", headers=bearer(tokens.admin)).json()["items"]
    }

    client.post(f"/v1/jobs/{a2}/cancel", headers=bearer(tokens.user_a))
    a3 = _submit(client, tokens.user_a, gpus=4, priority="high").json()["id"]
    after = _market(database)

    assert before.entitled == pytest.approx({TENANT_A: 3.0, TENANT_B: 1.0})
    assert after.entitled == pytest.approx(before.entitled)
    assert _budget_share(after, b_jobs) == pytest.approx(_budget_share(before, b_jobs))
    assert _budget_share(after, b_jobs) == pytest.approx(0.25)
    assert after.budgets[a3] == pytest.approx(2 * after.budgets[a1]), "high is 2x within A"
    assert before.budgets[a1] == pytest.approx(before.budgets[a2])
    shown = client.get(f"/v1/tenants/{TENANT_B}", headers=bearer(tokens.user_b)).json()
    assert shown["entitled_gpus"] == pytest.approx(shown_before[TENANT_B]) == pytest.approx(1.0)


def test_metrics_carry_each_tenants_share_and_usage(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4, node=NODE)
    client.post("/v1/tenants", json={"path": TENANT_A, "weight": 3.0}, headers=bearer(tokens.admin))
    _submit(client, tokens.user_a, gpus=4)
    _submit(client, tokens.user_b, gpus=4)

    text = client.get("/metrics", headers=bearer(tokens.admin)).text

    assert f'shockwave_tenant_entitled_gpus{{tenant="{TENANT_A}"}} 3.0' in text
    assert f'shockwave_tenant_entitled_gpus{{tenant="{TENANT_B}"}} 1.0' in text
    assert f'shockwave_tenant_active_jobs{{tenant="{TENANT_A}"}} 1.0' in text
    assert "# TYPE shockwave_tenant_gpu_hours_24h gauge" in text


def test_a_user_sees_its_tenants_history_without_who_changed_it(
    client: TestClient, tokens: Tokens
) -> None:
    client.patch(f"/v1/tenants/{TENANT_A}", json={"max_jobs": 3}, headers=bearer(tokens.admin))

    admin_view = _tenant(client, tokens.admin, TENANT_A).json()["history"]
    user_view = _tenant(client, tokens.user_a, TENANT_A).json()["history"]

    assert admin_view[0]["changed_by"].startswith("token:")
    assert [c["max_jobs"] for c in user_view] == [3] and user_view[0]["changed_by"] == ""


def test_concurrent_submissions_never_overshoot_max_jobs(postgres_server: Engine) -> None:
    """Eight submissions to a tenant with ``max_jobs`` 3 at once, each in its own transaction on
    Postgres: the tenant's row lock counts them one after the other, so exactly three land."""
    with migrated_postgres(postgres_server, "tenants") as database:
        admin = Principal(role=Role.ADMIN, key="token:1")
        user = Principal(role=Role.USER, key="token:2", tenant=TENANT_A)
        with Session(database.engine) as session:
            tenants.create_tenant(session, admin, TENANT_A, {"max_jobs": 3})
            session.commit()
        barrier = threading.Barrier(8)

        def attempt(_: int) -> str:
            with Session(database.engine) as session:
                barrier.wait(timeout=10)
                try:
                    jobs.create_job(session, user, JobCreate(**job_body()))
                    session.commit()
                    return "created"
                except tenants.TenantAtLimit:
                    session.rollback()
                    return "refused"

        with ThreadPoolExecutor(max_workers=8) as pool:
            outcomes = list(pool.map(attempt, range(8)))
        assert sorted(outcomes) == ["created"] * 3 + ["refused"] * 5
        assert len(_jobs(database)) == 3
