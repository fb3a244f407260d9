"""Fault tests with real processes (SPEC section 7: any process may be killed at any time).

- kill -9 the solver worker in the middle of a solve: rounds keep coming from the fallbacks
  (counted as such by the driver), and planning resumes once a worker runs again;
- kill -9 the active round driver: the standby, started beforehand, takes over within two
  rounds, without skipping or repeating a round;
- stop Redis (a private server; the shared one is never touched): the API still accepts jobs
  and events, all of them stored; when Redis is back, plans resume and cover what came in.

Each test drives simulated agents (:mod:`tests.e2e.agents`) in its own bounded loops; every
process is stopped at the end whatever happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlmodel import Session, col, func, select

from bench.deployment import (
    ROUND_SECONDS,
    Deployment,
    deployment,
    driver_metrics,
    job_states,
    plans,
    rounds,
)
from bench.servers import private_redis
from store.tables import ClusterRow, JobEventRow, RoundRow
from tests.e2e import recording_worker
from tests.e2e.agents import Fleet, register_fleet, submit_job

TICK_S = 0.2
FALLBACKS = ("previous_plan", "greedy")
LONG_JOBS = [("long-a", 1, 100), ("long-b", 2, 100), ("long-c", 2, 100)]
"""Jobs that outlast every test, so there is always something to schedule."""


def drive(fleet: Fleet, condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Tick the agents until ``condition`` holds; the seconds it took. Fails after
    ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        fleet.tick()
        time.sleep(TICK_S)
    return time.monotonic() - started


def start_cluster(stack: Deployment, api: str) -> Fleet:
    fleet = register_fleet(stack, api, {"n1": 2, "n2": 2})
    for name, gpus, epochs in LONG_JOBS:
        submit_job(stack, api, fleet, name=name, gpus=gpus, epochs=epochs)
    return fleet


def round_count(stack: Deployment) -> int:
    return len(rounds(stack.engine))


def rounds_since(stack: Deployment, first: int) -> list[RoundRow]:
    return [r for r in rounds(stack.engine) if r.index >= first]


def fallback_count(port: int) -> float:
    metrics = driver_metrics(port)
    return sum(metrics.get(f"shockwave_driver_rounds_total{{source={s}}}", 0.0) for s in FALLBACKS)


def test_worker_killed_mid_solve(tmp_path: Path) -> None:
    with deployment(tmp_path) as stack:
        decisions = tmp_path / "decisions"
        recording_worker.start(stack, "slow-worker", record_dir=decisions, delay_s=20.0)
        api = stack.api()
        fleet = start_cluster(stack, api)
        try:
            metrics_port = stack.driver()
            drive(
                fleet,
                lambda: any(decisions.glob("solving-*")) and round_count(stack) >= 1,
                30,
                "the slow worker to start solving and the first round",
            )
            assert not plans(stack.engine), "a plan was stored before the solve could finish"
            stack.services.named("slow-worker").kill()
            killed_at = round_count(stack)

            drive(fleet, lambda: round_count(stack) >= killed_at + 3, 5 * ROUND_SECONDS, "rounds")
            outage = rounds_since(stack, killed_at)
            assert [r.index for r in outage] == list(range(killed_at, killed_at + len(outage)))
            assert {r.source for r in outage} <= set(FALLBACKS), [r.source for r in outage]
            assert not plans(stack.engine), "the killed solve stored a plan"
            all_rounds = rounds(stack.engine)
            fallbacks = sum(r.source in FALLBACKS for r in all_rounds)
            drive(
                fleet,
                lambda: fallback_count(metrics_port) >= fallbacks,
                3,
                f"the driver's metrics to count {fallbacks} fallback rounds",
            )
            assert all(r.jobs for r in outage), "fallback rounds ran nothing"

            stack.worker("worker")
            restarted_at = round_count(stack)
            drive(
                fleet,
                lambda: any(r.source == "plan" for r in rounds_since(stack, restarted_at)),
                30,
                "a round from a fresh plan after the worker restarted",
            )
            assert plans(stack.engine)
            issued = rounds(stack.engine)
            assert [r.index for r in issued] == list(range(len(issued)))
        finally:
            fleet.close()


def leader(ports: dict[str, int]) -> str | None:
    leading = [
        name
        for name, port in ports.items()
        if driver_metrics(port).get("shockwave_driver_leader") == 1.0
    ]
    assert len(leading) <= 1, f"two active drivers: {leading}"
    return leading[0] if leading else None


def test_standby_driver_takes_over(tmp_path: Path) -> None:
    with deployment(tmp_path) as stack:
        stack.worker()
        api = stack.api()
        fleet = start_cluster(stack, api)
        try:
            ports = {"driver-a": stack.driver("driver-a"), "driver-b": stack.driver("driver-b")}
            drive(
                fleet,
                lambda: round_count(stack) >= 2 and leader(ports) is not None,
                30,
                "two rounds and an active driver",
            )
            active = leader(ports)
            assert active is not None
            standby = next(name for name in ports if name != active)
            assert driver_metrics(ports[standby]).get("shockwave_driver_leader") == 0.0

            stack.services.named(active).kill()
            killed = time.time()
            last = rounds(stack.engine)[-1]

            waited = drive(
                fleet,
                lambda: round_count(stack) > last.index + 1,
                2 * ROUND_SECONDS + 5,
                "the standby's first round",
            )
            takeover = rounds_since(stack, last.index + 1)[0]
            assert takeover.index == last.index + 1
            delay = takeover.started_at.timestamp() - max(killed, last.ends_at.timestamp())
            assert delay <= 2 * ROUND_SECONDS, (delay, waited)
            assert leader({standby: ports[standby]}) == standby

            drive(
                fleet,
                lambda: round_count(stack) > takeover.index + 2,
                3 * ROUND_SECONDS + 2,
                "rounds after the takeover",
            )
            issued = rounds(stack.engine)
            assert [r.index for r in issued] == list(range(len(issued)))
            assert set(job_states(stack.engine).values()) <= {"PENDING", "RUNNING", "SUSPENDED"}
        finally:
            fleet.close()


def test_api_keeps_accepting_while_redis_is_down(tmp_path: Path) -> None:
    with private_redis() as redis, deployment(tmp_path, broker_url=redis.url) as stack:
        stack.worker()
        api = stack.api()
        fleet = start_cluster(stack, api)
        try:
            stack.driver()
            drive(
                fleet,
                lambda: any(r.source == "plan" for r in rounds(stack.engine)),
                30,
                "a round from a fresh plan",
            )
            redis.stop()
            stopped_at = round_count(stack)
            accepted = []
            for i in range(4):
                began = time.monotonic()
                job = submit_job(stack, api, fleet, name=f"during-outage-{i}", gpus=1, epochs=50)
                assert time.monotonic() - began < 3.0, "a submission waited on the broker"
                accepted.append(job.id)
            scaled = next(iter(fleet.jobs.values()))
            response = httpx.post(
                f"{api}/v1/jobs/{scaled.id}/events",
                json={"seq": 1000, "kind": "scaling", "batch_size": 64, "epoch": 10},
                headers={"Authorization": f"Bearer {stack.admin_token}"},
                timeout=10.0,
            )
            assert response.status_code == 201, response.text
            drive(
                fleet,
                lambda: round_count(stack) >= stopped_at + 2,
                4 * ROUND_SECONDS + 2,
                "rounds while Redis is down",
            )
            progress_events = count_events(stack, "progress")
            assert progress_events > 0, "the agents' progress events were not stored"

            states = job_states(stack.engine)
            assert set(accepted) <= set(states), "a job accepted during the outage is missing"
            assert count_events(stack, "scaling") == 1
            with Session(stack.engine) as session:
                cluster = session.get(ClusterRow, "default")
                assert cluster is not None
                version_at_restart = cluster.state_version

            redis.start()
            restarted = datetime.now(UTC)
            drive(
                fleet,
                lambda: any(
                    p.created_at >= restarted and p.state_version >= version_at_restart
                    for p in plans(stack.engine).values()
                ),
                40,
                "a plan, after Redis came back, that covers what came in while it was down",
            )
            fresh = next(
                p
                for p in plans(stack.engine).values()
                if p.created_at >= restarted and p.state_version >= version_at_restart
            )
            assert fresh.rounds and fresh.rounds[0], fresh.rounds
            assert count_events(stack, "progress") >= progress_events
        finally:
            fleet.close()


def count_events(stack: Deployment, kind: str) -> int:
    with Session(stack.engine) as session:
        return int(
            session.exec(
                select(func.count()).select_from(JobEventRow).where(col(JobEventRow.kind) == kind)
            ).one()
        )
