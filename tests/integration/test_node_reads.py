"""What reads the ``nodes`` and ``leases`` tables on Postgres, on a cluster of a thousand
nodes: an agent's contact reads its own node row, found by its key, and its own node's leases
only, a job's lease checks its own job's leases only, also before the tables' statistics are
gathered (a cluster whose nodes just registered,
or a database without autovacuum), when the planner has only the indexes to go by; the round
driver's node reaper, every step, one aggregate row while no node is silent."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ClauseElement
from sqlmodel import Session

from api import agent
from solver_service.leases import mark_lost_nodes
from store.cluster_version import ensure_cluster
from store.leases import has_other_live_lease, requeue_state, revoke_live_leases, successor_of
from store.tables import ClusterRow, JobRow, LeaseRow, NodeApprovalRow, NodeRow
from tests.integration.conftest import Database, migrated_postgres

NODES = 1024
STAMP = 1_800_000_000.0
"""Every node's last heartbeat."""
ROUND = 3
"""The cluster's current round in :func:`many_leases`."""


@pytest.fixture(scope="module")
def many_nodes(postgres_server: Engine) -> Iterator[Database]:
    """A migrated schema with :data:`NODES` READY approved nodes and no statistics gathered."""
    with migrated_postgres(postgres_server, "it_nodes") as database:
        stamp = datetime.fromtimestamp(STAMP, UTC)
        ids = [f"node-{i:04d}" for i in range(NODES)]
        with database.engine.begin() as connection:
            connection.execute(
                insert(NodeRow),
                [{"id": n, "hostname": n, "gpus": 8, "last_heartbeat_at": stamp} for n in ids],
            )
            connection.execute(insert(NodeApprovalRow), [{"node_id": n, "gpus": 8} for n in ids])
        with Session(database.engine) as session:
            ensure_cluster(session)
            session.commit()
        yield database


def _job(job_id: str, stamp: datetime) -> dict[str, Any]:
    return {
        "id": job_id,
        "tenant": "t",
        "name": job_id,
        "state": "RUNNING",
        "gpus": 1,
        "epochs": 1,
        "samples_per_epoch": 1,
        "initial_batch_size": 1,
        "batch_size": 1,
        "mode": "static",
        "batch_sizes": [1],
        "throughput": {},
        "created_at": stamp,
        "updated_at": stamp,
    }


def _lease(node: str, gpu: int, round_index: int, state: str, stamp: datetime) -> dict[str, Any]:
    """A one-GPU lease of ``node``'s job ``gpu``, issued at round ``round_index``'s start."""
    issued = stamp + timedelta(seconds=30 * round_index)
    return {
        "id": f"{node}-{round_index}-{gpu}-{state}",
        "job_id": f"job-{node}-{gpu}",
        "node_id": node,
        "round_index": round_index,
        "gpus": [gpu],
        "state": state,
        "issued_at": issued,
        "ends_at": issued + timedelta(seconds=30),
        "updated_at": issued,
    }


@pytest.fixture(scope="module")
def many_leases(postgres_server: Engine) -> Iterator[Database]:
    """A migrated schema of :data:`NODES` READY nodes in round :data:`ROUND`, each with 8 live
    leases, a lease revoked last round and two attempts finished long ago, whose ``leases``
    table's statistics were gathered while it was empty (as ``bench.scale`` and a new
    cluster leave them): the planner knows nothing of the states' or the nodes' spread."""
    with migrated_postgres(postgres_server, "it_leases") as database:
        stamp = datetime.fromtimestamp(STAMP, UTC)
        ids = [f"node-{i:04d}" for i in range(NODES)]
        with database.engine.begin() as connection:
            connection.execute(text("ANALYZE leases"))
            connection.execute(
                insert(NodeRow),
                [{"id": n, "hostname": n, "gpus": 8, "last_heartbeat_at": stamp} for n in ids],
            )
            connection.execute(
                insert(JobRow), [_job(f"job-{n}-{g}", stamp) for n in ids for g in range(8)]
            )
            rows = [_lease(n, g, ROUND, "RUNNING", stamp) for n in ids for g in range(8)]
            rows += [_lease(n, 0, ROUND - 1, "REVOKED", stamp) for n in ids]
            rows += [_lease(n, g, 0, "EXITED", stamp) for n in ids for g in range(2)]
            connection.execute(insert(LeaseRow), rows)
        with Session(database.engine) as session:
            ensure_cluster(session)
            session.execute(update(ClusterRow).values(current_round=ROUND))
            session.commit()
        yield database


class Explain(Executable, ClauseElement):
    """``EXPLAIN (ANALYZE, FORMAT JSON)`` of a statement, its parameters bound as the
    statement's own."""

    inherit_cache = False

    def __init__(self, statement: Any) -> None:
        self.statement = statement


@compiles(Explain, "postgresql")
def _explain(element: Explain, compiler: Any, **kw: Any) -> str:
    return "EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiler.process(element.statement, **kw))


