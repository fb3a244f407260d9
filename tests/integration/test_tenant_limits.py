"""A tenant's ``max_gpus`` in the service, on Postgres and SQLite: the real round driver never
leases a tenant more GPUs than its limit (at boundaries, whatever the plan says, and in
mid-round fills), and a job kept out waits with the reason "tenant at its GPU limit"."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import LIVE_LEASES
from shockwave.domain.tenancy import AT_LIMIT
from store.tables import JobRow, LeaseRow
from tests.integration.api_calls import bearer
from tests.integration.conftest import NODE, TENANT_A, TENANT_B, Database, Tokens
from tests.integration.driving import ROUND_S, driver_on, now, register, store_plan, submit


def _held_by_tenant(database: Database) -> dict[str, int]:
    with Session(database.engine) as session:
        rows = session.exec(
            select(JobRow.tenant, LeaseRow.gpus)
            .join(LeaseRow, col(LeaseRow.job_id) == col(JobRow.id))
            .where(col(LeaseRow.state).in_(LIVE_LEASES))
        ).all()
    held: dict[str, int] = {}
    for tenant, gpus in rows:
        held[tenant] = held.get(tenant, 0) + len(gpus)
    return held


def test_a_tenant_with_max_gpus_never_holds_more_and_its_next_job_waits_with_the_reason(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4, node=NODE)
    limited = client.post(
        "/v1/tenants", json={"path": TENANT_A, "max_gpus": 2}, headers=bearer(tokens.admin)
    )
    assert limited.status_code == 201, limited.json()
    a_jobs = [submit(client, tokens.user_a, name=f"a{i}") for i in range(3)]
    b_job = submit(client, tokens.user_b, name="b0")

    seen: list[dict[str, int]] = []
    with driver_on(database) as (driver, _):
        t = now()
        driver.step(t)  # no plan yet: the greedy order, arrival first
        seen.append(_held_by_tenant(database))
        # a plan that puts every job of A first: the engine still keeps A within 2 GPUs
        store_plan(database, [[*a_jobs, b_job]] * 3, base_round=1)
        for k in range(1, 4):
            driver.step(t + k * ROUND_S * 1.01)
            seen.append(_held_by_tenant(database))

    assert all(held.get(TENANT_A, 0) <= 2 for held in seen), seen
    assert all(held.get(TENANT_A, 0) == 2 for held in seen), "A uses its 2 GPUs"
    assert all(held.get(TENANT_B, 0) == 1 for held in seen), "B is not held back by A's cap"
    listed = client.get("/v1/jobs", params={"tenant": TENANT_A}, headers=bearer(tokens.user_a))
    reasons = sorted(str(j["waiting_reason"]) for j in listed.json()["items"])
    assert reasons == ["None", "None", AT_LIMIT], "the two leased jobs do not wait"
    waiting = [j for j in listed.json()["items"] if j["waiting_reason"]]
    one = client.get(f"/v1/jobs/{waiting[0]['id']}", headers=bearer(tokens.user_a)).json()
    assert one["waiting_reason"] == AT_LIMIT
    why = client.get(f"/v1/jobs/{waiting[0]['id']}/prediction", headers=bearer(tokens.user_a))
    assert why.json()["cause"] == "tenant_at_limit"
    assert why.json()["reason"].startswith(AT_LIMIT)
    running_b = client.get(f"/v1/jobs/{b_job}", headers=bearer(tokens.user_b)).json()
    assert running_b["waiting_reason"] is None


def test_a_fill_mid_round_keeps_the_tenant_within_its_limit(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4, node=NODE)
    client.post("/v1/tenants", json={"path": TENANT_A, "max_gpus": 1}, headers=bearer(tokens.admin))
    with driver_on(database, round_s=60.0) as (driver, _):
        t = now()
        first = submit(client, tokens.user_a, name="a0")
        driver.step(t)
        assert _held_by_tenant(database) == {TENANT_A: 1}
        second = submit(client, tokens.user_a, name="a1")  # 3 GPUs idle mid-round
        b_job = submit(client, tokens.user_b, name="b0")
        driver.step(t + 1.0)
        held = _held_by_tenant(database)

    assert held == {TENANT_A: 1, TENANT_B: 1}, held
    pending = client.get(f"/v1/jobs/{second}", headers=bearer(tokens.user_a)).json()
    assert (pending["state"], pending["waiting_reason"]) == ("PENDING", AT_LIMIT)
    assert client.get(f"/v1/jobs/{first}", headers=bearer(tokens.user_a)).json()["state"] in (
        "PENDING",
        "RUNNING",
    )
    assert b_job


def test_a_tenant_with_guaranteed_gpus_gets_them_at_the_next_boundary(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """B fills all 4 GPUs; A, guaranteed 2, submits two jobs and a plan leaves them out: the
    next boundary gives A its 2 GPUs all the same (B's last jobs make room)."""
    register(client, tokens.agent, gpus=4, node=NODE)
    client.post(
        "/v1/tenants", json={"path": TENANT_A, "guaranteed_gpus": 2}, headers=bearer(tokens.admin)
    )
    b_jobs = [submit(client, tokens.user_b, name=f"b{i}") for i in range(4)]
    with driver_on(database) as (driver, _):
        t = now()
        driver.step(t)
        assert _held_by_tenant(database) == {TENANT_B: 4}
        a_jobs = [submit(client, tokens.user_a, name=f"a{i}") for i in range(2)]
        store_plan(database, [b_jobs] * 3, base_round=1)
        driver.step(t + ROUND_S * 1.01)
        held = _held_by_tenant(database)

    assert held == {TENANT_A: 2, TENANT_B: 2}, held
    assert a_jobs
