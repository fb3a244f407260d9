"""The service on agents of two GPU types: every gang stays on one type (issue 20)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlmodel import Session

from store.snapshot import gpu_layout
from store.tables import JobRow, NodeRow, PlanRow
from tests.integration.api_calls import bearer, job_body
from tests.integration.conftest import Database, Tokens
from tests.integration.driving import (
    agent_token,
    driver_on,
    leases,
    now,
    register,
    submit,
    version,
)


def test_gangs_stay_on_one_gpu_type_across_agents_of_two_types(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    # Node ids sort a, b, c, d and types alternate, so the untyped placement of a 4-GPU gang
    # over two whole 2-GPU nodes would take a V100 node and a K80 node.
    for name, kind in (("gpu-a", "V100"), ("gpu-b", "K80"), ("gpu-c", "V100"), ("gpu-d", "K80")):
        register(client, agent_token(database, name), gpus=2, gpu_type=kind)
    wide = [submit(client, tokens.admin, gpus=4) for _ in range(2)]
    narrow = [submit(client, tokens.admin, gpus=1) for _ in range(2)]

    with Session(database.engine) as session:
        layout = gpu_layout(session)
        assert layout is not None and layout.cluster.gpu_types == ("v100", "k80")
        types = {n: session.get(NodeRow, n).gpu_type for n in layout.node_ids}  # type: ignore[union-attr]

    with driver_on(database) as (driver, _):
        driver.step(now())
        first = {lease.job_id for lease in leases(database)}
        kinds: dict[str, set[str]] = {}
        for lease in leases(database):
            kinds.setdefault(lease.job_id, set()).add(types[lease.node_id])
        assert set(wide) <= first, "both 4-GPU gangs run, one on each type"
        assert all(len(k) == 1 for k in kinds.values()), kinds
        assert {next(iter(kinds[j])) for j in wide} == {"V100", "K80"}
        assert not set(narrow) & first, "the two gangs fill all 8 GPUs"


def test_a_job_runs_on_the_type_its_plan_names_and_its_prediction_says_so(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    for name, kind in (("gpu-a", "V100"), ("gpu-b", "K80")):
        register(client, agent_token(database, name), gpus=2, gpu_type=kind)
    job = submit(
        client,
        tokens.admin,
        gpus=2,
        throughput={"32": 800.0},
        type_throughput={"K80": {"32": 200.0}},
    )
    shown = client.get(f"/v1/jobs/{job}", headers=bearer(tokens.admin)).json()
    assert shown["type_throughput"] == {"k80": {"32": 200.0}}
    with Session(database.engine) as session:
        row = session.get(JobRow, job)
        assert row is not None and row.type_throughput == {"k80": {"32": 200.0}}
        session.add(
            PlanRow(
                cluster_id="default",
                state_version=version(database),
                base_round=0,
                policy="test",
                rounds=[[job]],
                types={job: "k80"},
            )
        )
        session.commit()

    with driver_on(database) as (driver, _):
        driver.step(now())
        held = [lease.node_id for lease in leases(database) if lease.job_id == job]
    assert held == ["gpu-b"], "placed on the K80 node its plan names, not the emptier V100 one"
    prediction = client.get(f"/v1/jobs/{job}/prediction", headers=bearer(tokens.admin))
    assert prediction.status_code == 200, prediction.json()
    assert prediction.json()["planned_gpu_type"] == "k80"


def test_a_declared_type_throughput_must_be_positive(client: TestClient, tokens: Tokens) -> None:
    response = client.post(
        "/v1/jobs",
        json=job_body(throughput={"32": 800.0}, type_throughput={"k80": {"32": -1.0}}),
        headers=bearer(tokens.admin),
    )
    assert response.status_code == 422, response.json()
    assert "throughput" in str(response.json())
