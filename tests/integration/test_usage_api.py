"""GET /v1/usage on Postgres and SQLite: its GPU-hours are the leases' (in a window too), its
CSV is a table, finish-time fairness and waits are as defined, and a user sees its own tenant."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from store.tables import JobRow, LeaseRow
from store.usage import COLUMNS
from tests.integration.api_calls import assert_problem, bearer
from tests.integration.conftest import NODE, TENANT_A, TENANT_B, Database, Tokens
from tests.integration.driving import register, submit

HOUR = timedelta(hours=1)
T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)


def _at(database: Database, job_id: str, created: datetime, state: str, ended: datetime) -> None:
    with Session(database.engine) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        job.created_at, job.state, job.updated_at = created, state, ended
        session.add(job)
        session.commit()


def _lease(
    database: Database,
    job_id: str,
    gpus: list[int],
    began: datetime,
    ends: datetime,
    *,
    state: str = "EXITED",
    updated: datetime | None = None,
) -> None:
    with Session(database.engine) as session:
        session.add(
            LeaseRow(
                id=str(uuid.uuid4()),
                job_id=job_id,
                node_id=NODE,
                round_index=0,
                gpus=gpus,
                state=state,
                issued_at=began,
                began_at=began,
                ends_at=ends,
                first_ends_at=ends,
                updated_at=updated or ends,
            )
        )
        session.commit()


@pytest.fixture
def history(client: TestClient, tokens: Tokens, database: Database) -> dict[str, str]:
    """On a 2-GPU node: job a1 (tenant A, 2 GPUs) submitted at T0, ran T0 to T0+3h and
    succeeded; b1 (tenant B, 2 GPUs) submitted at T0+1h, ran to T0+2h and was cancelled; a2
    (tenant A, 1 GPU) submitted now and running for the last 30 minutes on a live lease."""
    register(client, tokens.agent, gpus=2, node=NODE)
    a1 = submit(client, tokens.user_a, name="a1", gpus=2)
    b1 = submit(client, tokens.user_b, name="b1", gpus=2)
    a2 = submit(client, tokens.user_a, name="a2")
    _at(database, a1, T0, "SUCCEEDED", T0 + 3 * HOUR)
    _at(database, b1, T0 + HOUR, "CANCELLED", T0 + 2 * HOUR)
    _lease(database, a1, [0, 1], T0, T0 + 2 * HOUR, updated=T0 + 2 * HOUR + timedelta(seconds=5))
    _lease(database, a1, [0], T0 + 2 * HOUR, T0 + 3 * HOUR)
    _lease(database, b1, [0, 1], T0 + HOUR, T0 + 2 * HOUR)
    now = datetime.now(UTC)
    _lease(database, a2, [1], now - HOUR / 2, now + HOUR, state="RUNNING", updated=now)
    return {"a1": a1, "b1": b1, "a2": a2}


def _recorded_gpu_hours(database: Database, since: datetime, until: datetime) -> float:
    """What the leases table records: each row's GPUs times its span (to its end, or now for
    a live one) inside the window."""
    now = datetime.now(UTC)
    total = 0.0
    with Session(database.engine) as session:
        for lease in session.exec(select(LeaseRow)).all():
            assert lease.began_at is not None
            end = min(lease.ends_at, now) if lease.state == "RUNNING" else lease.ends_at
            span = (min(end, until) - max(lease.began_at, since)).total_seconds()
            total += max(0.0, span) * len(lease.gpus) / 3600
    return total


def _usage(client: TestClient, token: str, **params: Any) -> Any:
    response = client.get("/v1/usage", params=params, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def test_usage_sums_to_the_gpu_hours_the_leases_record(
    client: TestClient, tokens: Tokens, database: Database, history: dict[str, str]
) -> None:
    since, until = T0 - HOUR, datetime.now(UTC) + HOUR
    recorded = _recorded_gpu_hours(database, since, until)
    for group_by in ("tenant", "user", "job"):
        body = _usage(
            client,
            tokens.admin,
            since=since.isoformat(),
            until=until.isoformat(),
            group_by=group_by,
        )
        total = sum(row["gpu_hours"] for row in body["rows"])
        assert total == pytest.approx(recorded, abs=1e-3), group_by
        assert body["total_gpu_hours"] == pytest.approx(total)
    by_tenant = {row["key"]: row for row in body_of(client, tokens, since, until)["rows"]}
    # a1: 2 GPUs x 2 h + 1 GPU x 1 h; a2: 1 GPU x 0.5 h (live); b1: 2 GPUs x 1 h
    assert by_tenant[TENANT_A]["gpu_hours"] == pytest.approx(5.5, abs=1e-3)
    assert by_tenant[TENANT_B]["gpu_hours"] == pytest.approx(2.0)
    assert recorded == pytest.approx(7.5, abs=1e-3)


def body_of(client: TestClient, tokens: Tokens, since: datetime, until: datetime) -> Any:
    return _usage(client, tokens.admin, since=since.isoformat(), until=until.isoformat())


def test_a_window_counts_the_part_of_each_lease_inside_it(
    client: TestClient, tokens: Tokens, database: Database, history: dict[str, str]
) -> None:
    since, until = T0 + HOUR / 2, T0 + 1.5 * HOUR
    body = body_of(client, tokens, since, until)

    by_tenant = {row["key"]: row["gpu_hours"] for row in body["rows"]}
    assert by_tenant == pytest.approx({TENANT_A: 2.0, TENANT_B: 1.0})
    assert body["total_gpu_hours"] == pytest.approx(_recorded_gpu_hours(database, since, until))


def test_jobs_waits_and_finish_time_fairness(
    client: TestClient, tokens: Tokens, history: dict[str, str]
) -> None:
    body = _usage(
        client,
        tokens.admin,
        since=(T0 - HOUR).isoformat(),
        until=(T0 + 4 * HOUR).isoformat(),
        group_by="job",
    )
    rows = {row["label"]: row for row in body["rows"]}
    assert set(rows) == {"a1", "b1"}, "a2 was submitted after the window and held no GPU in it"
    a1, b1 = rows["a1"], rows["b1"]
    assert (a1["jobs"], a1["finished"], b1["finished"]) == (1, 1, 1)
    assert a1["mean_wait_s"] == 0.0 and b1["mean_wait_s"] == 0.0
    # a1: JCT 3 h, held GPUs 3 h; demand over its life: (2 GPUs x 3 h + 2 x 1 h) / 3 h on 2
    # GPUs: contention 4/3, so rho = 3 / (3 x 4/3) = 0.75. b1 was cancelled: no FTF.
    assert a1["mean_ftf"] == pytest.approx(0.75) and a1["max_ftf"] == pytest.approx(0.75)
    assert b1["mean_ftf"] is None


def test_the_csv_is_a_table_of_the_same_rows(
    client: TestClient, tokens: Tokens, history: dict[str, str]
) -> None:
    until = datetime.now(UTC) - timedelta(minutes=1)
    params = {"since": (T0 - HOUR).isoformat(), "until": until.isoformat(), "group_by": "job"}
    as_json = _usage(client, tokens.admin, **params)
    by_header = client.get(
        "/v1/usage", params=params, headers={**bearer(tokens.admin), "Accept": "text/csv"}
    )
    by_format = client.get(
        "/v1/usage", params={**params, "format": "csv"}, headers=bearer(tokens.admin)
    )

    assert by_header.status_code == 200 and by_header.headers["content-type"].startswith("text/csv")
    assert by_format.text == by_header.text
    table = list(csv.reader(io.StringIO(by_header.text)))
    assert table[0] == list(COLUMNS)
    assert all(len(line) == len(COLUMNS) for line in table)
    records = list(csv.DictReader(io.StringIO(by_header.text)))
    assert [r["key"] for r in records] == [row["key"] for row in as_json["rows"]]
    for record, row in zip(records, as_json["rows"], strict=True):
        assert float(record["gpu_hours"]) == pytest.approx(row["gpu_hours"])
        assert record["mean_ftf"] == ("" if row["mean_ftf"] is None else str(row["mean_ftf"]))


def test_a_user_sees_its_own_tenants_usage_only(
    client: TestClient, tokens: Tokens, history: dict[str, str]
) -> None:
    since = (T0 - HOUR).isoformat()
    for group_by in ("tenant", "user", "job"):
        body = _usage(client, tokens.user_a, since=since, group_by=group_by)
        assert {row["tenant"] for row in body["rows"]} == {TENANT_A}, group_by
        assert TENANT_B not in str(body) and history["b1"] not in str(body)
    mine = _usage(client, tokens.user_a, since=since)
    assert mine["total_gpu_hours"] == pytest.approx(5.5, abs=1e-3)
    other = client.get(
        "/v1/usage", params={"since": since, "tenant": TENANT_B}, headers=bearer(tokens.user_a)
    )
    assert_problem(other, 404)
    assert_problem(client.get("/v1/usage", headers=bearer(tokens.agent)), 403)


def test_a_bad_window_is_a_422_naming_the_field(client: TestClient, tokens: Tokens) -> None:
    admin = bearer(tokens.admin)
    backwards = {"since": T0.isoformat(), "until": (T0 - HOUR).isoformat()}
    assert_problem(client.get("/v1/usage", params=backwards, headers=admin), 422, field="until")
    naive = {"since": "2026-01-05T08:00:00"}
    assert_problem(client.get("/v1/usage", params=naive, headers=admin), 422, field="since")
    grouped = {"group_by": "team"}
    assert_problem(client.get("/v1/usage", params=grouped, headers=admin), 422, field="group_by")
