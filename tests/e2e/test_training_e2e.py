"""Real training jobs end to end: Postgres, Redis, a Celery solver worker, the round driver
(3 s rounds), the API and two real node agents (``shockwave agent``, 2 slots each) that run
``examples/numpy_linear.py`` as processes.

- Six jobs on four slots all reach SUCCEEDED, every one preempted (SIGTERM: it checkpoints and
  exits) and resumed at least once, its loss curve (which the program appends to ``loss.jsonl``
  in the job's checkpoint directory) continuing across attempts instead of restarting. The
  policy (Shockwave) preempts some of them itself; it never preempts all six (the job started
  last runs to its end), so once every job has started, each node running a job not yet
  preempted is drained (its agent gets SIGTERM and starts again): see :func:`drain_unpreempted`.
  Every batch-size change the program made (GNS or Accordion, decided from its real gradients)
  is a scaling event and a regime of its prediction.
- A node dies (kill -9 of its agent and of every process the agent started, as when the machine
  crashes) in the middle of a round: after the node TTL it is LOST, its jobs go back to the
  queue and finish on the other node from their last checkpoints, and the server tells anyone
  who still reports the dead attempts to stop them.
- The same with kill -9 of the agent process alone: its jobs, in sessions of their own so that
  a restarted agent could re-attach to them, outlive it; their wrappers see the agent's sign of
  life go stale and stop them (SIGTERM: they checkpoint) after the orphan grace period, before
  the node is LOST, so that no job trains in two places (and were one to run on, its attempt's
  job token is fenced: its events are refused and the SDK ends it).

Every test checks attempt fencing: no job ever runs in two places at once, from the server's
lease history (each attempt from its issue to its confirmed end; attempts of one job on
different nodes never overlap), from the job's state events (each RUNNING period is one
attempt's, from its start to its own end), and from what the processes themselves wrote (the
attempts' records in the shared ``loss.jsonl`` never interleave).

The agents share one checkpoint directory (each work directory's ``checkpoints`` is a link to
it): on one machine, the stand-in for the shared storage a job moving between nodes needs.

The two node deaths (about a minute each) are marked ``slow``: `make test-slow` runs them, so
that `make test` stays well inside CI's 15 minutes; `bench/chaos` kills the same parts.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, col, select

from bench.deployment import ROOT, Deployment, deployment, job_states, rounds
from shockwave.domain.lifecycle import LIVE_LEASES, TERMINAL, JobState
from shockwave_cli.runtime.supervision import Supervised, stop_together, wait_until
from store.tables import ClusterRow, JobEventRow, LeaseRow, NodeRow

EXAMPLE = ROOT / "examples" / "numpy_linear.py"
ROUND_SECONDS = 3.0


@dataclass(frozen=True)
class Liveness:
    """How soon a silent node is LOST (the driver's ``--node-ttl``) and how long a job outlives
    its killed agent before its wrapper stops it (the agent's ``--orphan-grace``: below the
    TTL, so the job is gone, checkpointed, before the server may run it elsewhere)."""

    node_ttl_s: float
    orphan_grace_s: float


NODE_DEATHS = Liveness(node_ttl_s=4.0, orphan_grace_s=1.5)
"""For the tests that kill a node and wait for it to be LOST: short, so they take seconds."""
NO_NODE_DEATHS = Liveness(node_ttl_s=60.0, orphan_grace_s=10.0)
"""For the tests in which no node dies (agents are drained, or killed and started again on
purpose to re-attach): a node is LOST only if its agent is silent for a minute. With the 4 s
TTL, an agent restarted beside another pytest-xdist worker on a loaded machine (its start took
over 30 s at a load average of 10) came back to a LOST node: its containers' attempts fenced
and gone, a node death the test did not cause. The orphan grace is the agent's default."""
SLOTS = 2
STEP_SECONDS = 0.02
"""Each SGD step of the example lasts at least this long (``--min-step-seconds``), so that an
epoch takes a predictable second or two, as on a slow accelerator."""
LADDER = [16, 32, 64]
TICK_S = 0.25


@dataclass
class Training:
    """The running deployment: the API, the agents (node -> service) and the shared checkpoint
    directory; ``http`` acts as the admin."""

    stack: Deployment
    api: str
    http: httpx.Client
    checkpoints: Path
    agents: dict[str, Supervised]
    tokens: dict[str, str]
    image: str | None = None
    """The image the jobs run in (agents with the Docker runtime); None: processes."""
    liveness: Liveness = NO_NODE_DEATHS
    jobs: dict[str, str] = field(default_factory=dict)
    """job id -> name"""

    def submit(self, name: str, mode: str, epochs: int, samples: int, seed: int) -> str:
        program = [sys.executable, str(EXAMPLE)]
        if self.image is not None:  # the image's interpreter, in its working directory
            program = ["python", str(EXAMPLE.relative_to(ROOT))]
        body = {
            "name": name,
            "gpus": 1,
            "epochs": epochs,
            "samples_per_epoch": samples,
            "initial_batch_size": LADDER[0],
            "mode": mode,
            "batch_sizes": LADDER,
            "command": [*program, "--min-step-seconds", str(STEP_SECONDS), "--seed", str(seed)],
            "image": self.image,
        }
        response = self.http.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        self.jobs[job_id] = name
        return job_id

    def logs(self) -> str:
        return self.stack.services.logs()

    def waiting_for(self, what: str) -> Callable[[], str]:
        """A :func:`wait_until` message: ``what``, then the services' logs as they are when the
        wait gives up."""
        return lambda: f"{what}\n{self.logs()}"

    def wait_all_succeeded(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            states = job_states(self.stack.engine)
            failed = {
                self.jobs[j]: s for j, s in states.items() if s in TERMINAL - {JobState.SUCCEEDED}
            }
            assert not failed, f"jobs failed: {failed}\n{self.attempt_logs()}\n{self.logs()}"
            if states and set(states.values()) == {"SUCCEEDED"}:
                return
            if time.monotonic() > deadline:
                named = {self.jobs.get(j, j): s for j, s in states.items()}
                raise AssertionError(
                    f"not all SUCCEEDED after {timeout_s:.0f}s: {named}\n{self.logs()}"
                )
            time.sleep(TICK_S)

    def attempt_logs(self, chars: int = 1500) -> str:
        """The tail of every attempt's output (the agents keep one per attempt)."""
        parts = []
        for node in self.agents:
            for log in sorted((self.stack.log_dir / f"agent-{node}").glob("attempts/*/*.log")):
                parts.append(f"--- {log}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def loss_log(self, job_id: str) -> list[dict[str, Any]]:
        path = self.checkpoints / job_id / "loss.jsonl"
        assert path.is_file(), f"{self.jobs[job_id]} wrote no {path}"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
        return response.json()


@contextmanager
def training(
    tmp_path: Path,
    nodes: tuple[str, ...] = ("n1", "n2"),
    image: str | None = None,
    liveness: Liveness = NO_NODE_DEATHS,
) -> Iterator[Training]:
    """Worker, API, driver and one ``shockwave agent`` per node (with ``image``: the Docker
    runtime, the jobs in containers of it), with ``liveness``'s node TTL and orphan grace;
    every process, the jobs' own included, is stopped at the end whatever happens."""
    with deployment(tmp_path) as stack:
        agents: dict[str, Supervised] = {}
        try:
            stack.worker()
            api = stack.api()
            checkpoints = tmp_path / "checkpoints"
            checkpoints.mkdir()
            tokens = dict(zip(nodes, stack.agent_tokens(nodes), strict=True))
            for node in nodes:
                agents[node] = start_agent(
                    stack, api, node, tokens[node], liveness, docker=image is not None
                )
            http = httpx.Client(
                base_url=api,
                headers={"Authorization": f"Bearer {stack.admin_token}"},
                timeout=10.0,
            )
            run = Training(stack, api, http, checkpoints, agents, tokens, image, liveness)
            wait_until(
                lambda: ready_nodes(stack) == set(nodes),
                30,
                lambda: f"both agents to register\n{stack.services.logs()}",
            )
            stack.services.shockwave(
                "driver",
                "driver",
                "--round-seconds",
                str(ROUND_SECONDS),
                "--node-ttl",
                str(liveness.node_ttl_s),
            )
            try:
                yield run
            finally:
                http.close()
        finally:
            # SIGTERM, all at once: each stops its jobs (checkpoint, grace, SIGKILL) and
            # reports them while the API still runs.
            stop_together(agents.values())
            kill_strays(tmp_path)


def start_agent(
    stack: Deployment,
    api: str,
    node: str,
    token: str,
    liveness: Liveness,
    *,
    docker: bool = False,
) -> Supervised:
    work = stack.log_dir / f"agent-{node}"
    work.mkdir(exist_ok=True)
    shared = stack.log_dir / "checkpoints"
    if not (work / "checkpoints").exists():
        (work / "checkpoints").symlink_to(shared, target_is_directory=True)
    return stack.services.shockwave(
        f"agent-{node}",
        "agent",
        "--api",
        api,
        "--gpus",
        str(SLOTS),
        "--runtime",
        "docker" if docker else "process",
        "--work-dir",
        str(work),
        "--poll-interval",
        "0.5",
        "--heartbeat-interval",
        "1",
        "--orphan-grace",
        str(liveness.orphan_grace_s),
        # The examples run on this tree's interpreter, which another uid may not reach: the
        # process runtime runs them as the agent's user (tests/e2e/test_tenant_isolation.py
        # runs jobs under the uid pool); a container has its own.
        *(() if docker else ("--job-uids", "off")),
        # The programs post their progress to the API on this host's loopback: their
        # containers are allowed the host's network (the operator's choice; bridge otherwise).
        *(("--container-network", "host") if docker else ()),
        env={"SHOCKWAVE_AGENT_TOKEN": token},
    )


def ready_nodes(stack: Deployment) -> set[str]:
    with Session(stack.engine) as session:
        return {n.id for n in session.exec(select(NodeRow)).all() if n.state == "READY"}


def node_state(stack: Deployment, node: str) -> str | None:
    with Session(stack.engine) as session:
        row = session.get(NodeRow, node)
        return row.state if row else None


def leases_of(stack: Deployment) -> dict[str, list[LeaseRow]]:
    """job id -> its leases (attempts), in the order they were issued."""
    with Session(stack.engine) as session:
        rows = session.exec(select(LeaseRow).order_by(col(LeaseRow.issued_at))).all()
    out: dict[str, list[LeaseRow]] = defaultdict(list)
    for row in rows:
        out[row.job_id].append(row)
    return out


def state_events(stack: Deployment, job_id: str) -> list[JobEventRow]:
    with Session(stack.engine) as session:
        return list(
            session.exec(
                select(JobEventRow)
                .where(JobEventRow.job_id == job_id, JobEventRow.kind == "state")
                .order_by(col(JobEventRow.id))
            ).all()
        )


# --- processes ---------------------------------------------------------------------------


def children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        children[int(stat[stat.rindex(")") + 2 :].split()[1])].append(int(entry.name))
    return children


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, whatever session or group they are in."""
    children, tree, todo = children_map(), [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def crash(agent: Supervised) -> list[int]:
    """kill -9 the agent and every process it started, at once (the machine dies): frozen
    first (SIGSTOP) so that it starts nothing new meanwhile. The pids of its jobs' processes."""
    os.kill(agent.pid, signal.SIGSTOP)
    tree = process_tree(agent.pid)
    for pid in tree:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    agent.kill()
    jobs = [pid for pid in tree if pid != agent.pid]
    wait_until(lambda: not any(alive(p) for p in jobs), 10, "the crashed node's processes to die")
    return jobs


def kill_strays(tmp_path: Path) -> None:
    """SIGKILL anything still running from this test's directory (named in its command line or
    its environment: a job process whose agent could not stop it), with its process group:
    nothing outlives the test."""
    marker = str(tmp_path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            if marker not in (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes():
                continue
            with suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


# --- checks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """What one attempt's process wrote to the job's loss log, in order."""

    attempt_id: str
    records: list[dict[str, Any]]

    @property
    def start(self) -> dict[str, Any]:
        return self.records[0]

    @property
    def epochs(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["record"] == "epoch"]


def attempts_in_log(records: list[dict[str, Any]]) -> list[Attempt]:
    """Split the log into its attempts; fails if two attempts' records interleave (two processes
    of the job trained at once) or an attempt did not begin with its ``start`` record."""
    attempts: list[Attempt] = []
    for record in records:
        if attempts and attempts[-1].attempt_id == record["attempt"]:
            attempts[-1].records.append(record)
            continue
        seen = [a.attempt_id for a in attempts]
        assert record["attempt"] not in seen, (
            f"attempt {record['attempt']} wrote again after attempt {seen[-1]} had started: "
            f"two processes of the job ran at once\n{records}"
        )
        assert record["record"] == "start", f"attempt began without a start record: {record}"
        attempts.append(Attempt(record["attempt"], [record]))
    return attempts


def check_loss_curve(name: str, attempts: list[Attempt], *, crashed: set[str]) -> None:
    """The loss curve continues across attempts: epochs increase, each resumed attempt starts
    where the previous one stopped (a crashed attempt: from its last checkpoint, at most the
    epoch it was in), and its first loss is the previous attempt's last, not the initial one."""
    assert attempts[0].start["epoch"] == 0 and attempts[0].start["offset"] == 0, name
    initial = attempts[0].start["loss"]
    assert attempts[-1].records[-1]["record"] == "finished", (name, attempts[-1].records[-1])
    last_epoch = 0
    for previous, attempt in itertools.pairwise(attempts):
        done = [e["epoch"] for e in previous.epochs]
        assert done == sorted(set(done)), (name, done)
        last_epoch = max([last_epoch, *done])
        start = attempt.start
        if previous.attempt_id in crashed:
            assert last_epoch - 1 <= start["epoch"] <= last_epoch, (name, last_epoch, start)
        elif previous.records[-1]["record"] == "finished":
            # The job finished its last epoch just as a boundary moved it: the next attempt was
            # leased before the exit was reported, found the final checkpoint and trained
            # nothing (the job is SUCCEEDED once; fencing is checked from the server's side).
            finished = previous.records[-1]
            assert start["epoch"] == finished["epoch"] and not attempt.epochs, (
                name,
                finished,
                attempt.records,
            )
        else:
            stopped = previous.records[-1]
            assert stopped["record"] == "stopped", (name, stopped)
            assert (start["epoch"], start["offset"]) == (stopped["epoch"], stopped["offset"]), (
                name,
                stopped,
                start,
            )
        if previous.epochs:
            before = previous.epochs[-1]["loss"]
            assert abs(start["loss"] - before) < 0.5 * abs(initial - before), (
                f"{name}: resumed at loss {start['loss']:.4f}; it was {before:.4f} before the "
                f"stop and {initial:.4f} at the start: the curve restarted"
            )
        if attempt.epochs and previous.attempt_id not in crashed:
            assert attempt.epochs[0]["epoch"] > last_epoch, (name, last_epoch, attempt.epochs[0])
    everything = [e["epoch"] for a in attempts for e in a.epochs]
    if not crashed:
        assert everything == list(range(1, len(everything) + 1)), (name, everything)
    assert max(everything) == attempts[-1].records[-1]["epoch"], (name, everything)


def check_fencing(stack: Deployment, jobs: dict[str, str]) -> dict[str, list[LeaseRow]]:
    """No job runs in two places at once, from the server's records: its attempts that ran,
    each from its issue to its confirmed end (checkpointed, exited, or lost with its node), do
    not overlap across nodes; its RUNNING periods in the event log are each one attempt's, from
    that attempt's start to that attempt's own end."""
    all_leases = leases_of(stack)
    for job_id, name in jobs.items():
        ran = [lease for lease in all_leases[job_id] if lease.state not in LIVE_LEASES]
        ran = [lease for lease in ran if lease.state != "REVOKED"]
        for a, b in itertools.combinations(ran, 2):
            if a.node_id != b.node_id:
                assert max(a.issued_at, b.issued_at) >= min(a.updated_at, b.updated_at), (
                    f"{name}: attempt {a.id} on {a.node_id} ({a.issued_at} to {a.updated_at}) "
                    f"overlaps attempt {b.id} on {b.node_id} ({b.issued_at} to {b.updated_at})"
                )
        check_state_events(name, state_events(stack, job_id), all_leases[job_id])
    return all_leases


def check_state_events(name: str, events: list[JobEventRow], leases: list[LeaseRow]) -> None:
    """Each RUNNING period of the job belongs to one attempt: it begins with that attempt's
    start and ends with that attempt's own end (its report, or its node lost)."""
    state = {lease.id: lease.state for lease in leases}
    running: str | None = None
    for event in events:
        target, reason = event.payload.get("to"), event.reason
        if target == "RUNNING":
            assert running is None, f"{name}: RUNNING twice: {reason}"
            running = attempt_named(reason)
            assert running in state, (name, reason)
        elif running is not None:
            named = attempt_named(reason) if "attempt " in reason else None
            if named is None:  # the node was lost: the running attempt must be the lost one
                assert state[running] == "LOST", (name, running, state[running], reason)
            else:
                assert named == running, (
                    f"{name}: attempt {running} was running, but the job left RUNNING with "
                    f"{reason!r} (another attempt's end)"
                )
            running = None
    assert events and events[-1].payload.get("to") == "SUCCEEDED", (name, events[-1:])


def attempt_named(reason: str) -> str:
    """The attempt id in a state event's reason (``attempt <id> started on <node>``)."""
    words = reason.split()
    assert "attempt" in words, reason
    return words[words.index("attempt") + 1]


def check_scaling(run: Training, job_id: str, attempts: list[Attempt]) -> list[int]:
    """Every batch-size change the program made is a scaling event and shows in the job's
    prediction; the batch sizes it trained at, in order."""
    name = run.jobs[job_id]
    changes = [
        (e["epoch"], e["next_batch_size"])
        for a in attempts
        for e in a.epochs
        if e["next_batch_size"] != e["batch_size"]
    ]
    assert changes, f"{name} never changed its batch size"
    events = run.get(f"/v1/jobs/{job_id}/events", kind="scaling", page_size=500)["items"]
    recorded = [(e["payload"]["epoch"], e["payload"]["batch_size"]) for e in events]
    assert all(e["kind"] == "scaling" for e in events)
    assert sorted(set(recorded)) == sorted(set(changes)), (name, recorded, changes)
    trained = [LADDER[0], *[size for _, size in sorted(set(changes))]]
    prediction = run.get(f"/v1/jobs/{job_id}/prediction")
    sizes = [r["batch_size"] for r in prediction["regimes"]]
    assert sizes[: len(trained)] == trained, (name, sizes, trained, prediction)
    job = run.get(f"/v1/jobs/{job_id}")
    assert job["batch_size"] == trained[-1], (name, job["batch_size"], trained)
    return trained


# --- tests ---------------------------------------------------------------------------------

JOBS = [  # (mode, epochs, samples per epoch): a few rounds' work each, 6 jobs on 4 slots
    ("gns", 12, 4096),
    ("accordion", 12, 4096),
    ("gns", 12, 4096),
    ("accordion", 12, 4096),
    ("gns", 12, 4096),
    ("accordion", 12, 4096),
]


def test_six_real_jobs_are_preempted_resumed_and_rescaled(tmp_path: Path) -> None:
    began = time.monotonic()
    with training(tmp_path) as run:
        for index, (mode, epochs, samples) in enumerate(JOBS):
            run.submit(f"lr-{index}-{mode}", mode, epochs, samples, seed=index)
        wait_until(
            lambda: len(started_jobs(run)) == len(JOBS),
            90,
            lambda: f"every job to start once\n{run.logs()}\n{schedule(run)}",
        )
        drained = drain_unpreempted(run)
        run.wait_all_succeeded(timeout_s=120)

        leases = check_fencing(run.stack, run.jobs)
        logs = {job_id: attempts_in_log(run.loss_log(job_id)) for job_id in run.jobs}
        by_policy = {
            lease.id
            for job_leases in leases.values()
            for lease in job_leases
            if lease.state == "CHECKPOINTED" and lease.id not in drained
        }
        report = [
            f"{name}: {len(logs[job_id])} attempts "
            f"({sum(x.id in by_policy for x in leases[job_id])} preempted by the policy, "
            f"{sum(x.id in drained for x in leases[job_id])} by a drain), batch sizes "
            f"{[e['batch_size'] for a in logs[job_id] for e in a.epochs]}"
            for job_id, name in run.jobs.items()
        ]
        summary = "\n".join(report) + "\n" + schedule(run)
        assert by_policy, f"the policy preempted no job: it did not time-share\n{summary}"
        for job_id, name in run.jobs.items():
            attempts = logs[job_id]
            ran = [lease for lease in leases[job_id] if lease.state in ("CHECKPOINTED", "EXITED")]
            assert len(attempts) >= 2, f"{name} was never preempted\n{summary}"
            assert {a.attempt_id for a in attempts} == {lease.id for lease in ran}, summary
            checkpointed = sum(lease.state == "CHECKPOINTED" for lease in ran)
            assert checkpointed == len(attempts) - 1, (name, summary)
            check_loss_curve(name, attempts, crashed=set())
            check_scaling(run, job_id, attempts)
        print(f"\n{time.monotonic() - began:.0f} s\n{summary}")


def settled(run: Training, node: str) -> bool:
    """In the middle of a round, and every attempt leased to ``node`` is up and training (has
    written its start record, so it handles SIGTERM): a drain now stops only running jobs.

    (A job killed by the drain's SIGTERM before its handler is installed exits -15: the server
    puts it back in the queue, as the stop the agent asked for, but without a checkpoint, and
    this test counts one checkpoint per preemption.)"""
    if not mid_round(run.stack):
        return False
    for leases in leases_of(run.stack).values():
        for lease in leases:
            if lease.node_id != node or lease.state not in LIVE_LEASES:
                continue
            if lease.state == "ISSUED" or epochs_logged(run, lease.job_id, lease.id, "start") < 1:
                return False
    return True


def stopped(run: Training, attempts: set[str]) -> bool:
    """Whether every attempt in ``attempts`` has been reported stopped."""
    return all(
        x.state not in ("STARTED", "RUNNING")
        for xs in leases_of(run.stack).values()
        for x in xs
        if x.id in attempts
    )


def started_jobs(run: Training) -> set[str]:
    """Jobs with an attempt that started (a process reported up)."""
    return {
        job_id
        for job_id, leases in leases_of(run.stack).items()
        if any(x.state not in ("ISSUED", "REVOKED") for x in leases)
    }


def drain_unpreempted(run: Training) -> set[str]:
    """Rolling maintenance, once every job has started: each node that runs a job the policy
    has not preempted yet is drained (its agent gets SIGTERM: it checkpoints and stops its jobs
    and reports them) and its agent started again; the attempts it stopped.

    Shockwave does not time-share evenly: it preempts some of six equal-width jobs on four
    slots, seldom all of them (the last to start runs to its end once slots free up), so the
    rest are preempted by a drain, through the same agent, SDK and server paths."""
    drained: set[str] = set()
    for node in list(run.agents):
        wait_until(
            functools.partial(settled, run, node),
            3 * ROUND_SECONDS,
            run.waiting_for(f"{node}'s jobs to be up and training"),
        )
        leases = leases_of(run.stack)
        preempted = {j for j, xs in leases.items() if any(x.state == "CHECKPOINTED" for x in xs)}
        running = {
            x.id: x.job_id
            for xs in leases.values()
            for x in xs
            if x.node_id == node and x.state in ("STARTED", "RUNNING")
        }
        if set(running.values()) <= preempted:
            continue
        run.agents[node].stop()
        wait_until(
            functools.partial(stopped, run, set(running)),
            15,
            run.waiting_for(f"{node}'s drained attempts to be reported"),
        )
        drained |= set(running)
        run.agents[node] = start_agent(
            run.stack, run.api, node, run.tokens[node], run.liveness, docker=run.image is not None
        )
    return drained


CRASH_JOBS = [
    ("gns", 12, 4096),
    ("accordion", 12, 4096),
    ("gns", 12, 4096),
    ("accordion", 12, 4096),
]


@pytest.mark.slow
def test_a_crashed_node_s_jobs_finish_on_the_other_node(tmp_path: Path) -> None:
    """The node dies: kill -9 of its agent and of every process the agent started."""
    node_dies(tmp_path, crash)


@pytest.mark.slow
def test_an_agent_killed_alone_leaves_no_job_running_unfenced(tmp_path: Path) -> None:
    """kill -9 of the agent process only (its process group): the jobs it started, in
    sessions of their own so that a restarted agent can re-attach to them, live on until their
    wrappers find the agent gone; they stop cleanly (a checkpoint, a ``stopped`` record) and
    are all gone before n1 is LOST."""
    node_dies(tmp_path, kill_agent_alone, stopped_cleanly=True)


def kill_agent_alone(agent: Supervised) -> list[int]:
    """kill -9 the agent alone; the pids of the wrappers it had started (still running)."""
    wrappers = [pid for pid in process_tree(agent.pid) if pid != agent.pid]
    agent.kill()
    assert wrappers and all(alive(pid) for pid in wrappers), "the jobs outlive their agent"
    return wrappers


def node_dies(
    tmp_path: Path, kill: Callable[[Supervised], list[int]], *, stopped_cleanly: bool = False
) -> None:
    """Four jobs on two nodes; in the middle of a round ``kill`` takes n1's agent down (and
    returns the pids of n1's job processes). n1 is LOST after the TTL, its jobs go back to the
    queue and finish on n2 from their last checkpoints; the server tells whoever reports n1's
    attempts to stop them, and no process of those attempts runs or trains after its node was
    declared lost. ``stopped_cleanly``: each of them ended with a checkpoint and its
    ``stopped`` record (its wrapper stopped it) rather than dying in the middle of a step."""
    began = time.monotonic()
    ttl_s = NODE_DEATHS.node_ttl_s
    with training(tmp_path, liveness=NODE_DEATHS) as run:
        for index, (mode, epochs, samples) in enumerate(CRASH_JOBS):
            run.submit(f"crash-{index}-{mode}", mode, epochs, samples, seed=10 + index)

        def n1_trains_two_checkpointed_jobs() -> bool:
            """n1 runs two jobs, each past its second epoch in its attempt there (so a resumed
            attempt's loss can be told from the initial loss even if the crash comes between
            an epoch's log record and its checkpoint)."""
            live = [
                lease
                for leases in leases_of(run.stack).values()
                for lease in leases
                if lease.node_id == "n1" and lease.state in ("STARTED", "RUNNING")
            ]
            return len(live) == SLOTS and all(
                epochs_logged(run, lease.job_id, lease.id) >= 2 for lease in live
            )

        wait_until(
            n1_trains_two_checkpointed_jobs, 60, lambda: f"n1 to train two jobs\n{run.logs()}"
        )
        wait_until(lambda: mid_round(run.stack), ROUND_SECONDS * 2, "the middle of a round")
        victims = {
            lease.id: lease.job_id
            for leases in leases_of(run.stack).values()
            for lease in leases
            if lease.node_id == "n1" and lease.state in LIVE_LEASES
        }
        assert len(victims) == SLOTS, victims
        killed_at = time.monotonic()
        processes = kill(run.agents["n1"])

        wait_until(
            lambda: node_state(run.stack, "n1") == "LOST",
            ttl_s + 10,
            lambda: f"n1 to be LOST\n{run.logs()}",
        )
        lost_after = time.monotonic() - killed_at
        fenced_at = {job_id: len(run.loss_log(job_id)) for job_id in victims.values()}
        running = [pid for pid in processes if alive(pid)]
        assert not running, f"n1's job processes {running} still run after n1 was LOST"
        assert lost_after >= ttl_s - 1.5, lost_after
        leases = leases_of(run.stack)
        for attempt, job_id in victims.items():
            assert next(x for x in leases[job_id] if x.id == attempt).state == "LOST"

        # Whoever still reports n1's attempts is told to stop them; they are never leased again.
        with httpx.Client(
            base_url=run.api,
            headers={"Authorization": f"Bearer {run.tokens['n1']}"},
            timeout=10.0,
        ) as n1:
            poll = n1.get("/v1/agent/leases", params={"running": ",".join(victims)})
            assert poll.status_code == 200, poll.text
            assert not poll.json()["leases"], poll.json()
            assert set(victims) <= set(poll.json()["stop"]), poll.json()
            for attempt in victims:
                report = n1.post(f"/v1/agent/leases/{attempt}/status", json={"state": "running"})
                assert report.status_code == 409, report.text
                assert report.json().get("stop") is True, report.json()

        run.wait_all_succeeded(timeout_s=90)
        leases = check_fencing(run.stack, run.jobs)
        for attempt, job_id in victims.items():
            name = run.jobs[job_id]
            lease = next(x for x in leases[job_id] if x.id == attempt)
            assert lease.state == "LOST", (name, lease.state)
            later = [x for x in leases[job_id] if x.issued_at > lease.issued_at]
            assert later and all(x.node_id == "n2" for x in later), (name, later)
            assert later[-1].state == "EXITED" and later[-1].exit_code == 0, (name, later[-1])
            after = run.loss_log(job_id)[fenced_at[job_id] :]
            assert not [r for r in after if r["attempt"] == attempt], (
                f"{name}: attempt {attempt} went on training after n1 was LOST: "
                f"{[(r['record'], r.get('epoch')) for r in after if r['attempt'] == attempt]}"
            )
        for job_id, name in run.jobs.items():
            attempts = attempts_in_log(run.loss_log(job_id))
            check_loss_curve(name, attempts, crashed=set(victims))
            for each in attempts:
                if stopped_cleanly and each.attempt_id in victims:
                    assert each.records[-1]["record"] == "stopped", (name, each.records)
        print(
            f"\n{time.monotonic() - began:.0f} s; n1 LOST {lost_after:.1f} s after the kill\n"
            + schedule(run)
        )


def schedule(run: Training) -> str:
    """Who ran where in each round (for failure messages)."""
    lines = []
    for r in rounds(run.stack.engine):
        named = [run.jobs.get(j, j) for j in r.jobs]
        lines.append(
            f"round {r.index} ({r.source}, +{r.leases_issued}/-{r.leases_revoked}): {named}"
        )
    for job_id, leases in leases_of(run.stack).items():
        lines.append(
            f"{run.jobs.get(job_id)}: "
            + ", ".join(f"{x.node_id}@{x.round_index}:{x.state}" for x in leases)
        )
    return "\n".join(lines)


def epochs_logged(run: Training, job_id: str, attempt: str, record: str = "epoch") -> int:
    """How many ``record`` records (epochs, by default) ``attempt`` wrote to the loss log."""
    path = run.checkpoints / job_id / "loss.jsonl"
    if not path.is_file():
        return 0
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
    return sum(r["record"] == record and r["attempt"] == attempt for r in lines)


def mid_round(stack: Deployment) -> bool:
    """Whether the current round is between a quarter and three quarters through."""
    with Session(stack.engine) as session:
        cluster = session.get(ClusterRow, "default")
        if cluster is None or cluster.round_started_at is None:
            return False
        elapsed = datetime.now(cluster.round_started_at.tzinfo) - cluster.round_started_at
        return 0.25 * ROUND_SECONDS < elapsed.total_seconds() < 0.75 * ROUND_SECONDS
