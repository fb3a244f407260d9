"""Fault injection, short: the chaos run of :mod:`bench.chaos` with one fault of each kind and
a small workload, asserting zero invariant violations (``python -m bench.chaos`` is the long
one, docs/reliability.md). A private Postgres and Redis are started for it; the shared servers
are never touched.

The invariant checks themselves are shown to catch what they look for, on rows made up to
break each one, so a clean run means something.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.chaos import invariants
from bench.chaos.faults import KINDS
from bench.chaos.invariants import Findings
from bench.chaos.run import Config, run
from bench.chaos.workload import Acknowledged
from bench.deployment import deployment, plans
from bench.servers import private_redis
from shockwave_cli.runtime.supervision import wait_until
from store.tables import JobEventRow, JobRow, LeaseRow, RoundRow
from tests.e2e import recording_worker
from tests.e2e.agents import register_fleet, submit_job

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.slow
def test_chaos_short(tmp_path: Path) -> None:
    config = Config(
        seed=7,
        faults=len(KINDS),
        duration_s=50.0,
        jobs=8,
        max_epochs=3,
        apis=2,
        nodes=3,
        drain_s=150.0,
        log_dir=tmp_path,
    )
    result = run(config)
    summary = result.as_json()
    assert set(result.faults_by_kind()) == set(KINDS), summary["faults_by_kind"]
    assert result.findings.counts["jobs_acknowledged"] == config.jobs, summary
    assert result.findings.counts["jobs_succeeded"] == config.jobs, summary
    assert result.findings.counts["events_acknowledged"] > 0, summary
    assert result.ok, summary["violation_examples"]


def _round(index: int, jobs: list[str]) -> RoundRow:
    start = T0 + timedelta(seconds=2 * index)
    return RoundRow(
        cluster_id="default",
        index=index,
        source="plan",
        jobs=jobs,
        started_at=start,
        ends_at=start + timedelta(seconds=2),
    )


def _lease(lease_id: str, job: str, node: str, gpus: list[int], first: int, last: int) -> LeaseRow:
    return LeaseRow(
        id=lease_id,
        job_id=job,
        node_id=node,
        round_index=last,
        gpus=gpus,
        issued_at=T0 + timedelta(seconds=2 * first),
    )


def _job(job_id: str, name: str, state: str, epochs: int = 1) -> JobRow:
    return JobRow(
        id=job_id,
        tenant="default",
        name=name,
        state=state,
        gpus=1,
        epochs=epochs,
        samples_per_epoch=1,
        initial_batch_size=1,
        mode="static",
        batch_size=1,
    )


def _state(job: str, chain: list[str]) -> list[JobEventRow]:
    froms: list[str | None] = [None, *chain[:-1]]
    return [
        JobEventRow(
            job_id=job, kind="state", payload={"to": to} if old is None else {"from": old, "to": to}
        )
        for old, to in zip(froms, chain, strict=True)
    ]


def test_lease_checks_catch_double_leases() -> None:
    rounds = [_round(0, ["a", "b"]), _round(1, ["a", "b"]), _round(2, ["a"])]
    clean = [_lease("l1", "a", "n1", [0], 0, 2), _lease("l2", "b", "n1", [1], 0, 1)]
    found = Findings()
    invariants._leases(found, clean, rounds)
    assert found.total == 0, found.violations

    same_gpu = [_lease("l1", "a", "n1", [0], 0, 2), _lease("l2", "b", "n1", [0], 0, 1)]
    found = Findings()
    invariants._leases(found, same_gpu, rounds)
    assert len(found.violations["gpu_double_leased"]) == 2  # rounds 0 and 1

    twice = [
        _lease("l1", "a", "n1", [0], 0, 2),
        _lease("l2", "b", "n1", [1], 0, 1),
        _lease("l3", "a", "n2", [0], 1, 2),  # a second attempt while the first is live
    ]
    found = Findings()
    invariants._leases(found, twice, rounds)
    assert len(found.violations["job_ran_twice"]) == 2  # rounds 1 and 2

    missing = [_lease("l1", "a", "n1", [0], 0, 2)]
    found = Findings()
    invariants._leases(found, missing, rounds)
    assert found.violations["lease_round_mismatch"], "b was placed without a lease"


def test_job_and_event_checks_catch_loss_and_duplicates() -> None:
    acked = Acknowledged(jobs={"k1": "j1", "k2": "j2"}, submitted=["k1", "k2", "k3"])
    jobs = [_job("j1", "k1", "SUCCEEDED"), _job("j3", "k3", "PENDING"), _job("j4", "k3", "PENDING")]
    found = Findings()
    invariants._jobs_once(found, acked, jobs)
    assert len(found.violations["job_not_once"]) == 2, found.violations  # k2 lost, k3 twice

    events = [JobEventRow(job_id="j1", seq=1, kind="progress", payload={"epoch": 1})]
    found = Findings()
    invariants._events_once(found, [("j1", 1, "progress"), ("j1", 2, "progress")], events)
    assert len(found.violations["event_not_once"]) == 1, found.violations


def test_finish_checks_catch_unfinished_jobs_and_lost_progress() -> None:
    acked = Acknowledged(jobs={"k1": "j1", "k2": "j2", "k3": "j3"})
    jobs = [
        _job("j1", "k1", "SUCCEEDED", epochs=2),
        _job("j2", "k2", "RUNNING"),
        _job("j3", "k3", "SUCCEEDED"),
    ]
    events = [
        *_state("j1", ["PENDING", "RUNNING", "SUCCEEDED"]),
        JobEventRow(job_id="j1", seq=1, kind="progress", payload={"epoch": 1}),
        *_state("j3", ["PENDING", "RUNNING", "SUCCEEDED", "SUCCEEDED"]),
        JobEventRow(job_id="j3", seq=1, kind="progress", payload={"epoch": 1}),
    ]
    found = Findings()
    invariants._finished(found, acked, jobs, events)
    assert len(found.violations["unfinished"]) == 1, found.violations
    assert len(found.violations["lost_progress"]) == 1, found.violations  # j1's epoch 2
    assert len(found.violations["bad_state_chain"]) == 1, found.violations  # j3 twice done


def test_round_checks_catch_holes_and_stalls() -> None:
    ended = (T0 + timedelta(seconds=10)).timestamp()
    found = Findings()
    invariants._rounds(found, [_round(i, []) for i in range(5)], 5.0, ended)
    assert found.total == 0, found.violations

    found = Findings()
    invariants._rounds(found, [_round(0, []), _round(1, []), _round(4, [])], 5.0, ended)
    assert len(found.violations["round_gap"]) == 2, found.violations  # a hole, a 6 s gap

    found = Findings()
    invariants._rounds(found, [_round(i, []) for i in range(2)], 5.0, ended)
    assert found.violations["round_gap"], "rounds stopped 8 s before the end"


def test_planning_check_catches_a_solver_that_never_came_back() -> None:
    found = Findings()
    invariants._planning(found, [10.0, 20.0], [("worker", 5.0), ("redis", 15.0)])
    assert found.total == 0, found.violations
    invariants._planning(found, [10.0, 20.0], [("worker", 25.0)])
    assert len(found.violations["planning_stalled"]) == 1, found.violations


def test_worker_survives_losing_redis_mid_solve(tmp_path: Path) -> None:
    """A regression the chaos run found: with a plan request unacknowledged (acks_late: the
    solve in progress), losing Redis made the worker exit ("Unrecoverable error:
    AttributeError: 'NoneType' object has no attribute 'hostname'") instead of reconnecting,
    so planning stopped for good. It must stay up and plan again once Redis is back."""
    with private_redis() as redis, deployment(tmp_path, broker_url=redis.url) as stack:
        decisions = tmp_path / "decisions"
        recording_worker.start(stack, "slow-worker", record_dir=decisions, delay_s=4.0)
        api = stack.api()
        fleet = register_fleet(stack, api, {"n1": 2})
        try:
            submit_job(stack, api, fleet, name="long", gpus=1, epochs=100)
            wait_until(lambda: any(decisions.glob("solving-*")), 60, "a solve in progress")
            redis.stop()
            worker = stack.services.named("slow-worker")
            time.sleep(3.0)  # the worker notices at once; it used to exit within a second
            assert worker.alive, f"the worker exited on losing Redis:\n{worker.log_tail()}"
            redis.start()
            back = datetime.now(UTC)
            stack.driver()
            wait_until(
                lambda: any(p.created_at > back for p in plans(stack.engine).values()),
                90,
                lambda: f"a plan after Redis came back\n{worker.log_tail()}",
            )
            assert worker.alive, worker.log_tail()
        finally:
            fleet.close()
