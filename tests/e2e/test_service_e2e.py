"""The whole distributed service with real processes: Postgres, Redis, the API, a Celery solver
worker and the round driver, with test clients acting as two node agents.

Jobs are submitted over HTTP; the worker plans, the driver issues leases every 2 s round, the
agents poll, start attempts, "train" one epoch per leased round (progress events with the job's
own token) and report ``exited 0`` when a job's epochs are done. Every job must reach SUCCEEDED
within a bound, and the schedule must be the one the core decides:

- rounds are numbered 0, 1, 2, ... without a gap, each 2 s long;
- while each round is current, the leases of that round are exactly its jobs, each job on as
  many GPUs as it asked for, no GPU given twice; the agents saw the same leases;
- a round made from a fresh plan runs the plan's first column, plus (work conservation) waiting
  jobs on the GPUs it leaves free or that free up during the round (the round's record lists
  every job leased in it);
- each plan's first column is what the core's policy decides, in this test's process, for the
  snapshot and params the worker decided from (recorded by :mod:`tests.e2e.recording_worker`,
  which runs the real ``shockwave worker`` command).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from bench.deployment import ROUND_SECONDS, deployment, job_states, plans, rounds
from shockwave.domain import state_codec
from shockwave.domain.lifecycle import LIVE_LEASES, LeaseState
from shockwave.policies.policy import get_policy
from store.tables import PlanRow
from tests.e2e import recording_worker
from tests.e2e.agents import Fleet, register_fleet, submit_job

HOLDING = {state.value for state in (*LIVE_LEASES, LeaseState.REVOKED)}
"""Lease states that hold GPUs (a revoked attempt holds them while it checkpoints)."""

JOBS = [  # (name, gpus, epochs): 6 GPUs asked of 4, so some wait and some are preempted
    ("resnet-a", 1, 3),
    ("resnet-b", 1, 2),
    ("bert", 2, 3),
    ("gpt", 2, 2),
]
DEADLINE_S = 60.0
TICK_S = 0.2


def test_jobs_run_to_success_on_the_rounds_the_core_decides(tmp_path: Path) -> None:
    record_dir = tmp_path / "decisions"
    with deployment(tmp_path) as stack:
        recording_worker.start(stack, record_dir=record_dir)
        api = stack.api()
        fleet = register_fleet(stack, api, {"n1": 2, "n2": 2})
        try:
            for name, gpus, epochs in JOBS:
                submit_job(
                    stack, api, fleet, name=name, gpus=gpus, epochs=epochs, throughput={"32": 500.0}
                )
            stack.driver()
            samples = run_until_all_succeed(stack.engine, fleet, stack.services.logs)
        finally:
            fleet.close()
        issued = rounds(stack.engine)
        stored_plans = plans(stack.engine)

    assert [r.index for r in issued] == list(range(len(issued))), "rounds skipped or repeated"
    first = issued[0]
    assert abs((first.ends_at - first.started_at).total_seconds() - ROUND_SECONDS) < 1e-3
    for before, r in itertools.pairwise(issued):
        # the cadence holds: a round begun a little late ends a round after the last one did
        late = (r.started_at - before.ends_at).total_seconds()
        due = r.started_at if late >= ROUND_SECONDS / 2 else before.ends_at
        length = (r.ends_at - due).total_seconds()
        assert abs(length - ROUND_SECONDS) < 1e-3, (r.index, late, length)
    by_index = {r.index: r for r in issued}

    assert samples and len(samples) >= max(samples), f"rounds sampled: {sorted(samples)}"
    job_gpus = {job.id: job.gpus for job in fleet.jobs.values()}
    for index, (round_jobs, leased) in samples.items():
        assert set(leased) == set(round_jobs), index
        assert set(round_jobs) <= set(by_index[index].jobs), index  # fills may come later
        check_placement(leased, job_gpus)
    for index, seen in ((i, fleet.leases_of_round(i)) for i in by_index):
        assert set(seen) <= set(by_index[index].jobs), (index, seen, by_index[index].jobs)

    fresh = [r for r in issued if r.source == "plan"]
    assert fresh, f"no round came from a fresh plan: {[r.source for r in issued]}"
    for r in fresh:
        assert r.plan_id is not None
        plan = stored_plans[r.plan_id]
        if r.index == plan.base_round:
            assert set(plan.rounds[0]) <= set(r.jobs), (r.index, r.jobs, plan.rounds[0])
        else:
            assert set(plan.rounds[r.index - plan.base_round]) <= set(r.jobs)

    check_plans_are_core_decisions(stored_plans, record_dir)


def run_until_all_succeed(
    engine: Engine, fleet: Fleet, logs: Any
) -> dict[int, tuple[list[str], dict[str, list[tuple[str, list[int]]]]]]:
    """Drive the agents until every job SUCCEEDED; meanwhile sample, once per round, the
    round's jobs and its leases (job -> [(node, local GPUs)]) in one consistent read."""
    samples: dict[int, tuple[list[str], dict[str, list[tuple[str, list[int]]]]]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        fleet.tick()
        sample = sample_round(engine)
        if sample is not None and sample[0] not in samples:
            samples[sample[0]] = sample[1:]
        states = job_states(engine)
        if set(states.values()) == {"SUCCEEDED"}:
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(
                f"jobs not all SUCCEEDED after {DEADLINE_S:.0f}s: {states}\n{logs()}"
            )
        time.sleep(TICK_S)


def sample_round(
    engine: Engine,
) -> tuple[int, list[str], dict[str, list[tuple[str, list[int]]]]] | None:
    """The current round, its jobs and its leases, read in one REPEATABLE READ transaction."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection:
        current = connection.execute(
            text("SELECT current_round FROM clusters WHERE id = 'default'")
        ).scalar()
        if current is None or current < 0:
            return None
        jobs = connection.execute(
            text("SELECT jobs FROM rounds WHERE cluster_id = 'default' AND index = :r"),
            {"r": current},
        ).scalar_one()
        leased: dict[str, list[tuple[str, list[int]]]] = defaultdict(list)
        for job_id, node_id, gpus, state in connection.execute(
            text("SELECT job_id, node_id, gpus, state FROM leases WHERE round_index = :r"),
            {"r": current},
        ):
            # A lease that ended (its job exited) holds no GPU: a fill may give it out again
            # in the same round. The job still counts as one the round leased.
            held = state in HOLDING
            leased[job_id].extend([(node_id, list(gpus))] if held else [])
        connection.rollback()
    return int(current), list(jobs), dict(leased)


def check_placement(
    leased: dict[str, list[tuple[str, list[int]]]], job_gpus: dict[str, int]
) -> None:
    """No GPU held twice; each job that holds GPUs holds as many as it asked for."""
    taken: set[tuple[str, int]] = set()
    for job_id, parts in leased.items():
        for node, gpus in parts:
            for gpu in gpus:
                assert (node, gpu) not in taken, f"GPU {gpu} of {node} leased twice"
                taken.add((node, gpu))
        assert sum(len(g) for _, g in parts) in (0, job_gpus[job_id]), (job_id, parts)


def check_plans_are_core_decisions(stored: dict[int, PlanRow], record_dir: Path) -> None:
    """Every plan's first column is the core's decision on the recorded inputs; every recorded
    decision is reproduced by the core in this process."""
    recorded: dict[tuple[int, int], list[list[str]]] = defaultdict(list)
    files = sorted(record_dir.glob("*.json"))
    assert files, f"the worker recorded no decision in {record_dir}"
    for path in files:
        record = json.loads(path.read_text())
        snapshot = state_codec.decode(record["snapshot"])
        params = state_codec.decode(record["params"])
        again = list(get_policy(record["policy"]).decide(snapshot, params).jobs)
        assert again == record["jobs"], (path.name, again, record["jobs"])
        recorded[(record["state_version"], snapshot.round_index)].append(again)
    assert stored, "no plan was stored"
    for plan in stored.values():
        decisions = recorded.get((plan.state_version, plan.base_round))
        assert decisions, f"plan {plan.id} was not made by the recorded worker"
        assert plan.rounds[0] in decisions, (plan.id, plan.rounds[0], decisions)
