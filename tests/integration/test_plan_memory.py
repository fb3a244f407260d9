"""The policy's memory saved with a plan (solver_service.planning), on Postgres and SQLite: kept
when the cluster moved on while the policy ran (a job event, the boundary), because the plan
is still the latest decision the driver follows; not written over a newer plan's."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlmodel import Session, col, select

from shockwave.domain import state_codec
from shockwave.policies.shockwave_market.shockwave import ShockwaveState
from solver_service.planning import plan_cluster
from store.cluster_version import DEFAULT_CLUSTER, bump_state_version
from store.tables import ClusterRow, PlanRow
from tests.integration.conftest import Database, Tokens
from tests.integration.driving import register, store_plan, submit, version


class MovesOnDuringTheSolve:
    """The solver's timer: its second reading (the end of the policy's run) first does
    ``move`` in a transaction of its own, as a job event or the round driver would."""

    def __init__(self, move: Callable[[], None]) -> None:
        self.move = move
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        if self.readings == 2:
            self.move()
        return time.perf_counter()


def memory(database: Database) -> object:
    with Session(database.engine) as session:
        cluster = session.get(ClusterRow, DEFAULT_CLUSTER)
        assert cluster is not None
        return state_codec.decode(cluster.policy_state) if cluster.policy_state else None


def plan_moving_on(database: Database, move: Callable[[], None]) -> PlanRow:
    with Session(database.engine) as session:
        plan = plan_cluster(
            session,
            DEFAULT_CLUSTER,
            None,
            now=datetime.now(UTC),
            timer=MovesOnDuringTheSolve(move),
        )
    assert plan is not None
    return plan


def plan_count(database: Database) -> int:
    with Session(database.engine) as session:
        return len(session.exec(select(PlanRow.id)).all())


def bump(database: Database) -> None:
    with Session(database.engine) as session:
        bump_state_version(session)
        session.commit()


def set_cluster(database: Database, **values: Any) -> None:
    with Session(database.engine) as session:
        session.execute(
            update(ClusterRow).where(col(ClusterRow.id) == DEFAULT_CLUSTER).values(**values)
        )
        session.commit()


def next_round(database: Database) -> None:
    set_cluster(database, current_round=ClusterRow.current_round + 1)


def reset(database: Database) -> None:
    set_cluster(database, policy_state=None)


def test_the_memory_is_kept_when_the_cluster_moves_on_during_the_solve(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4)
    jobs = {submit(client, tokens.admin, gpus=2) for _ in "ab"}
    for move in (lambda: bump(database), lambda: next_round(database)):
        reset(database)
        before = (version(database), plan_count(database))

        plan = plan_moving_on(database, move)

        assert (plan.state_version, plan_count(database)) == (before[0], before[1] + 1)
        state = memory(database)
        assert isinstance(state, ShockwaveState), "the latest decision's memory is saved"
        assert state.job_set == jobs and state.planned_at_round == plan.base_round


def test_a_newer_plans_memory_is_not_written_over(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Solves that overlap (several workers): one made at a later version stored first."""
    register(client, tokens.agent, gpus=4)
    submit(client, tokens.admin, gpus=2)
    reset(database)

    def newer_plan_stored() -> None:
        bump(database)
        store_plan(database, [[]], base_round=0)

    plan = plan_moving_on(database, newer_plan_stored)

    assert plan.state_version < version(database)
    assert memory(database) is None, "the newer plan's memory (none here) is kept"
