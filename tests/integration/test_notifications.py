"""The cross-process wake-ups (store/lease_signal.py) on the real Postgres and Redis: a held
long poll in the API's process is answered as soon as ``shockwave driver``, another process,
commits leases, and the driver is woken by the change the API commits; without the channel
everything falls back to timers.

The recheck interval of the held polls and the driver's tick are set far above what the test
allows, so only the notifications can explain the answers' timing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.app import create_app
from api.settings import Settings
from shockwave_cli.runtime.supervision import Supervised
from store import lease_signal
from store.db import make_engine
from store.lease_signal import CLUSTER, LEASES, Listener
from store.principals import Role
from store.tokens import create_token
from tests.integration.api_calls import bearer
from tests.integration.conftest import (
    NODE,
    POSTGRES_URL,
    REDIS_URL,
    SHOCKWAVE,
    Database,
    migrated_postgres,
    unique_name,
)
from tests.integration.driving import agent_token, register, round_row, submit

RECHECK_S = 30.0
"""The held polls' timer: far longer than any answer below may take."""
TICK_S = 30.0
"""The driver's longest sleep: likewise."""
ROUND_S = 8.0
PROMPT_S = 1.5
"""How soon after the commit a held poll must be answered (well under RECHECK_S)."""


def wait_for(what: str, found: Callable[[], Any], timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"no {what} within {timeout:.0f} s\n{log.read_text()[-3000:]}", pytrace=False)


@pytest.fixture
def schema_database(postgres_server: Engine) -> Iterator[Database]:
    """A Postgres schema of this test's own (channels are per schema: nothing else hears)."""
    with migrated_postgres(postgres_server, "notify_it") as database:
        yield database


@pytest.fixture
def broker(redis_broker: redis.Redis) -> Iterator[str]:
    """A solver queue of the test's own on the real Redis (the driver asks it for plans; no
    worker answers, so rounds come from the greedy fallback), deleted at the end."""
    queue = unique_name("notify_it")
    try:
        yield queue
    finally:
        for key in redis_broker.scan_iter(match=f"*{queue}*"):
            redis_broker.delete(key)


