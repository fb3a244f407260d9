"""A planner process keeps the job specs it read (:class:`store.snapshot.KnownSpecs`): its
snapshots read each job's state and observed columns only, and are the snapshots a fresh read
gives, as jobs report progress, arrive and finish; a stored spec the model refuses is excluded
with the same reason either way."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlmodel import Session, col

from shockwave.domain.snapshot import Snapshot
from store.cluster_version import DEFAULT_CLUSTER
from store.snapshot import KnownSpecs, load_snapshot
from store.tables import JobRow
from tests.integration.api_calls import bearer
from tests.integration.conftest import Database, Tokens
from tests.integration.driving import driver_on, leases, now, register, report, submit


def both(database: Database, known: KnownSpecs) -> tuple[Snapshot, Snapshot]:
    """The snapshot for round 5 read whole and read with ``known``, at one instant."""
    at = datetime.now(UTC)
    with Session(database.engine) as session:
        whole, _ = load_snapshot(session, DEFAULT_CLUSTER, 5, at)
    with Session(database.engine) as session:
        kept, _ = load_snapshot(session, DEFAULT_CLUSTER, 5, at, known=known)
    return whole, kept


def test_a_kept_spec_snapshot_is_the_whole_read_as_jobs_progress_arrive_and_finish(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent)
    first = submit(client, tokens.admin)
    second = submit(client, tokens.admin)
    with driver_on(database) as (driver, _):
        driver.step(now())
    attempt = next(lease.id for lease in leases(database) if lease.job_id == first)
    report(client, tokens.agent, attempt, "started")
    known = KnownSpecs()

    whole, kept = both(database, known)
    assert kept == whole
    assert set(known.specs) == {first, second}

    job_token = client.post(
        f"/v1/agent/leases/{attempt}/token", headers=bearer(tokens.agent)
    ).json()["token"]
    event = {"seq": 1, "kind": "progress", "epoch": 1, "samples": 10, "seconds": 2.0}
    posted = client.post(
        f"/v1/jobs/{first}/events", json={**event, "batch_size": 32}, headers=bearer(job_token)
    )
    assert posted.status_code == 201, posted.json()
    third = submit(client, tokens.admin)
    with Session(database.engine) as session:  # a stored spec the model refuses
        session.execute(update(JobRow).where(col(JobRow.id) == third).values(epochs=0))
        session.commit()

    whole, kept = both(database, known)
    assert kept == whole
    jobs = {job.job_id: job for job in kept.jobs}
    assert jobs[first].progress.epochs_done >= 1.0
    assert set(jobs) == {first, second}
    assert kept.excluded == whole.excluded
    assert third in kept.excluded

    report(client, tokens.agent, attempt, "exited", 0)
    whole, kept = both(database, known)
    assert kept == whole
    assert set(known.specs) == {second, third}, "a finished job is forgotten"
