"""What must hold after the chaos run, checked from the database and the clients' journals.

- ``job_not_once``: every job the workload submitted exists at most once (by its name, which
  is its Idempotency-Key), and every acknowledged one exactly once, with the acknowledged id;
- ``event_not_once``: every acknowledged client event (the workload's scaling events, the
  agents' progress events, from their journals) exists exactly once, with its kind;
- ``gpu_double_leased``: no (round, node, GPU) in two leases. A lease covers the rounds from
  the one that issued it (``issued_at`` is that round's start, or inside the round for a
  mid-round fill of the round engine) to its ``round_index`` (moved on at each extension, kept
  when the lease is revoked, lost or ends). A fill may take a GPU in the round a lease on it
  ended (exited, lost or checkpointed: not a revoked attempt still checkpointing) once it has;
- ``job_ran_twice``: no job with two attempts live in one round, unless both were issued at
  the same moment (a job spanning nodes has one attempt per node) or the earlier one had ended
  before a fill issued the later;
- ``lease_round_mismatch``: each round's leases are exactly the jobs the round placed (fills
  included), and every lease was issued at a round's start or within the round;
- ``unfinished``: every acknowledged job SUCCEEDED, through a valid chain of state events
  with one SUCCEEDED among them (``bad_state_chain`` otherwise);
- ``lost_progress``: a SUCCEEDED job has a progress event for every epoch 1..epochs;
- ``round_gap``: round indices run 0, 1, 2, ... without a hole, no round starts before the
  previous one ended, no gap between round starts is longer than the bound, and the last round
  started within the bound of the end of the run (rounds kept coming);
- ``planning_stalled``: after every fault that cost the solver its worker or its broker, a
  plan was stored again (rounds from the fallbacks alone would satisfy ``round_gap``);
- ``unexpected_exit`` / ``unexpected_answer``: a process died that no fault killed, or the
  service answered a client with something the protocol does not allow.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from bench.chaos.workload import Acknowledged
from shockwave.domain.lifecycle import LIVE_LEASES, TERMINAL, JobState, LeaseState
from store.tables import JobEventRow, JobRow, LeaseRow, PlanRow, RoundRow

ROUND_SLACK_S = 0.01


@dataclass
class Findings:
    """Counts of what was checked, and the violations found, by kind (with examples)."""

    counts: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    max_round_gap_s: float = 0.0

    def add(self, kind: str, detail: str) -> None:
        self.violations[kind].append(detail)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.violations.values())


def read_journals(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every complete JSON line of the agents' journals (a kill can cut the last one)."""
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def check(
    engine: Engine,
    acked: Acknowledged,
    journals: Iterable[Path],
    *,
    gap_bound_s: float,
    ended_at: float,
    planning_faults: Iterable[tuple[str, float]] = (),
) -> Findings:
    """Run every check (module docstring). ``planning_faults``: (name, when it was back, in
    seconds since the epoch) of each fault after which a new plan must have been stored."""
    found = Findings()
    with Session(engine) as session:
        plan_times = [p.created_at.timestamp() for p in session.exec(select(PlanRow)).all()]
        jobs = list(session.exec(select(JobRow)).all())
        events = list(session.exec(select(JobEventRow).order_by(col(JobEventRow.id))).all())
        leases = list(session.exec(select(LeaseRow)).all())
        rounds = list(session.exec(select(RoundRow).order_by(col(RoundRow.index))).all())
    agent_events = [
        (r["job"], int(r["seq"]), r["kind"])
        for r in read_journals(journals)
        if r["type"] == "event"
    ]
    found.counts.update(
        jobs_submitted=len(acked.submitted),
        jobs_acknowledged=len(acked.jobs),
        jobs_in_database=len(jobs),
        events_acknowledged=len(set(acked.events) | set(agent_events)),
        client_events_in_database=sum(e.seq is not None for e in events),
        state_events_in_database=sum(e.kind == "state" for e in events),
        leases=len(leases),
        rounds=len(rounds),
    )
    _jobs_once(found, acked, jobs)
    _events_once(found, [*acked.events, *agent_events], events)
    _leases(found, leases, rounds)
    _finished(found, acked, jobs, events)
    _rounds(found, rounds, gap_bound_s, ended_at)
    found.counts["plans"] = len(plan_times)
    _planning(found, plan_times, planning_faults)
    return found