def contact(client: TestClient, token: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/agent/poll", json=body, headers=bearer(token))
    assert response.status_code == 200, response.json()
    answer: dict[str, Any] = response.json()
    return answer


def held(client: TestClient, token: str, **body: Any) -> tuple[threading.Thread, list[Any]]:
    """A long poll in a thread; its answer and the wall time it came, once the thread ends."""
    answers: list[Any] = []

    def run() -> None:
        answer = contact(client, token, **body)
        answers.append((answer, time.time()))

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answers


@pytest.mark.slow
def test_a_held_poll_is_answered_at_once_when_a_driver_in_another_process_commits(
    schema_database: Database, broker: str, tmp_path: Path
) -> None:
    """``shockwave driver`` (its own process, tick 30 s) and the API (this process, held polls
    re-read every 30 s): (1) a job submitted mid-round wakes the driver through the API's
    commit, it fills the node's free GPUs, and the node's held poll gets the lease within
    ``PROMPT_S`` of the submission; (2) a poll held across the next boundary is answered within
    ``PROMPT_S`` of the round's start."""
    database = schema_database
    settings = Settings(
        database_url=database.url, database_schema=database.schema, poll_recheck_s=RECHECK_S
    )
    app = create_app(settings, engine=database.engine)
    agent = agent_token(database, NODE)
    with Session(database.engine) as session:
        admin = create_token(session, Role.ADMIN, name="admin")
    env = {
        **os.environ,
        "SHOCKWAVE_DATABASE_URL": POSTGRES_URL,
        "SHOCKWAVE_DATABASE_SCHEMA": str(database.schema),
        "SHOCKWAVE_BROKER_URL": REDIS_URL,
        "SHOCKWAVE_SOLVER_QUEUE": broker,
        "SHOCKWAVE_SOLVER_MODE": "celery",
        "SHOCKWAVE_TICK_S": f"{TICK_S:g}",
    }
    log = tmp_path / "driver.log"
    argv = [str(SHOCKWAVE), "driver", "--round-seconds", f"{ROUND_S:g}", "--log-level", "info"]
    with TestClient(app) as client:
        signal = app.state.lease_signal
        assert wait_for("live channel", lambda: signal.live, 10.0, log)
        register(client, agent)
        driver = Supervised("driver", argv, env, log, grace_s=10.0).start()
        try:

            def first_round() -> int | None:
                index: int = contact(client, agent)["current_round"]
                return None if index < 0 else index + 1  # round 0 is one

            first = wait_for("first round", first_round, 30.0, log) - 1
            waiting, answers = held(client, agent, wait_s=20.0, seen_round=first)
            time.sleep(0.3)
            assert waiting.is_alive(), "held: nothing is new for the node yet"
            submitted = time.time()
            job = submit(client, admin)
            waiting.join(timeout=25.0)
            ((answer, answered),) = answers
            assert [lease["job_id"] for lease in answer["leases"]] == [job]
            assert answer["current_round"] == first, "a mid-round fill, not the next boundary"
            assert answered - submitted < PROMPT_S, "woken by the notifications, not a timer"

            attempt = answer["leases"][0]["attempt_id"]
            contact(client, agent, running=[attempt])
            waiting, answers = held(client, agent, wait_s=20.0, seen_round=first, running=[attempt])
            waiting.join(timeout=25.0)
            ((answer, answered),) = answers
            assert answer["current_round"] == first + 1
            began = round_row(database, first + 1).started_at.timestamp()
            assert 0.0 <= answered - began < PROMPT_S, "answered at the boundary's commit"
        finally:
            driver.stop()
    assert "work conservation" in log.read_text()


def test_the_listener_comes_back_after_losing_its_connection_and_misses_nothing_after(
    schema_database: Database,
) -> None:
    """The listener's backend is killed: it says the channel is down (the held polls fall back
    to their timer), calls its callbacks once (news may have been missed), reconnects, and the
    next notification reaches it again."""
    database = schema_database
    heard: list[str] = []
    states: list[bool] = []
    listener = Listener(
        database.engine,
        {LEASES: lambda: heard.append(LEASES), CLUSTER: lambda: heard.append(CLUSTER)},
        on_live=states.append,
    )
    listener.start()
    try:
        assert listener.wait_live(10.0)
        heard.clear()
        lease_signal.publish(database.engine, LEASES)
        assert wait_until(lambda: heard == [LEASES])
        with database.engine.begin() as connection:
            killed = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
                )
            ).all()
        assert killed
        assert wait_until(lambda: states[-2:] == [False, True], timeout_s=10.0)
        heard.clear()
        with Session(database.engine) as session:
            lease_signal.announce(session, CLUSTER)
            session.rollback()  # never sent
            lease_signal.announce(session, CLUSTER)
            session.commit()
        assert wait_until(lambda: heard == [CLUSTER])
    finally:
        listener.stop()


def test_without_a_channel_nothing_is_live_and_nothing_fails(tmp_path: Path) -> None:
    """SQLite has no channel; an unreachable Postgres never makes the listener live; sending
    there fails nothing (the data is committed, the listeners read on their timers)."""
    sqlite = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    assert not Listener.supported(sqlite)
    lease_signal.publish(sqlite, LEASES)
    with Session(sqlite) as session:
        lease_signal.announce(session, CLUSTER)
    away = make_engine("postgresql://postgres@127.0.0.1:1/none")
    listener = Listener(away, {LEASES: lambda: None})
    listener.start()
    try:
        assert not listener.wait_live(1.5)
        lease_signal.publish(away, LEASES)
    finally:
        listener.stop()
        away.dispose()
        sqlite.dispose()
    with pytest.raises(ValueError, match="unknown channel"):
        Listener(sqlite, {"jobs": lambda: None})


def wait_until(found: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found():
            return True
        time.sleep(0.01)
    return found()