def rows_read(connection: Connection, statement: Any, params: dict[str, Any]) -> dict[str, int]:
    """The rows each table's scans read for ``statement`` (EXPLAIN ANALYZE: the rows a scan
    returned and those its filter removed, over all its loops), run in a transaction rolled
    back after."""
    explained = connection.execute(Explain(statement), params).scalar_one()
    read: dict[str, int] = {}

    def walk(node: dict[str, Any]) -> None:
        table = node.get("Relation Name")
        if table is not None and "Scan" in node["Node Type"]:
            loops = node.get("Actual Loops", 1)
            rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            read[table] = read.get(table, 0) + rows * loops
        for child in node.get("Plans", []):
            walk(child)

    walk(explained[0]["Plan"])
    connection.rollback()
    return read


def test_a_heartbeat_and_its_view_read_one_node_row(many_nodes: Database) -> None:
    with many_nodes.engine.connect() as connection:
        beat = rows_read(
            connection, agent._BEAT_VIEW, {"node": "node-0500", "now": datetime.now(UTC)}
        )
        view = rows_read(connection, agent._VIEW, {"node": "node-0500"})
        node_round = rows_read(connection, agent._NODE_ROUND, {"node": "node-0500"})
    assert beat["nodes"] == 1, beat
    assert view["nodes"] == 1, view
    assert node_round["nodes"] == 1, node_round


def test_a_reaper_step_with_no_node_silent_reads_one_aggregate_row(many_nodes: Database) -> None:
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(many_nodes.engine, "before_cursor_execute", seen)
    try:
        with Session(many_nodes.engine) as session:
            assert mark_lost_nodes(session, "default", STAMP + 29, ttl_s=30) is None
    finally:
        event.remove(many_nodes.engine, "before_cursor_execute", seen)
    assert len(statements) == 1, statements
    assert "count(" in statements[0] and "max(" in statements[0], statements[0]


def test_a_silent_node_among_many_is_lost(many_nodes: Database) -> None:
    with many_nodes.engine.begin() as connection:
        connection.execute(
            update(NodeRow)
            .where(NodeRow.id == "node-0007")  # type: ignore[arg-type]
            .values(last_heartbeat_at=datetime.fromtimestamp(STAMP - 31, UTC))
        )
    with Session(many_nodes.engine) as session:
        lost = mark_lost_nodes(session, "default", STAMP + 1, ttl_s=30)
    assert lost is not None and lost.nodes == ("node-0007",)


def test_a_poll_reads_only_its_own_nodes_leases(many_leases: Database) -> None:
    """The node's view reads its own 11 leases at most (8 live, 1 revoked last round, 2
    finished long ago), not the cluster's 9,216 live and revoked ones, as a read of the index
    on ``state`` filtered by node would."""
    node = "node-0500"
    with many_leases.engine.connect() as connection:
        beat = rows_read(connection, agent._BEAT_VIEW, {"node": node, "now": datetime.now(UTC)})
        view = rows_read(connection, agent._VIEW, {"node": node})
        leases = rows_read(
            connection, agent._NODE_LEASES, {"node": node, "since": ROUND - agent.STOP_ROUNDS}
        )
    assert 9 <= beat["leases"] <= 11, beat
    assert 9 <= view["leases"] <= 11, view
    assert 9 <= leases["leases"] <= 11, leases


def leases_index_entries(engine: Engine, call: Any) -> list[int]:
    """For each statement on ``leases`` that ``call`` runs, the index entries its scans read
    (EXPLAIN ANALYZE of the statement, run just before it in its transaction)."""
    read: list[int] = []

    def entries(node: dict[str, Any]) -> int:
        own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
        mine = own if "Index" in node["Node Type"] else 0
        return mine + sum(entries(child) for child in node.get("Plans", []))

    def explain(_conn: Any, cursor: Any, statement: str, params: Any, *_args: Any) -> None:
        if "FROM leases" in statement:
            plan = cursor.connection.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params
            ).fetchone()[0]
            read.append(entries(plan[0]["Plan"]))

    event.listen(engine, "before_cursor_execute", explain)
    try:
        with Session(engine) as session:
            call(session)
            session.rollback()
    finally:
        event.remove(engine, "before_cursor_execute", explain)
    return read


def test_a_jobs_lease_checks_read_only_its_own_leases(many_leases: Database) -> None:
    """A job's 3 leases (live, revoked last round, finished long ago) are found without
    reading the state index's entries of the cluster's 8,192 live leases (a bitmap AND of the
    job's index and the state's would read them all)."""
    job = "job-node-0500-0"

    def checks(session: Session) -> None:
        assert has_other_live_lease(session, job, None)
        assert requeue_state(session, job).value == "PENDING"
        revoked = session.get(LeaseRow, f"node-0500-{ROUND - 1}-0-REVOKED")
        assert revoked is not None
        assert successor_of(session, revoked) == f"node-0500-{ROUND}-0-RUNNING"
        assert revoke_live_leases(session, job, except_attempt=None) == 1

    read = leases_index_entries(many_leases.engine, checks)
    assert len(read) >= 4, read
    assert all(entries <= 3 for entries in read), read
