"""The agent's Docker runtime against a real Docker engine: ``shockwave agent --runtime
docker`` runs ``examples/numpy_linear.py`` in containers of the project's image (built from
this tree by ``scripts/images.sh``), with the checkpoints on a mounted directory of the host.

One deployment (Postgres, Redis, a Celery worker, the API, the round driver with 3 s rounds)
and one node of two slots, in order:

1. Two jobs start, each in a container of its own.
2. The agent is killed (kill -9) while they run: the containers run on; a new agent on the same
   work directory re-attaches to the very same containers (same ids), and starts none twice.
3. The node is drained (SIGTERM to the agent): each container gets SIGTERM, the program
   checkpoints to the mounted directory and exits 0; under the next agent each job resumes, in
   a new container, from its checkpoint (its loss curve continues instead of restarting).
4. A third job's container is killed from outside (``docker kill``): the job ends FAILED with
   the container's exit code, 137.
5. The first two jobs SUCCEED, having changed their batch size (GNS, Accordion) from their real
   gradients: each change is a scaling event and a regime of the job's prediction. Every
   attempt that trained is in the job's loss log; one stopped before its program began (the
   policy may preempt it within a second for the third job) ended on the signal.

Fencing is checked as in the process-runtime tests (no job trains in two places), and at the end
no container of the test is left, running or not.
"""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlmodel import Session

from agent.config import safe_name
from bench.deployment import job_states
from shockwave.domain.lifecycle import LIVE_LEASES
from shockwave_cli.runtime.supervision import wait_until
from store.tables import NodeRow
from tests.e2e.engine import containers, docker, remove
from tests.e2e.test_training_e2e import (
    Training,
    attempts_in_log,
    check_fencing,
    check_loss_curve,
    check_scaling,
    drain_unpreempted,
    epochs_logged,
    leases_of,
    node_state,
    start_agent,
    training,
)

NODE = "d1"
KILLED_EXIT_CODE = 137
"""What Docker records for a container killed with SIGKILL (128 + 9)."""


def container_of(attempt: str) -> str:
    return f"shockwave-{safe_name(attempt)}"


def live_attempts(run: Training, job_id: str) -> list[str]:
    return [x.id for x in leases_of(run.stack)[job_id] if x.state in LIVE_LEASES]


def training_in_container(run: Training, job_id: str) -> str | None:
    """The attempt of ``job_id`` whose container runs and has begun training (wrote its start
    record to the loss log, so it handles SIGTERM); None if there is none."""
    for attempt in live_attempts(run, job_id):
        running = containers({container_of(attempt)}).get(container_of(attempt), "")
        if running == "running" and epochs_logged(run, job_id, attempt, "start") >= 1:
            return attempt
    return None


def container_id(attempt: str) -> str:
    return docker("inspect", "--format", "{{.Id}}", container_of(attempt)).strip()


def agent_log(run: Training) -> str:
    return run.agents[NODE].log_path.read_text(errors="replace")


def heartbeat_after(run: Training, moment: datetime) -> bool:
    """Whether the node's last heartbeat came after ``moment``."""
    with Session(run.stack.engine) as session:
        row = session.get(NodeRow, NODE)
        beat = row.last_heartbeat_at if row is not None else None
    return beat is not None and beat > moment


def test_jobs_run_in_containers_checkpoint_resume_reattach_and_fail(
    tmp_path: Path, project_image: str
) -> None:
    began = time.monotonic()
    names: set[str] = set()
    try:
        with training(tmp_path, nodes=(NODE,), image=project_image) as run:
            try:
                scenario(run)
            finally:
                names = {container_of(x.id) for xs in leases_of(run.stack).values() for x in xs}
        left = containers(names)  # the agent stopped: none of its containers may be left
        assert not left, f"containers left behind: {left}"
    finally:
        remove(names)
    print(f"{time.monotonic() - began:.0f} s, {len(names)} containers")


