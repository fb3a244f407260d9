"""What the driver and agent-endpoint tests share: a round driver on the test database with an
injected clock, and the rows they set up and read back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import LIVE_LEASES
from solver_service.driver import DriverSettings, RoundDriver
from store.cluster import approve_node
from store.principals import Role
from store.tables import ClusterRow, JobRow, LeaseRow, PlanRow, RoundRow
from store.tokens import create_token
from tests.integration.api_calls import bearer, job_body
from tests.integration.conftest import Database

ROUND_S = 0.05
"""Rounds of 50 ms: tests step the driver at the times they choose."""


class PlanRequests:
    """A ``request_plan`` that records what the driver asks for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, cluster_id: str, state_version: int) -> None:
        self.calls.append((cluster_id, state_version))


@contextmanager
def driver_on(
    database: Database, *, round_s: float = ROUND_S, ttl_s: float = 30.0, lead_s: float = 0.0
) -> Iterator[tuple[RoundDriver, PlanRequests]]:
    """A driver on ``database`` with a recorded ``request_plan``, closed (lock released) at
    the end."""
    requests = PlanRequests()
    settings = DriverSettings(
        database_url=database.url,
        database_schema=database.schema,
        round_seconds=round_s,
        node_ttl_s=ttl_s,
        boundary_lead_s=lead_s,
    )
    driver = RoundDriver(database.engine, settings, request_plan=requests)
    try:
        yield driver, requests
    finally:
        driver.close()


APPROVED_GPUS = 64
"""What the tests' operator approves per node (the tests' agents report fewer)."""


def agent_token(database: Database, node: str, approved: int | None = APPROVED_GPUS) -> str:
    """An agent token of ``node``; the node approved for ``approved`` GPUs (None: not)."""
    with Session(database.engine) as session:
        token = create_token(session, Role.AGENT, node=node, name=f"agent {node}")
        if approved is not None:
            approve_node(session, node, approved)
            session.commit()
        return token


def register(client: TestClient, token: str, gpus: int = 4, **extra: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/agent/register",
        json={"gpus": gpus, "gpu_type": "A100", "hostname": "gpu.local", **extra},
        headers=bearer(token),
    )
    assert response.status_code == 200, response.json()
    body: dict[str, Any] = response.json()
    return body


def post_status(
    client: TestClient, token: str, attempt: str, state: str, code: int | None = None
) -> Any:
    body: dict[str, Any] = {"state": state}
    if code is not None:
        body["exit_code"] = code
    return client.post(f"/v1/agent/leases/{attempt}/status", json=body, headers=bearer(token))


def report(
    client: TestClient, token: str, attempt: str, state: str, code: int | None = None
) -> dict[str, Any]:
    response = post_status(client, token, attempt, state, code)
    assert response.status_code == 200, response.json()
    body: dict[str, Any] = response.json()
    return body


def submit(client: TestClient, token: str, **overrides: Any) -> str:
    response = client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(token))
    assert response.status_code == 201, response.json()
    job_id: str = response.json()["id"]
    return job_id


def version(database: Database) -> int:
    with Session(database.engine) as session:
        cluster = session.get(ClusterRow, "default")
        return cluster.state_version if cluster else 0


def store_plan(
    database: Database,
    rounds: list[list[str]],
    *,
    base_round: int = 0,
    at: int | None = None,
    widths: dict[str, int] | None = None,
) -> int:
    """Store a plan at state version ``at`` (default: the cluster's current one); its id.
    ``widths``: the GPU counts it gives elastic jobs."""
    with Session(database.engine) as session:
        plan = PlanRow(
            cluster_id="default",
            state_version=version(database) if at is None else at,
            base_round=base_round,
            policy="test",
            rounds=rounds,
            widths=widths or {},
            solve_seconds=0.25,
            gain_gap=0.001,
        )
        session.add(plan)
        session.commit()
        assert plan.id is not None
        return plan.id


def leases(database: Database, *, states: tuple[str, ...] = LIVE_LEASES) -> list[LeaseRow]:
    with Session(database.engine) as session:
        return list(
            session.exec(
                select(LeaseRow).where(col(LeaseRow.state).in_(states)).order_by(col(LeaseRow.id))
            ).all()
        )


def round_row(database: Database, index: int) -> RoundRow:
    with Session(database.engine) as session:
        row = session.get(RoundRow, ("default", index))
        assert row is not None, f"no round {index}"
        return row


def job_state(database: Database, job_id: str) -> str:
    with Session(database.engine) as session:
        job = session.get(JobRow, job_id)
        assert job is not None
        return job.state


def now() -> float:
    return time.time()