def _planning(
    found: Findings, plan_times: list[float], faults: Iterable[tuple[str, float]]
) -> None:
    newest = max(plan_times, default=0.0)
    for name, back in faults:
        if newest <= back:
            found.add("planning_stalled", f"no plan stored after {name} was back")


def _jobs_once(found: Findings, acked: Acknowledged, jobs: list[JobRow]) -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for job in jobs:
        by_name[job.name].append(job.id)
    for name in acked.submitted:
        ids = by_name.get(name, [])
        if name in acked.jobs and ids != [acked.jobs[name]]:
            found.add("job_not_once", f"{name}: acknowledged {acked.jobs[name]}, stored {ids}")
        elif len(ids) > 1:
            found.add("job_not_once", f"{name} (never acknowledged): stored {ids}")
    strangers = set(by_name) - set(acked.submitted)
    if strangers:
        found.add("job_not_once", f"jobs nobody submitted: {sorted(strangers)[:5]}")


def _events_once(
    found: Findings, acknowledged: list[tuple[str, int, str]], events: list[JobEventRow]
) -> None:
    stored = Counter((e.job_id, e.seq, e.kind) for e in events if e.seq is not None)
    for key in sorted(set(acknowledged)):
        if stored[key] != 1:
            found.add("event_not_once", f"job {key[0]} seq {key[1]} ({key[2]}): {stored[key]}x")


def _first_round(lease: LeaseRow, rounds: list[RoundRow]) -> int | None:
    """The round whose span holds the lease's issue: at its start (a boundary) or inside it (a
    mid-round fill of the round engine); None when no round does."""
    for r in rounds:
        if r.started_at <= lease.issued_at and (
            lease.issued_at == r.started_at or lease.issued_at < r.ends_at
        ):
            return r.index
    return None


def handed_over(a: LeaseRow, b: LeaseRow) -> bool:
    """The later-issued of ``a`` and ``b`` was a fill after the earlier had ended (exited, lost
    or checkpointed), so both may share a round: the fill took GPUs freed mid-round."""
    first, second = sorted((a, b), key=lambda lease: lease.issued_at)
    ended = LeaseState(first.state) not in (*LIVE_LEASES, LeaseState.REVOKED)
    return second.issued_at > first.issued_at and ended and first.updated_at <= second.issued_at


def _leases(found: Findings, leases: list[LeaseRow], rounds: list[RoundRow]) -> None:
    ordered = sorted(rounds, key=lambda r: r.started_at, reverse=True)
    placed = {r.index: set(r.jobs) for r in rounds}
    spans: list[tuple[LeaseRow, int]] = []
    for lease in leases:
        first = _first_round(lease, ordered)
        if first is None or first > lease.round_index:
            found.add("lease_round_mismatch", f"lease {lease.id} issued outside every round")
            continue
        spans.append((lease, first))
    gpu_use: dict[tuple[int, str, int], list[LeaseRow]] = defaultdict(list)
    live: dict[tuple[str, int], list[LeaseRow]] = defaultdict(list)
    leased: dict[int, set[str]] = defaultdict(set)
    for lease, first in spans:
        for r in range(first, lease.round_index + 1):
            for gpu in lease.gpus:
                gpu_use[(r, lease.node_id, gpu)].append(lease)
            live[(lease.job_id, r)].append(lease)
            leased[r].add(lease.job_id)
    for (r, node, gpu), users in sorted(gpu_use.items()):
        clashes = [(a, b) for i, a in enumerate(users) for b in users[i + 1 :]]
        if any(not handed_over(a, b) for a, b in clashes):
            ids = [lease.id for lease in users]
            found.add("gpu_double_leased", f"round {r} {node} GPU {gpu}: leases {ids}")
    for (job, r), attempts in sorted(live.items()):
        pairs = [(a, b) for i, a in enumerate(attempts) for b in attempts[i + 1 :]]
        if any(a.issued_at != b.issued_at and not handed_over(a, b) for a, b in pairs):
            issued = sorted({a.issued_at.isoformat() for a in attempts})
            found.add("job_ran_twice", f"job {job} round {r}: attempts issued at {issued}")
    for r, jobs in sorted(placed.items()):
        if leased.get(r, set()) != jobs:
            found.add(
                "lease_round_mismatch",
                f"round {r}: placed {sorted(jobs)}, leased {sorted(leased.get(r, set()))}",
            )