def scenario(run: Training) -> None:
    first = run.submit("lr-gns", "gns", 12, 4096, seed=1)
    second = run.submit("lr-accordion", "accordion", 12, 4096, seed=2)

    # 1. Each job trains in a container of its own.
    wait_until(
        lambda: all(training_in_container(run, j) for j in (first, second)),
        90,
        lambda: f"both jobs to train in containers\n{run.logs()}\n{run.attempt_logs()}",
    )
    attempts = {training_in_container(run, j) or "": j for j in (first, second)}
    ids = {attempt: container_id(attempt) for attempt in attempts}

    # 2. kill -9 of the agent: the containers run on; a new agent re-attaches to them.
    run.agents[NODE].kill()
    running = {container_of(a): "running" for a in ids}
    assert containers(set(running)) == running, "the containers outlive their agent"
    run.agents[NODE] = start_agent(
        run.stack, run.api, NODE, run.tokens[NODE], run.liveness, docker=True
    )
    # It re-attaches if it is back before the node is LOST (the node TTL: then the attempts
    # are fenced and their programs end): however slow its start, within the TTL.
    wait_until(
        lambda: all(f"re-attached to attempt {a}" in agent_log(run) for a in ids),
        run.liveness.node_ttl_s,
        lambda: (
            f"the new agent to re-attach to {sorted(ids)} (node {node_state(run.stack, NODE)})\n"
            f"{run.logs()}"
        ),
    )
    # Two of its heartbeat polls, each of which answers the node's leases and has the agent
    # start those it does not run: a second start of a re-attached attempt would come there.
    for _ in range(2):
        wait_until(
            functools.partial(heartbeat_after, run, datetime.now(UTC)),
            30,
            lambda: f"a heartbeat of the new agent\n{run.logs()}",
        )
    assert node_state(run.stack, NODE) == "READY"
    since_restart = agent_log(run).rsplit("=== start", 1)[-1]
    for attempt, job_id in attempts.items():
        assert f"started attempt {attempt} " not in since_restart, "started twice"
        if attempt in live_attempts(run, job_id):
            assert container_id(attempt) == ids[attempt], "re-attached, not restarted"

    # 3. A drain: SIGTERM reaches each program, which checkpoints and exits 0; each job then
    #    resumes in a new container from its checkpoint.
    assert drain_unpreempted(run), f"no job was running to drain\n{run.logs()}"

    # 4. A container killed from outside: its job FAILS with the container's exit code.
    victim = run.submit("lr-victim", "gns", 40, 4096, seed=3)
    wait_until(
        lambda: training_in_container(run, victim) is not None,
        90,
        lambda: f"the third job to train in a container\n{run.logs()}",
    )
    victim_attempt = training_in_container(run, victim) or ""
    docker("kill", container_of(victim_attempt))
    wait_until(
        lambda: job_states(run.stack.engine)[victim] == "FAILED",
        30,
        lambda: f"the killed job to fail\n{run.logs()}",
    )
    lease = next(x for x in leases_of(run.stack)[victim] if x.id == victim_attempt)
    assert (lease.state, lease.exit_code) == ("EXITED", KILLED_EXIT_CODE), lease
    assert run.get(f"/v1/jobs/{victim}")["state"] == "FAILED"

    # 5. The first two jobs finish, resumed from their checkpoints, their batch sizes changed.
    wait_until(
        lambda: {job_states(run.stack.engine)[j] for j in (first, second)} == {"SUCCEEDED"},
        150,
        lambda: f"both jobs to succeed\n{run.logs()}\n{run.attempt_logs()}",
    )
    kept = {first: run.jobs[first], second: run.jobs[second]}
    leases = check_fencing(run.stack, kept)
    for job_id, name in kept.items():
        logged = attempts_in_log(run.loss_log(job_id))
        ran = [x for x in leases[job_id] if x.state in ("CHECKPOINTED", "EXITED")]
        assert len(logged) >= 2, f"{name} was never preempted: {leases[job_id]}"
        trained = {a.attempt_id for a in logged}
        assert trained <= {x.id for x in ran}, (name, trained, ran)
        # An attempt the policy stops within a second of its start (a 3 s round) may get the
        # SIGTERM before its program has installed its handler: it ends on the signal (a stop,
        # not a failure: the job goes back to the queue) having written nothing.
        unlogged = [x for x in ran if x.id not in trained]
        assert all(x.state == "EXITED" and x.exit_code not in (0, None) for x in unlogged), (
            name,
            unlogged,
        )
        assert sum(x.state == "CHECKPOINTED" for x in ran) == len(logged) - 1, name
        assert ran[-1].exit_code == 0, (name, ran[-1])
        check_loss_curve(name, logged, crashed=set())
        sizes = check_scaling(run, job_id, logged)
        print(f"{name}: {len(logged)} attempts in containers, batch sizes {sizes}")
