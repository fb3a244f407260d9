"""The round driver on Postgres and SQLite, stepped with an injected clock (rounds of 50 ms):
plans become leases on registered nodes, leases are extended or revoked at boundaries, the
fallbacks are used and counted, silent nodes are lost, and on Postgres exactly one driver leads
and a standby takes over when the leader dies (also a real process killed with SIGKILL)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from bench.chaos.invariants import handed_over
from shockwave.domain.stints import received_seconds
from shockwave_cli.runtime.supervision import Supervised, shockwave_argv, wait_until
from solver_service.driver import DriverSettings, RoundDriver, lock_key
from solver_service.leases import at
from store.snapshot import stints_of
from store.tables import ClusterRow, NodeRow, RoundRow
from tests.integration.api_calls import bearer
from tests.integration.conftest import NODE, Database, Tokens, migrated_postgres
from tests.integration.driving import (
    ROUND_S,
    agent_token,
    driver_on,
    job_state,
    leases,
    now,
    register,
    report,
    round_row,
    store_plan,
    submit,
    version,
)

ROOT = Path(__file__).resolve().parents[2]


def two_nodes(client: TestClient, tokens: Tokens, database: Database) -> str:
    """node-1 (the tokens' agent) and node-2, 4 GPUs each; the node-2 agent's token."""
    register(client, tokens.agent)
    other = agent_token(database, "node-2")
    register(client, other)
    return other


def sample(driver: RoundDriver, name: str, **labels: str) -> float | None:
    return driver.metrics.registry.get_sample_value(name, labels)


def rounds_of(source: str, driver: RoundDriver) -> float | None:
    return sample(driver, "shockwave_driver_rounds_total", source=source)


def assert_no_gpu_twice(database: Database) -> None:
    held = [(lease.node_id, g) for lease in leases(database) for g in lease.gpus]
    assert len(held) == len(set(held)), Counter(held).most_common(3)


def test_a_boundary_issues_leases_for_the_plans_first_round_on_registered_nodes(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    two_nodes(client, tokens, database)
    wide = submit(client, tokens.admin, gpus=4)
    pair = submit(client, tokens.admin, gpus=2)
    left_out = submit(client, tokens.admin, gpus=1)  # not in the plan: it fills a free GPU
    plan_id = store_plan(database, [[pair, wide]])

    with driver_on(database) as (driver, _):
        t0 = now()
        assert driver.step(t0)
        assert rounds_of("plan", driver) == 1
        assert sample(driver, "shockwave_driver_plan_solve_seconds") == 0.25
        assert sample(driver, "shockwave_driver_leases_total", action="issued") == 3

    row = round_row(database, 0)
    assert (row.source, row.plan_id, row.jobs) == ("plan", plan_id, [pair, wide, left_out])
    assert (row.leases_issued, row.leases_extended, row.leases_revoked) == (3, 0, 0)
    assert row.plan_age_s is not None and row.plan_age_s >= 0
    issued = {lease.job_id: lease for lease in leases(database)}
    assert set(issued) == {pair, wide, left_out}, "the column, then what fits the free GPUs"
    assert {lease.state for lease in issued.values()} == {"ISSUED"}
    assert issued[wide].gpus == [0, 1, 2, 3], "a node-wide gang takes a whole node"
    assert len(issued[pair].gpus) == 2 and issued[pair].node_id != issued[wide].node_id
    assert {lease.round_index for lease in issued.values()} == {0}
    assert_no_gpu_twice(database)
    with Session(database.engine) as session:
        cluster = session.get(ClusterRow, "default")
        assert cluster is not None
        assert cluster.current_round == 0 and cluster.round_seconds == ROUND_S
        assert cluster.round_ends_at is not None
        assert abs(cluster.round_ends_at.timestamp() - (t0 + ROUND_S)) < 1e-3
    assert all(abs(le.ends_at.timestamp() - (t0 + ROUND_S)) < 1e-3 for le in issued.values())


def test_schedule_shows_the_current_round_its_source_and_plan_per_role(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    assert client.get("/v1/schedule", headers=bearer(tokens.admin)).json()["round"] is None
    two_nodes(client, tokens, database)
    mine = submit(client, tokens.user_a)
    theirs = submit(client, tokens.user_b)
    plan_id = store_plan(database, [[mine, theirs]])
    with driver_on(database) as (driver, _):
        assert driver.step(now())

    admin = client.get("/v1/schedule", headers=bearer(tokens.admin)).json()
    assert admin["round"] == 0
    assert admin["plan"]["source"] == "plan" and admin["plan"]["plan"]["id"] == plan_id
    assert sorted(admin["plan"]["jobs"]) == sorted([mine, theirs])
    waiting = client.get(f"/v1/jobs/{mine}/prediction", headers=bearer(tokens.user_a)).json()
    assert waiting["planned_rounds"] == [0], waiting["reason"]
    user = client.get("/v1/schedule", headers=bearer(tokens.user_a)).json()
    assert user["plan"]["jobs"] == [mine], "a user sees only its own tenant's jobs"
    assert user["plan"]["running_jobs"] == 2


def test_a_gang_wider_than_a_node_gets_one_attempt_per_node_and_keeps_them(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    two_nodes(client, tokens, database)
    gang = submit(client, tokens.admin, gpus=8)
    store_plan(database, [[gang], [gang]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        first = leases(database)
        driver.step(t0 + ROUND_S)
    assert sorted((le.node_id, le.gpus) for le in first) == [
        ("node-1", [0, 1, 2, 3]),
        ("node-2", [0, 1, 2, 3]),
    ]
    second = leases(database)
    assert {le.id for le in second} == {le.id for le in first}
    assert {le.round_index for le in second} == {1}
    assert round_row(database, 1).leases_extended == 2


def test_continuing_jobs_keep_attempts_and_gpus_and_dropped_jobs_are_revoked(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    two_nodes(client, tokens, database)
    a, b, c = (submit(client, tokens.admin, gpus=4, name=n) for n in "abc")
    store_plan(database, [[a, b], [a, c]])

    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        first = {lease.job_id: lease for lease in leases(database)}
        assert set(first) == {a, b}
        assert not driver.step(t0 + ROUND_S * 0.2), "nothing is due early in a round"
        assert driver.step(t0 + ROUND_S)

    second = {lease.job_id: lease for lease in leases(database)}
    assert set(second) == {a, c}
    assert second[a].id == first[a].id, "a continuing job keeps its attempt"
    assert (second[a].node_id, second[a].gpus) == (first[a].node_id, first[a].gpus)
    assert second[a].round_index == 1
    assert second[a].ends_at > first[a].ends_at
    assert second[c].id not in {lease.id for lease in first.values()}
    assert second[c].node_id == first[b].node_id, "c takes the node b left"
    revoked = leases(database, states=("REVOKED",))
    assert [lease.id for lease in revoked] == [first[b].id]
    row = round_row(database, 1)
    assert (row.leases_issued, row.leases_extended, row.leases_revoked) == (1, 1, 1)
    assert sample(driver, "shockwave_driver_leases_total", action="extended") == 1
    assert_no_gpu_twice(database)


def test_leases_give_each_jobs_stints_from_the_boundary_and_the_restore_rule_counts_them(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Round 1 is begun early (a lead of 10%): the lease it issues counts from the boundary,
    not from its issue; the continuing job's stint runs on from round 0 with its first lease's
    end kept; the revoked one's ends at its lease's end. Gavel's received service is those
    stints less the restore per start (the simulator's rule)."""
    two_nodes(client, tokens, database)
    a, b, c = (submit(client, tokens.admin, gpus=4, name=n) for n in "abc")
    store_plan(database, [[a, b], [a, c]])
    with driver_on(database, lead_s=0.2 * ROUND_S) as (driver, _):
        t0 = now()
        driver.step(t0)
        driver.step(t0 + 0.9 * ROUND_S)
    with Session(database.engine) as session:
        stints = stints_of(session, [a, b, c], at(t0 + 1.5 * ROUND_S))
    boundary, end = t0 + ROUND_S, t0 + 2 * ROUND_S
    expected = {
        a: [(t0, boundary, end)],  # extended: one stint, first lease to the boundary
        b: [(t0, boundary, boundary)],  # revoked at round 1's start: trains to its lease's end
        c: [(boundary, end, end)],  # issued 10% early, counts from the boundary
    }
    got = {j: [(s.began_s, s.first_end_s, s.end_s) for s in stints[j]] for j in expected}
    for job, spans in expected.items():
        assert len(got[job]) == len(spans), job
        for have, want in zip(got[job], spans, strict=True):
            assert have == pytest.approx(want, abs=1e-3), job
    restore, guard = 0.1 * ROUND_S, 0.05 * ROUND_S
    assert received_seconds(stints[a], restore, guard) == pytest.approx(1.9 * ROUND_S, abs=1e-3)
    assert received_seconds(stints[c], restore, guard) == pytest.approx(0.9 * ROUND_S, abs=1e-3)


def test_without_a_plan_a_greedy_round_fills_the_gpus_and_counts_as_a_fallback(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4)
    first = submit(client, tokens.admin, gpus=2)
    blocked = submit(client, tokens.admin, gpus=4)
    backfill = submit(client, tokens.admin, gpus=2)

    with driver_on(database) as (driver, _):
        driver.step(now())
        assert rounds_of("greedy", driver) == 1
        assert rounds_of("plan", driver) == rounds_of("previous_plan", driver) == 0
        assert math.isnan(sample(driver, "shockwave_driver_plan_age_seconds") or 0.0)

    row = round_row(database, 0)
    assert (row.source, row.plan_id, row.plan_age_s) == ("greedy", None, None)
    assert row.jobs == [first, backfill], "arrival order; a later narrow job backfills"
    assert blocked not in {lease.job_id for lease in leases(database)}
    assert_no_gpu_twice(database)


def test_a_stale_plan_gives_its_column_for_the_round_filled_with_waiting_jobs(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4)
    a, b = submit(client, tokens.admin, gpus=2), submit(client, tokens.admin, gpus=1)
    plan_id = store_plan(database, [[b]])
    late = submit(client, tokens.admin, gpus=1)
    assert version(database) > 0

    with driver_on(database) as (driver, _):
        driver.step(now())
        assert rounds_of("previous_plan", driver) == 1

    row = round_row(database, 0)
    assert (row.source, row.plan_id) == ("previous_plan", plan_id)
    assert row.jobs == [b, a, late], "the plan's column first, then waiting jobs that fit"


def test_a_plan_stored_while_the_boundary_waited_is_used_not_greedy(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """The boundary's time is read before its reads; a plan committed in between is stamped
    later than it. It is on hand all the same: the engine took it for one not back yet and
    the round went first in, first out (21 such rounds in one loaded replay)."""
    register(client, tokens.agent, gpus=4)
    a, b = submit(client, tokens.admin, gpus=2), submit(client, tokens.admin, gpus=2)
    due = now()
    plan_id = store_plan(database, [[b]])

    with driver_on(database) as (driver, _):
        driver.step(due)
        assert rounds_of("greedy", driver) == 0

    row = round_row(database, 0)
    assert (row.source, row.plan_id) == ("plan", plan_id)
    assert row.jobs == [b, a], "the plan's column first (greedy: arrival order)"


def test_a_boundary_with_no_plan_for_its_round_repeats_the_newest_plans_decision(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """A one-round plan (Gavel's) and the next not back by the boundary: round 1 repeats
    round 0's jobs (``previous_plan``), where first in, first out would swap them."""
    register(client, tokens.agent, gpus=2)
    first, second = submit(client, tokens.admin, gpus=2), submit(client, tokens.admin, gpus=2)
    plan_id = store_plan(database, [[second]])

    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        driver.step(t0 + ROUND_S)
        assert rounds_of("greedy", driver) == 0

    assert [round_row(database, r).jobs for r in range(2)] == [[second], [second]]
    assert (round_row(database, 1).source, round_row(database, 1).plan_id) == (
        "previous_plan",
        plan_id,
    )
    assert first not in {lease.job_id for lease in leases(database)}


def test_a_fresh_plan_beats_an_older_one_and_later_columns_are_used_in_turn(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=1)
    a, b = submit(client, tokens.admin), submit(client, tokens.admin)
    store_plan(database, [[a], [a], [a]], at=version(database) - 1)
    fresh = store_plan(database, [[b], [a]])

    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        driver.step(t0 + ROUND_S)
        driver.step(t0 + 2 * ROUND_S)

    assert [round_row(database, r).jobs for r in range(3)] == [[b], [a], [a]]
    assert [round_row(database, r).source for r in range(3)] == ["plan", "plan", "previous_plan"]
    assert round_row(database, 1).plan_id == fresh


def test_the_driver_asks_for_the_next_plan_once_a_round_half_way_once_plans_come_back(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Nothing measured yet: the first round's request goes at its start. Its plan comes
    back at once, so the next round's goes half-way, once."""
    register(client, tokens.agent)
    job = submit(client, tokens.admin)
    with driver_on(database, round_s=10.0) as (driver, requests):
        t0 = now()
        driver.step(t0)
        assert requests.calls == [("default", version(database))]
        store_plan(database, [[job], [job]], base_round=1)
        assert not driver.step(t0 + 5.0)
        driver.step(t0 + 10.0)
        assert round_row(database, 1).source == "plan"
        driver.step(t0 + 14.9)
        assert len(requests.calls) == 1
        assert driver.step(t0 + 15.0)
        assert requests.calls[1:] == [("default", version(database))]
        assert not driver.step(t0 + 16.0)
        assert len(requests.calls) == 2


def test_a_request_not_answered_by_the_boundary_moves_the_next_one_earlier(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Round 1's plan is stored at the version asked: round 2's is asked half-way. Round 2's
    never comes (the boundary runs on round 1's plan, older than asked): the plan had the 5 s
    to the boundary and more, so round 3's is asked twice that ahead: at once."""
    register(client, tokens.agent)
    job = submit(client, tokens.admin)
    with driver_on(database, round_s=10.0) as (driver, requests):
        t0 = now()
        driver.step(t0)
        asked = requests.calls[-1][1]
        store_plan(database, [[job], [job], [job]], base_round=1, at=asked)
        driver.step(t0 + 10.0)
        assert round_row(database, 1).source == "plan"
        submit(client, tokens.admin)  # round 2's plan is asked past the stored plan's version
        driver.step(t0 + 14.9)
        assert len(requests.calls) == 1, "answered: not asked before half-way"
        driver.step(t0 + 15.0)
        assert requests.calls[-1] == ("default", version(database)) != ("default", asked)
        driver.step(t0 + 20.0)
        assert round_row(database, 2).source == "previous_plan"
        assert len(requests.calls) == 3, "round 3's plan asked at its start"


def test_a_boundary_a_little_late_keeps_the_cadence(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """Begun 30% of a round after it was due, round 1 still ends a round after round 0 did: a
    little lateness each round does not add up."""
    register(client, tokens.agent)
    submit(client, tokens.admin)
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        driver.step(t0 + 1.3 * ROUND_S)
    row = round_row(database, 1)
    assert abs(row.started_at.timestamp() - (t0 + 1.3 * ROUND_S)) < 1e-3
    assert abs(row.ends_at.timestamp() - (t0 + 2 * ROUND_S)) < 1e-3
    assert all(abs(le.ends_at.timestamp() - (t0 + 2 * ROUND_S)) < 1e-3 for le in leases(database))


def test_a_boundary_lead_begins_the_next_round_early_and_keeps_the_cadence(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """With a lead of 20% of a round, round 1 is not begun 30% of a round before round 0
    ends, is begun 10% before, and still ends a round after round 0 did: its leases are out
    before the boundary, and the next boundary is due a lead before its end again."""
    register(client, tokens.agent)
    submit(client, tokens.admin)
    lead = 0.2 * ROUND_S
    with driver_on(database, lead_s=lead) as (driver, _):
        t0 = now()
        driver.step(t0)
        driver.step(t0 + 0.7 * ROUND_S)
        assert count_rounds(database) == 1
        driver.step(t0 + 0.9 * ROUND_S)
        row = round_row(database, 1)
        assert abs(row.started_at.timestamp() - (t0 + 0.9 * ROUND_S)) < 1e-3
        assert abs(row.ends_at.timestamp() - (t0 + 2 * ROUND_S)) < 1e-3
        assert all(
            abs(le.ends_at.timestamp() - (t0 + 2 * ROUND_S)) < 1e-3 for le in leases(database)
        )
        driver.step(t0 + 1.5 * ROUND_S)  # half-way: the plan is asked for
        assert abs(driver._pause(t0 + 1.5 * ROUND_S) - 0.3 * ROUND_S) < 1e-3
        driver.step(t0 + 1.85 * ROUND_S)
    assert abs(round_row(database, 2).ends_at.timestamp() - (t0 + 3 * ROUND_S)) < 1e-3


def test_a_late_boundary_starts_the_next_round_now_and_never_skips_one(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent)
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        late = t0 + 40 * ROUND_S
        driver.step(late)
    row = round_row(database, 1)
    assert abs(row.started_at.timestamp() - late) < 1e-3
    assert abs(row.ends_at.timestamp() - (late + ROUND_S)) < 1e-3
    with Session(database.engine) as session:
        assert len(session.exec(select(RoundRow)).all()) == 2


def test_a_silent_node_is_lost_and_its_jobs_go_back_to_the_queue(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=2)
    resumable, fresh = submit(client, tokens.admin), submit(client, tokens.admin)
    with driver_on(database, ttl_s=30.0) as (driver, requests):
        t0 = now()
        driver.step(t0)
        first = {lease.job_id: lease.id for lease in leases(database)}
        assert set(first) == {resumable, fresh}
        for attempt in first.values():
            report(client, tokens.agent, attempt, "started")
        report(client, tokens.agent, first[resumable], "checkpointed")
        assert job_state(database, resumable) == "SUSPENDED"
        driver.step(t0 + ROUND_S)
        restarted = next(le.id for le in leases(database) if le.job_id == resumable)
        report(client, tokens.agent, restarted, "running")
        assert job_state(database, resumable) == job_state(database, fresh) == "RUNNING"
        before = version(database)

        assert driver.step(t0 + ROUND_S * 1.2 + 31.0)

        assert requests.calls[-1] == ("default", before + 1)
    assert version(database) == before + 1
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None and node.state == "LOST"
    assert leases(database) == []
    assert {lease.id for lease in leases(database, states=("LOST",))} == {
        restarted,
        first[fresh],
    }
    assert job_state(database, resumable) == "SUSPENDED", "resumes from its checkpoint"
    assert job_state(database, fresh) == "PENDING", "no checkpoint: starts over"
    assert sample(driver, "shockwave_driver_nodes_lost_total") == 1


def test_heartbeats_keep_a_node_ready_until_they_stop_for_the_ttl(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent)
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None
        node.last_heartbeat_at = at(now() - 60)
        session.add(node)
        session.commit()
    assert client.post("/v1/agent/heartbeat", headers=bearer(tokens.agent)).status_code == 200
    with driver_on(database, ttl_s=30.0) as (driver, _):
        driver.step(now() + 25)
        assert node_state(database) == "READY"
        driver.step(now() + 31)
        assert node_state(database) == "LOST"


def node_state(database: Database) -> str:
    with Session(database.engine) as session:
        node = session.get(NodeRow, NODE)
        assert node is not None
        return node.state


# --- one active driver (Postgres) -------------------------------------------------------------


@pytest.fixture(scope="module")
def postgres_database(postgres_server: Engine) -> Iterator[Database]:
    """A migrated Postgres schema of this module's own: only Postgres has the advisory lock
    (the embedded SQLite deployment runs one driver in one process)."""
    with migrated_postgres(postgres_server, "it_drv") as database:
        yield database


@pytest.fixture
def postgres(postgres_database: Database) -> Database:
    postgres_database.empty()
    return postgres_database


def lock_holder(database: Database) -> int | None:
    """The backend pid holding the driver's advisory lock, if any."""
    key = lock_key("default", database.schema) & 0xFFFFFFFFFFFFFFFF
    with database.engine.connect() as connection:
        return connection.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = :high AND objid = :low AND objsubid = 1"
            ),
            {"high": key >> 32, "low": key & 0xFFFFFFFF},
        ).scalar()


def test_two_drivers_one_leads_and_the_standby_takes_over_when_its_connection_dies(
    postgres: Database,
) -> None:
    with driver_on(postgres) as (first, _), driver_on(postgres) as (second, _):
        t0 = now()
        assert first.step(t0) and first.is_leader
        assert not second.step(t0) and not second.is_leader
        assert not second.step(t0 + ROUND_S), "a standby never starts a round"
        assert sample(second, "shockwave_driver_leader") == 0
        assert sample(first, "shockwave_driver_leader") == 1
        holder = lock_holder(postgres)
        assert holder is not None

        with postgres.engine.connect() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder})
            connection.commit()
        deadline = time.monotonic() + 5
        while lock_holder(postgres) is not None and time.monotonic() < deadline:
            time.sleep(0.01)

        assert second.step(t0 + ROUND_S) and second.is_leader
        assert not first.step(t0 + ROUND_S) and not first.is_leader
    assert [round_row(postgres, r).index for r in (0, 1)] == [0, 1]


def test_a_standby_takes_over_within_two_rounds_when_the_driver_process_is_killed(
    postgres: Database, tmp_path: Path
) -> None:
    """A real `shockwave driver` (rounds of 1 s) killed with SIGKILL mid-round."""
    round_s = 1.0
    env = {
        **os.environ,
        "SHOCKWAVE_DATABASE_URL": postgres.url,
        "SHOCKWAVE_DATABASE_SCHEMA": postgres.schema or "",
        "SHOCKWAVE_SOLVER_MODE": "inline",
        "SHOCKWAVE_TICK_S": "0.05",
    }
    command = [*shockwave_argv(), "driver", "--round-seconds", "1"]
    process = Supervised("the driver", command, env, tmp_path / "driver.log", ROOT).start()
    stop = threading.Event()
    standby_thread: threading.Thread | None = None
    try:
        wait_for(lambda: count_rounds(postgres) >= 2, 20, process)
        settings = DriverSettings(
            database_url=postgres.url, database_schema=postgres.schema, tick_s=0.05
        )
        standby = RoundDriver(postgres.engine, settings)
        standby_thread = threading.Thread(target=standby.run, args=(stop,), daemon=True)
        standby_thread.start()
        time.sleep(0.3)
        assert not standby.is_leader
        led = count_rounds(postgres)

        process.kill()
        killed_at = time.time()

        wait_for(lambda: count_rounds(postgres) > led, 2 * round_s)
        assert standby.is_leader
        assert time.time() - killed_at <= 2 * round_s
    finally:
        stop.set()
        process.kill()
        if standby_thread is not None:
            standby_thread.join(5)
    indices = sorted(r.index for r in all_rounds(postgres))
    assert indices == list(range(len(indices))), "no round skipped or repeated"


def count_rounds(database: Database) -> int:
    return len(all_rounds(database))


def all_rounds(database: Database) -> list[RoundRow]:
    with Session(database.engine) as session:
        return list(session.exec(select(RoundRow).order_by(col(RoundRow.index))).all())


def wait_for(
    condition: Callable[[], bool], timeout: float, process: Supervised | None = None
) -> None:
    """Wait until ``condition`` holds (polling every 20 ms); fail if ``process`` exits."""

    def holds() -> bool:
        if process is not None and not process.alive:
            raise AssertionError(f"{process.name} exited: {process.log_tail()}")
        return condition()

    wait_until(holds, timeout, "the condition", poll_s=0.02)


def test_mixed_node_sizes_are_used_in_full(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=8)
    register(client, agent_token(database, "node-2"), gpus=4)
    register(client, agent_token(database, "node-3"), gpus=2)
    eight = submit(client, tokens.admin, gpus=8)
    others = [submit(client, tokens.admin, gpus=w) for w in (2, 2, 1, 1)]

    with driver_on(database) as (driver, _):
        driver.step(now())
        outcome = driver.last_round
        assert outcome is not None and outcome.unfit == {}

    held = {(lease.node_id, g) for lease in leases(database) for g in lease.gpus}
    assert len(held) == 14, "every GPU of the 8-, 4- and 2-GPU nodes is leased"
    by_job = {lease.job_id: lease for lease in leases(database)}
    assert set(by_job) == {eight, *others}, "no GPU idles while a job that fits waits"
    assert by_job[eight].node_id == NODE and len(by_job[eight].gpus) == 8
    assert_no_gpu_twice(database)


def test_a_job_wider_than_the_ready_nodes_waits_with_its_reason_and_others_run(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4)
    wide = submit(client, tokens.admin, gpus=8)
    small = submit(client, tokens.admin, gpus=1)
    with driver_on(database) as (driver, _):
        driver.step(now())
        outcome = driver.last_round
    assert outcome is not None and wide in outcome.unfit
    assert "it needs 8, the READY nodes have 4" in outcome.unfit[wide]
    assert {lease.job_id for lease in leases(database)} == {small}
    assert job_state(database, wide) == "PENDING"
    body = client.get(f"/v1/jobs/{wide}", headers=bearer(tokens.admin)).json()
    assert body["waiting_reason"] == outcome.unfit[wide]
    assert (
        client.get(f"/v1/jobs/{small}", headers=bearer(tokens.admin)).json()["waiting_reason"]
        is None
    )
    prediction = client.get(f"/v1/jobs/{wide}/prediction", headers=bearer(tokens.admin)).json()
    # the same capacity rule, knowing every registered GPU: none of them could hold the gang
    assert prediction["cause"] == "unschedulable"
    assert "it needs 8 GPUs and the cluster has 4" in prediction["reason"]


def test_gpus_freed_mid_round_and_a_new_arrival_start_waiting_jobs_at_once(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=4)
    first = submit(client, tokens.admin, gpus=4)
    second = submit(client, tokens.admin, gpus=2)
    with driver_on(database, round_s=3600.0) as (driver, _):
        t0 = now()
        driver.step(t0)
        (lease,) = leases(database)
        assert lease.job_id == first
        assert not driver.step(t0 + 1), "nothing changed: nothing to fill"
        report(client, tokens.agent, lease.id, "running")
        report(client, tokens.agent, lease.id, "exited", 0)
        assert driver.step(t0 + 2), "the freed GPUs go to the waiting job, not at the boundary"
        fill = driver.last_fill
        assert fill is not None and fill.jobs == (second,) and fill.round_index == 0
        third = submit(client, tokens.admin, gpus=2)
        assert driver.step(t0 + 3)
        assert sample(driver, "shockwave_driver_fill_jobs_total") == 2
    live = {le.job_id: le for le in leases(database)}
    assert set(live) == {second, third}
    assert {le.round_index for le in live.values()} == {0}
    assert all(abs(le.ends_at.timestamp() - (t0 + 3600.0)) < 1e-3 for le in live.values())
    assert_no_gpu_twice(database)


def test_a_fill_is_stamped_after_the_exit_report_that_freed_its_gpus_even_mid_step(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """The step's time was read before the exit report committed (the report raced the step,
    as in the chaos runs); the fill that takes the freed GPUs is still stamped after the
    report, so the exited lease handed them over (the chaos checker's rule) and no GPU was
    leased twice at once."""
    register(client, tokens.agent, gpus=4)
    first = submit(client, tokens.admin, gpus=4)
    second = submit(client, tokens.admin, gpus=4)
    with driver_on(database, round_s=3600.0) as (driver, _):
        driver.step(now())
        (lease,) = leases(database)
        assert lease.job_id == first
        report(client, tokens.agent, lease.id, "running")
        step_began = now()
        report(client, tokens.agent, lease.id, "exited", 0)
        assert driver.step(step_began)
        assert driver.last_fill is not None and driver.last_fill.jobs == (second,)
    (exited,) = leases(database, states=("EXITED",))
    (filled,) = leases(database)
    assert filled.job_id == second and filled.gpus == exited.gpus
    assert filled.issued_at >= exited.updated_at, (filled.issued_at, exited.updated_at)
    assert handed_over(exited, filled)


def test_an_elastic_job_is_leased_the_plans_count_and_a_new_count_is_a_new_attempt(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    two_nodes(client, tokens, database)
    elastic = {"min_gpus": 1, "max_gpus": 8, "speedup": {"4": {"32": 3.1}}}
    job = submit(client, tokens.admin, gpus=2, elastic=elastic)
    rigid = submit(client, tokens.admin, gpus=2)
    # A plan may not widen a rigid job: the driver leases its requested count.
    store_plan(database, [[job, rigid]], widths={job: 4, rigid: 4})
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        first = {lease.job_id: lease for lease in leases(database)}
        assert len(first[job].gpus) == 4
        assert len(first[rigid].gpus) == 2
        store_plan(database, [[job, rigid]], base_round=1, widths={job: 1})
        driver.step(t0 + ROUND_S)
    second = {lease.job_id: lease for lease in leases(database)}
    assert len(second[job].gpus) == 1
    assert second[job].id != first[job].id, "another count is another attempt"
    assert second[rigid].id == first[rigid].id
    assert_no_gpu_twice(database)


def test_a_fill_follows_the_plan_the_round_began_with_not_one_made_since(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    """As in the simulator, whose fills know only the plans made by the round's boundary: the
    GPUs an exit frees mid-round go to the job that plan wants next round (``late``), not to
    the one a plan stored since wants (``early``, first in arrival order too)."""
    register(client, tokens.agent, gpus=4)
    first = submit(client, tokens.admin, gpus=4)
    early, late = submit(client, tokens.admin, gpus=4), submit(client, tokens.admin, gpus=4)
    store_plan(database, [[first], [late]])
    with driver_on(database, round_s=3600.0) as (driver, _):
        driver.step(now())
        (lease,) = leases(database)
        assert lease.job_id == first
        store_plan(database, [[early]], base_round=1)  # a decision made since the boundary
        report(client, tokens.agent, lease.id, "running")
        report(client, tokens.agent, lease.id, "exited", 0)
        assert driver.step(now())
        assert driver.last_fill is not None and driver.last_fill.jobs == (late,)
