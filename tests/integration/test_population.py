"""The population prior on Postgres and SQLite: a job that succeeds is learnt once, in the
transaction that records its success; the solver's snapshot and the prediction endpoint use it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from shockwave.domain.model import AdaptationMode
from store import population
from store.cluster_version import DEFAULT_CLUSTER
from store.snapshot import load_snapshot
from store.tables import PopulationRow
from tests.integration.api_calls import bearer
from tests.integration.conftest import TENANT_A, TENANT_B, Database, Tokens
from tests.integration.driving import driver_on, leases, now, register, report, submit

ACCORDION_JOB = {
    "name": "resnet18-accordion",
    "model": "ResNet-18",
    "mode": "accordion",
    "batch_sizes": [32, 256],
    "epochs": 10,
    "samples_per_epoch": 1000,
    "initial_batch_size": 32,
}
"""Accordion between 32 and 256; nothing declared about throughput."""


def post_event(client: TestClient, token: str, job: str, body: dict[str, Any]) -> None:
    response = client.post(f"/v1/jobs/{job}/events", json=body, headers=bearer(token))
    assert response.status_code == 201, response.json()


def run_to_exit(
    client: TestClient, tokens: Tokens, database: Database, code: int, **overrides: Any
) -> tuple[str, str]:
    """Submit, lease and run an accordion job: 3 epochs at 32 (10 s each), then 7 at 256 (4 s
    each), reported as a training program would; its attempt exits with ``code``."""
    register(client, tokens.agent)
    job = submit(client, tokens.admin, **{**ACCORDION_JOB, **overrides})
    with driver_on(database) as (driver, _):
        driver.step(now())
    (lease,) = [le for le in leases(database) if le.job_id == job]
    report(client, tokens.agent, lease.id, "started")
    seq = 0
    for epoch in range(1, 11):
        batch_size, seconds = (32, 10.0) if epoch <= 3 else (256, 4.0)
        if epoch == 4:
            seq += 1
            post_event(
                client,
                tokens.admin,
                job,
                {"seq": seq, "kind": "scaling", "epoch": 3, "batch_size": 256},
            )
        seq += 1
        body = {"seq": seq, "kind": "progress", "epoch": epoch, "samples": 1000}
        post_event(
            client, tokens.admin, job, {**body, "seconds": seconds, "batch_size": batch_size}
        )
    report(client, tokens.agent, lease.id, "exited", code)
    return job, lease.id


def stored(database: Database, tenant: str = "default") -> PopulationRow | None:
    """The prior row of ``tenant`` (the admin's jobs go to tenant ``default``)."""
    with Session(database.engine) as session:
        return session.get(PopulationRow, (DEFAULT_CLUSTER, tenant))


def test_a_job_that_succeeds_is_learnt_once_with_its_trajectory_and_rates(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    _, attempt = run_to_exit(client, tokens, database, 0)
    report(client, tokens.agent, attempt, "exited", 0)

    row = stored(database)
    assert row is not None and row.learnt == 1, "learnt once, the retried report changes nothing"
    with Session(database.engine) as session:
        prior = population.load_prior(session, "default")
    (template,) = prior.group((AdaptationMode.ACCORDION, "ResNet-18", 32))
    assert (template.batch_sizes, template.lengths) == ((32, 256), (3, 7))
    rates = {key: stat.samples_per_second for key, stat in prior.rates.items()}
    assert rates == {("ResNet-18", 1, 32): pytest.approx(100.0), ("ResNet-18", 1, 256): 250.0}


def test_a_job_that_fails_teaches_nothing(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    run_to_exit(client, tokens, database, 3)

    row = stored(database)
    assert row is None or row.learnt == 0


def test_the_snapshot_and_the_prediction_of_a_new_job_use_what_was_learnt(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    run_to_exit(client, tokens, database, 0)
    fresh = submit(client, tokens.admin, **{**ACCORDION_JOB, "epochs": 20})

    with Session(database.engine) as session:
        snapshot, _ = load_snapshot(session, DEFAULT_CLUSTER, 5, datetime.now(UTC))
    assert snapshot.prior_of(fresh).learnt == 1
    body = client.get(f"/v1/jobs/{fresh}/prediction", headers=bearer(tokens.admin)).json()
    # The finished job switched at 30% of its epochs; the paper's prior alone says 50%.
    assert [(r["batch_size"], r["epochs"]) for r in body["regimes"]] == [(32, 6.0), (256, 14.0)]
    # Nothing declared: the epoch times are what the finished job measured (10 s at 32, 4 s
    # at 256), estimates for the fresh job, which has not run yet.
    assert [r["epoch_seconds"] for r in body["regimes"]] == [pytest.approx(10.0), 4.0]
    assert {r["epoch_seconds_source"] for r in body["regimes"]} == {"estimated"}
    assert body["total_seconds"] == pytest.approx(6 * 10.0 + 14 * 4.0)


def test_a_tenants_predictions_never_learn_from_another_tenants_self_reported_epochs(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Tenant B's job of a model finishes with epochs its own process reported; tenant A's
    job of that model predicts as if B's never ran (model names and speeds do not leak and
    cannot be skewed), while B's next job learns from it: beside A's job, B's one finished job
    weighs less than the paper's rule; alone on the cluster, B predicts from it."""
    secret = {**ACCORDION_JOB, "model": "secret-model-x", "epochs": 20}
    mine = submit(client, tokens.user_a, **secret)
    path = f"/v1/jobs/{mine}/prediction"
    before = client.get(path, headers=bearer(tokens.user_a)).json()

    run_to_exit(client, tokens, database, 0, model="secret-model-x", tenant=TENANT_B)
    after = client.get(path, headers=bearer(tokens.user_a)).json()
    keys = ("regimes", "total_seconds")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    learnt_b = stored(database, TENANT_B)
    assert learnt_b is not None and learnt_b.learnt == 1
    assert stored(database, TENANT_A) is None, "nothing learnt for tenant A"
    theirs = submit(client, tokens.user_b, **secret)
    with Session(database.engine) as session:
        snapshot, _ = load_snapshot(session, DEFAULT_CLUSTER, 5, datetime.now(UTC))
    assert snapshot.prior_of(mine).learnt == 0
    assert snapshot.prior_of(theirs).learnt == 1

    theirs_path = f"/v1/jobs/{theirs}/prediction"
    beside = client.get(theirs_path, headers=bearer(tokens.user_b)).json()
    assert [(r["batch_size"], r["epochs"]) for r in beside["regimes"]] == [(32, 10.0), (256, 10.0)]
    cancelled = client.post(f"/v1/jobs/{mine}/cancel", headers=bearer(tokens.user_a))
    assert cancelled.status_code == 200, cancelled.json()
    alone = client.get(theirs_path, headers=bearer(tokens.user_b)).json()
    assert [(r["batch_size"], r["epochs"]) for r in alone["regimes"]] == [(32, 6.0), (256, 14.0)]