def _finished(
    found: Findings, acked: Acknowledged, jobs: list[JobRow], events: list[JobEventRow]
) -> None:
    by_id = {j.id: j for j in jobs}
    chains: dict[str, list[JobEventRow]] = defaultdict(list)
    progress: dict[str, set[int]] = defaultdict(set)
    for event in events:
        if event.kind == "state":
            chains[event.job_id].append(event)
        elif event.kind == "progress":
            progress[event.job_id].add(int(event.payload["epoch"]))
    succeeded = 0
    for name, job_id in sorted(acked.jobs.items()):
        job = by_id.get(job_id)
        if job is None:
            continue  # counted as job_not_once
        if job.state != "SUCCEEDED":
            found.add("unfinished", f"{name} ({job_id}) is {job.state}")
            continue
        succeeded += 1
        _state_chain(found, job, chains[job_id])
        missing = set(range(1, job.epochs + 1)) - progress[job_id]
        if missing:
            found.add("lost_progress", f"{name}: no progress event for epochs {sorted(missing)}")
    found.counts["jobs_succeeded"] = succeeded


def _state_chain(found: Findings, job: JobRow, chain: list[JobEventRow]) -> None:
    """The job's state events: PENDING first, each from the last one's target, one terminal
    state, at the end, and the job's state."""
    states = [e.payload.get("to") for e in chain]
    froms = [e.payload.get("from") for e in chain[1:]]
    problems = []
    if not states or states[0] != JobState.PENDING:
        problems.append("does not start PENDING")
    if froms != states[:-1]:
        problems.append("a change does not start where the last one ended")
    if sum(s in TERMINAL for s in states) != 1 or states[-1] != job.state:
        problems.append(f"ends {states[-1:]} with {sum(s in TERMINAL for s in states)} terminal")
    if problems:
        found.add("bad_state_chain", f"{job.name}: {'; '.join(problems)}: {states}")


def _rounds(found: Findings, rounds: list[RoundRow], bound_s: float, ended_at: float) -> None:
    indices = [r.index for r in rounds]
    if indices != list(range(len(indices))):
        holes = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
        found.add("round_gap", f"round indices are not 0..n-1: missing {holes[:10]}")
    gaps = [(_s(b.started_at) - _s(a.started_at), a, b) for a, b in pairwise(rounds)]
    for _, a, b in gaps:
        if _s(b.started_at) < _s(a.ends_at) - ROUND_SLACK_S:
            found.add("round_gap", f"round {b.index} started before round {a.index} ended")
    found.max_round_gap_s = max((g for g, _, _ in gaps), default=0.0)
    for gap, a, b in gaps:
        if gap > bound_s:
            found.add("round_gap", f"rounds {a.index}->{b.index}: {gap:.1f}s > {bound_s:.1f}s")
    if not rounds:
        found.add("round_gap", "no round at all")
    elif ended_at - _s(rounds[-1].started_at) > bound_s:
        found.add(
            "round_gap",
            f"no round in the last {ended_at - _s(rounds[-1].started_at):.1f}s of the run",
        )


def _s(moment: datetime) -> float:
    return moment.timestamp()
