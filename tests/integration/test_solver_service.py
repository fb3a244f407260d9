"""The solver service on the real Postgres and Redis, with a real Celery worker process.

Tests that need no broker run on both databases (``database``); the rest use a Postgres schema
of their own and a worker started with ``shockwave worker`` on a queue of its own, so nothing
here sees another test session's plans or messages. Every subprocess is killed at the end.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import JobState
from shockwave.policies.policy import get_policy, service_params
from shockwave_cli.runtime.supervision import Supervised
from solver_service import enqueue
from solver_service.planning import plan_cluster
from solver_service.settings import SolverSettings
from store import migrate
from store.cluster_version import DEFAULT_CLUSTER, ensure_cluster
from store.db import make_engine
from store.jobs import record_state
from store.principals import Role
from store.snapshot import NoCapacity, load_snapshot
from store.tables import ClusterRow, JobRow, LeaseRow, NodeApprovalRow, NodeRow, PlanRow, utcnow
from store.tokens import create_token
from tests.integration.api_calls import bearer, job_body
from tests.integration.conftest import (
    POSTGRES_URL,
    REDIS_URL,
    SHOCKWAVE,
    Database,
    RecordedPlanRequests,
    Tokens,
    build_app,
    postgres_schema,
    unique_name,
)

WORKER_START_S = 30.0
PLAN_WAIT_S = 30.0
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


# --- helpers -------------------------------------------------------------------------------------


def wait_for(what: str, found: Callable[[], Any], timeout: float, log: Path | None = None) -> Any:
    """Poll ``found`` until it returns something truthy; fail naming ``what`` (and showing the
    worker's log) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    pytest.fail(f"no {what} within {timeout:.0f} s\n{tail}", pytrace=False)


def add_nodes(engine: Engine, *nodes: tuple[str, int]) -> None:
    with Session(engine) as session:
        for node_id, gpus in nodes:
            session.add(NodeRow(id=node_id, hostname=node_id, gpus=gpus, state="READY"))
            session.add(NodeApprovalRow(node_id=node_id, gpus=gpus))
        session.commit()


def submit(client: TestClient, token: str, **overrides: Any) -> str:
    response = client.post("/v1/jobs", json=job_body(**overrides), headers=bearer(token))
    assert response.status_code == 201, response.json()
    job_id: str = response.json()["id"]
    return job_id


def cluster_row(engine: Engine) -> ClusterRow:
    with Session(engine) as session:
        row = session.get(ClusterRow, DEFAULT_CLUSTER)
        assert row is not None
        return row


def plans(engine: Engine, state_version: int | None = None) -> list[PlanRow]:
    with Session(engine) as session:
        query = select(PlanRow).order_by(col(PlanRow.id))
        if state_version is not None:
            query = query.where(PlanRow.state_version == state_version)
        return list(session.exec(query).all())


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --- fixtures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """A Postgres schema, the API on it and a solver worker on ``queue``."""

    database: Database
    queue: str
    log: Path
    settings: SolverSettings

    def requester(self, **changes: Any) -> enqueue.PlanRequester:
        return enqueue.make_requester(self.settings.model_copy(update=changes))


@pytest.fixture(scope="module")
def service(
    postgres_server: Engine,
    redis_broker: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    """A migrated schema and a ``shockwave worker`` process serving a queue of its own."""
    queue = unique_name("solver_it")
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with postgres_schema(postgres_server, "solver_it") as schema:
        migrate.upgrade(POSTGRES_URL, schema=schema)
        engine = make_engine(POSTGRES_URL, schema)
        settings = SolverSettings(
            database_url=POSTGRES_URL,
            database_schema=schema,
            broker_url=REDIS_URL,
            solver_queue=queue,
            solver_mode="celery",
        )
        env = {
            **os.environ,
            "SHOCKWAVE_DATABASE_URL": POSTGRES_URL,
            "SHOCKWAVE_DATABASE_SCHEMA": schema,
            "SHOCKWAVE_BROKER_URL": REDIS_URL,
            "SHOCKWAVE_SOLVER_QUEUE": queue,
        }
        argv = [str(SHOCKWAVE), "worker", "--concurrency", "1", "--log-level", "info"]
        worker = Supervised("worker", argv, env, log, grace_s=10.0).start()
        try:
            wait_for("ready worker", lambda: b" ready." in log.read_bytes(), WORKER_START_S, log)
            yield Service(Database("postgres", POSTGRES_URL, engine, schema), queue, log, settings)
        finally:
            worker.stop()
            engine.dispose()
            for key in redis_broker.scan_iter(match=f"*{queue}*"):
                redis_broker.delete(key)


@pytest.fixture
def pg_client(service: Service) -> Iterator[tuple[TestClient, str]]:
    """A client of the API on the service's schema (emptied) and an admin token."""
    service.database.empty()
    with Session(service.database.engine) as session:
        admin = create_token(session, Role.ADMIN, name="admin")
    with TestClient(build_app(service.database), raise_server_exceptions=False) as client:
        yield client, admin


@pytest.fixture
def live_requests(service: Service) -> Iterator[enqueue.PlanRequester]:
    """Plan requests go to the real broker and the service's worker."""
    requester = service.requester()
    previous = enqueue.install(requester)
    try:
        yield requester
    finally:
        enqueue.install(previous)
        requester.close()


# --- with a real worker ------------------------------------------------------------------------


def test_submitted_jobs_are_planned_by_the_worker(
    service: Service,
    pg_client: tuple[TestClient, str],
    live_requests: enqueue.PlanRequester,
) -> None:
    client, admin = pg_client
    engine = service.database.engine
    add_nodes(engine, ("n1", 4), ("n2", 4))
    jobs = [submit(client, admin, gpus=g, name=f"w{g}") for g in (1, 2, 4)]
    version = cluster_row(engine).state_version
    assert version == 3

    plan = wait_for("plan", lambda: plans(engine, version), PLAN_WAIT_S, service.log)[0]

    assert plan.base_round == 0
    assert plan.policy == "shockwave"
    assert sorted(plan.rounds[0]) == sorted(jobs), "7 of 8 GPUs: every job runs"
    assert plan.status and plan.solver
    assert plan.solve_seconds > 0
    assert cluster_row(engine).policy_state is not None, "the policy's memory is kept"


def test_duplicate_deliveries_make_one_plan(
    service: Service,
    pg_client: tuple[TestClient, str],
    live_requests: enqueue.PlanRequester,
) -> None:
    client, admin = pg_client
    engine = service.database.engine
    add_nodes(engine, ("n1", 4))
    first = submit(client, admin)
    version = cluster_row(engine).state_version
    wait_for("first plan", lambda: plans(engine, version), PLAN_WAIT_S, service.log)
    for _ in range(3):
        live_requests.request(DEFAULT_CLUSTER, version)
    response = client.post(f"/v1/jobs/{first}/cancel", headers=bearer(admin))
    assert response.status_code == 200
    newer = cluster_row(engine).state_version
    assert newer == version + 1
    # One worker process takes messages in order: once the cancel's plan is there, the
    # duplicates sent before it have been handled.
    after = wait_for("plan after cancel", lambda: plans(engine, newer), PLAN_WAIT_S, service.log)

    assert len(plans(engine, version)) == 1
    assert after[0].rounds and not any(after[0].rounds), "the cancelled job is planned no more"


def test_api_accepts_jobs_quickly_with_the_broker_down(
    service: Service, pg_client: tuple[TestClient, str]
) -> None:
    client, admin = pg_client
    engine = service.database.engine
    add_nodes(engine, ("n1", 8))
    down = service.requester(broker_url=f"redis://127.0.0.1:{closed_port()}/0")
    previous = enqueue.install(down)
    try:
        jobs = []
        for i in range(5):
            started = time.perf_counter()
            jobs.append(submit(client, admin, name=f"down{i}"))
            assert time.perf_counter() - started < 2.0
    finally:
        enqueue.install(previous)
        down.close()

    with Session(engine) as session:
        stored = session.exec(select(JobRow.id)).all()
        assert sorted(stored) == sorted(jobs), "every acknowledged job is committed"
        assert cluster_row(engine).state_version == 5
        assert plans(engine) == [], "no request reached a worker"
        plan = plan_cluster(session, DEFAULT_CLUSTER, 5, now=datetime.now(UTC))
    assert plan is not None
    assert sorted(plan.rounds[0]) == sorted(jobs), "once planning resumes, nothing is missing"


def test_a_silent_broker_delays_a_request_by_at_most_its_timeout(service: Service) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        requester = service.requester(broker_url=f"redis://127.0.0.1:{port}/0")
        try:
            started = time.perf_counter()
            requester.request(DEFAULT_CLUSTER, 1)
            elapsed = time.perf_counter() - started
        finally:
            requester.close()
    assert elapsed < service.settings.broker_timeout_s + 0.5


# --- on both databases, without a broker ---------------------------------------------------------


def test_requests_follow_the_replan_mode(
    database: Database, client: TestClient, tokens: Tokens, plan_requests: RecordedPlanRequests
) -> None:
    job = submit(client, tokens.admin)
    assert plan_requests.requests == [(DEFAULT_CLUSTER, 1)]
    scaling = {"seq": 1, "kind": "scaling", "batch_size": 64, "epoch": 1}
    progress = {"seq": 2, "kind": "progress", "epoch": 1, "samples": 1000, "seconds": 3.0}
    for event in (scaling, scaling, {**progress, "batch_size": 32}):
        response = client.post(f"/v1/jobs/{job}/events", json=event, headers=bearer(tokens.admin))
        assert response.status_code in (200, 201), response.json()
    assert plan_requests.requests[1:] == [(DEFAULT_CLUSTER, 2)], (
        "a scaling event asks for a plan; its replay and progress events do not"
    )

    with Session(database.engine) as session:
        row = session.get(ClusterRow, DEFAULT_CLUSTER)
        assert row is not None
        row.replan = "lazy"
        session.add(row)
        session.commit()
    assert client.post(f"/v1/jobs/{job}/cancel", headers=bearer(tokens.admin)).status_code == 200
    assert len(plan_requests.requests) == 2, "lazy mode only bumps the version"
    assert cluster_row(database.engine).state_version == 3


def test_stale_and_repeated_requests_are_no_ops(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    add_nodes(database.engine, ("n1", 4))
    for _ in range(2):
        submit(client, tokens.admin)
    with Session(database.engine) as session:
        assert plan_cluster(session, DEFAULT_CLUSTER, 1, now=NOW) is None
        assert plans(database.engine) == []
        first = plan_cluster(session, DEFAULT_CLUSTER, 2, now=NOW)
        again = plan_cluster(session, DEFAULT_CLUSTER, 2, now=NOW)
    assert first is not None and again is not None
    assert again.id == first.id
    assert [p.id for p in plans(database.engine)] == [first.id]


def test_a_stale_request_in_lazy_mode_plans_the_version_the_cluster_is_at(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    add_nodes(database.engine, ("n1", 4))
    with Session(database.engine) as session:
        ensure_cluster(session)
        row = session.get(ClusterRow, DEFAULT_CLUSTER)
        assert row is not None
        row.replan = "lazy"
        session.add(row)
        session.commit()
    asked = cluster_row(database.engine).state_version
    for _ in range(2):  # changes after the request: they only bump the version
        submit(client, tokens.admin)
    current = cluster_row(database.engine).state_version
    assert current > asked
    with Session(database.engine) as session:
        plan = plan_cluster(session, DEFAULT_CLUSTER, asked, now=NOW)
        again = plan_cluster(session, DEFAULT_CLUSTER, asked, now=NOW)
    assert plan is not None and again is not None
    assert plan.state_version == current, "tagged with the version its snapshot read"
    assert len(plan.rounds[0]) == 2, "both jobs submitted after the request are planned"
    assert again.id == plan.id, "a repeated request finds the plan at the current version"
    assert [p.id for p in plans(database.engine)] == [plan.id]


def test_concurrent_workers_on_one_version_store_one_plan(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    add_nodes(database.engine, ("n1", 4))
    submit(client, tokens.admin)
    both_loaded = threading.Barrier(2, timeout=10)
    results: dict[str, int | None] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        calls = iter(range(2))

        def timer() -> float:
            if next(calls) == 0:
                both_loaded.wait()
            return time.perf_counter()

        try:
            with Session(database.engine) as session:
                plan = plan_cluster(session, DEFAULT_CLUSTER, 1, now=NOW, timer=timer)
                results[name] = None if plan is None else plan.id
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors, errors
    stored = plans(database.engine)
    assert len(stored) == 1
    assert results == {"a": stored[0].id, "b": stored[0].id}


@pytest.mark.parametrize("policy", ["shockwave", "gavel", "fifo"])
def test_plan_starts_with_what_the_core_decides(
    database: Database, client: TestClient, tokens: Tokens, policy: str
) -> None:
    add_nodes(database.engine, ("n1", 4), ("n2", 4))
    shapes = [(4, 30, 100.0), (2, 5, 400.0), (2, 50, 50.0), (4, 10, 200.0), (1, 20, 80.0)]
    jobs = [
        submit(client, tokens.admin, gpus=g, epochs=e, throughput={"32": tp}) for g, e, tp in shapes
    ]
    with Session(database.engine) as session:
        ensure_cluster(session)
        cluster = session.get(ClusterRow, DEFAULT_CLUSTER)
        assert cluster is not None
        cluster.policy = policy
        cluster.current_round = 3
        cluster.round_ends_at = NOW + timedelta(seconds=40)
        running = session.get(JobRow, jobs[1])
        assert running is not None
        running.state = "RUNNING"
        session.add_all([cluster, running])
        session.add(
            LeaseRow(id="lease-1", job_id=jobs[1], node_id="n2", round_index=3, gpus=[2, 3])
        )
        session.commit()

        snapshot, version = load_snapshot(session, DEFAULT_CLUSTER, 4, NOW)
        session.rollback()
        core = get_policy(policy)
        decision = core.decide(
            snapshot, service_params(core, replan="reactive", solver_time_limit_s=None)
        )
        plan = plan_cluster(session, DEFAULT_CLUSTER, version, now=NOW)

    assert [j.job_id for j in snapshot.jobs] == jobs
    assert snapshot.round_start == NOW.timestamp() + 40, "round 4 starts when round 3 ends"
    assert snapshot.job(jobs[1]).progress.gpus == (6, 7), "n2's local GPUs 2, 3 are global 6, 7"
    assert all(not snapshot.job(j).running for j in jobs if j != jobs[1])
    assert snapshot.cluster.total_gpus == 8
    assert plan is not None
    assert plan.base_round == 4
    assert plan.state_version == version == 5
    assert plan.rounds[0] == list(decision.jobs)
    assert 0 < sum(g for (g, _, _), j in zip(shapes, jobs, strict=True) if j in plan.rounds[0]) <= 8
    if policy == "shockwave":
        assert len(plan.rounds) > 1, "Shockwave plans a window of rounds"
        assert plan.status and plan.objective is not None
    else:
        assert len(plan.rounds) == 1


def test_a_running_job_is_planned_as_it_stands_not_as_last_reported(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    """The snapshot credits a running job with the part of its next epoch it has trained since
    its row last changed (its last event or its start), as the simulator's policy sees it;
    a queued job, and the prediction the API shows, stay at the reported epochs."""
    add_nodes(database.engine, ("n1", 4))
    # 1000 samples an epoch at 10 samples/s: 100 s an epoch at batch size 32
    running, queued = (
        submit(client, tokens.admin, epochs=10, throughput={"32": 10.0}) for _ in range(2)
    )
    with Session(database.engine) as session:
        ensure_cluster(session)
        cluster = session.get(ClusterRow, DEFAULT_CLUSTER)
        assert cluster is not None
        cluster.current_round = 3
        rows = {j: session.get(JobRow, j) for j in (running, queued)}
        for job_id, row in rows.items():
            assert row is not None
            row.epochs_done = 4.0
            row.updated_at = NOW - timedelta(seconds=30)
            row.state = "RUNNING" if job_id == running else "PENDING"
            session.add(row)
        session.add_all(
            [cluster, LeaseRow(id="l1", job_id=running, node_id="n1", round_index=3, gpus=[0])]
        )
        session.commit()

        snapshot, _ = load_snapshot(session, DEFAULT_CLUSTER, 4, NOW)
        late, _ = load_snapshot(session, DEFAULT_CLUSTER, 4, NOW + timedelta(seconds=500))
        session.rollback()

    assert snapshot.job(running).progress.epochs_done == pytest.approx(4.3)
    assert snapshot.job(queued).progress.epochs_done == 4.0
    assert 4.9 < late.job(running).progress.epochs_done < 5.0, "never past its next epoch"
    shown = client.get(f"/v1/jobs/{running}", headers=bearer(tokens.admin)).json()
    assert shown["epochs_done"] == 4, shown


def test_a_job_stopped_mid_epoch_is_planned_with_what_it_trained_of_that_epoch(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    """An attempt that stopped 40 s into the job's next epoch (100 s an epoch) checkpointed
    there: queued, the job is planned at 4.4 epochs, not at the 4 it reported; one that went
    back PENDING (no checkpoint) carries nothing; the job's next reported epoch clears the
    carry, and the API's view stays at the reported epochs throughout."""
    add_nodes(database.engine, ("n1", 4))
    kept, lost = (
        submit(client, tokens.admin, epochs=10, throughput={"32": 10.0}) for _ in range(2)
    )
    with Session(database.engine) as session:
        ensure_cluster(session)
        rows = {j: session.get(JobRow, j) for j in (kept, lost)}
        for row in rows.values():
            assert row is not None
            row.epochs_done = 4.0
            row.state = "RUNNING"
            row.updated_at = utcnow() - timedelta(seconds=40)
            session.add(row)
        session.commit()
        for job_id, target in ((kept, JobState.SUSPENDED), (lost, JobState.PENDING)):
            row = rows[job_id]
            assert row is not None
            record_state(session, row, target, "the attempt stopped")
        session.commit()
        snapshot, _ = load_snapshot(session, DEFAULT_CLUSTER, 4, utcnow())
        session.rollback()
    assert snapshot.job(kept).progress.epochs_done == pytest.approx(4.4, abs=0.02)
    assert snapshot.job(lost).progress.epochs_done == 4.0
    shown = client.get(f"/v1/jobs/{kept}", headers=bearer(tokens.admin)).json()
    assert shown["epochs_done"] == 4, shown

    epoch = {"seq": 1, "kind": "progress", "epoch": 5, "samples": 1000, "seconds": 100.0}
    posted = client.post(
        f"/v1/jobs/{kept}/events", json={**epoch, "batch_size": 32}, headers=bearer(tokens.admin)
    )
    assert posted.status_code == 201, posted.text
    with Session(database.engine) as session:
        after, _ = load_snapshot(session, DEFAULT_CLUSTER, 4, utcnow())
        session.rollback()
    assert after.job(kept).progress.epochs_done == 5.0, "the report replaces the carry"


def test_no_ready_node_means_no_plan(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    submit(client, tokens.admin)
    with Session(database.engine) as session:
        session.add(NodeRow(id="gone", hostname="gone", gpus=4, state="LOST"))
        session.commit()
        with pytest.raises(NoCapacity):
            load_snapshot(session, DEFAULT_CLUSTER, 0, NOW)
        session.rollback()
        assert plan_cluster(session, DEFAULT_CLUSTER, None, now=NOW) is None
    assert plans(database.engine) == []


def test_inline_mode_plans_in_process(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    add_nodes(database.engine, ("n1", 4))
    inline = enqueue.make_requester(SolverSettings(solver_mode="inline"), database.engine)
    previous = enqueue.install(inline)
    try:
        jobs = [submit(client, tokens.admin, gpus=2) for _ in range(3)]
        plan = wait_for("inline plan", lambda: plans(database.engine, 3), PLAN_WAIT_S)[0]
    finally:
        enqueue.install(previous)
        inline.close()
    assert len(plan.rounds[0]) == 2 and set(plan.rounds[0]) <= set(jobs), "4 GPUs: two jobs run"


@pytest.mark.slow  # spawning the child imports the service: 3 to 9 s; tests/e2e/test_replay.py
# runs the embedded service with --solver process in the default suite
def test_process_mode_plans_in_a_child_process(
    database: Database, client: TestClient, tokens: Tokens
) -> None:
    add_nodes(database.engine, ("n1", 4))
    settings = SolverSettings(
        solver_mode="process", database_url=database.url, database_schema=database.schema
    )
    child = enqueue.make_requester(settings)
    assert isinstance(child, enqueue.ProcessRequester)
    previous = enqueue.install(child)
    try:
        jobs = [submit(client, tokens.admin, gpus=2) for _ in range(3)]
        plan = wait_for("plan from the child", lambda: plans(database.engine, 3), 30.0)[0]
    finally:
        enqueue.install(previous)
        child.close()
    assert len(plan.rounds[0]) == 2 and set(plan.rounds[0]) <= set(jobs), "4 GPUs: two jobs run"
