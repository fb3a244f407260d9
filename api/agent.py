"""What the agent endpoints do (/v1/agent): register, heartbeat, poll leases, report status.

An agent acts only for the node its token names; another node's leases do not exist for it
(404). An admin acts for any node it names. Lease reports follow :mod:`api.leases`; a report for
an attempt that must not run (revoked, lost, its job finished) is refused with a 409 carrying
``stop: true``: attempt fencing, the agent reports what it runs and the server answers with
what must stop. Reports are idempotent: the same report twice gets the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.orm import QueryableAttribute, defer
from sqlmodel import Session, col, select

from api import planning_hooks
from api.agent_schemas import (
    JobTokenPublic,
    LeasePublic,
    LeaseStatusPublic,
    LeaseStatusReport,
    NodeLeases,
    NodeRegister,
    NodeStatus,
)
from api.auth import Principal, Role, create_token, require
from api.errors import Problem
from api.leases import (
    LIVE,
    STOPPED,
    LeaseState,
    checkpoint_dir,
    revoke_live_leases,
    stop_running,
)
from api.repository import record_state
from api.tables import ClusterRow, JobRow, LeaseRow, NodeRow, utcnow
from shockwave.lifecycle import JobState

STOP_ROUNDS = 2
"""Revoked and lost attempts are listed in ``stop`` for this many rounds after the fact (a
stopped agent finds out anyway: every attempt it runs that is not a lease must stop)."""

CLUSTER = planning_hooks.DEFAULT_CLUSTER


def acting_node(principal: Principal, requested: str | None) -> str:
    """The node a call acts for: an agent's own (naming another is a 404, as if it did not
    exist), or the one an admin names."""
    require(principal, Role.AGENT, Role.ADMIN)
    if principal.role is Role.AGENT:
        own = principal.node or ""
        if requested is not None and requested != own:
            raise Problem(404, "Not found", f"no node {requested}")
        return own
    if requested is None:
        raise Problem(422, "Invalid request", "an admin must name the node", field="node")
    return requested


def register(session: Session, node_id: str, data: NodeRegister) -> NodeRow:
    """Create or update the node, READY, heartbeat now; the cluster's capacity changed, so
    its state version is bumped (and a plan requested after commit)."""
    now = utcnow()
    node = session.get(NodeRow, node_id, with_for_update=True)
    if node is None:
        node = NodeRow(id=node_id, hostname=data.hostname, gpus=data.gpus, registered_at=now)
    node.hostname = data.hostname
    node.gpus = data.gpus
    node.gpu_type = data.gpu_type
    node.state = "READY"
    node.last_heartbeat_at = now
    session.add(node)
    session.flush()
    planning_hooks.bump_and_request(session, f"node {node_id} registered")
    return node


def heartbeat(session: Session, node_id: str) -> NodeRow:
    """Record a sign of life. A LOST node that heartbeats again is READY again (capacity
    changed: the version is bumped); its lost attempts stay lost."""
    node = session.get(NodeRow, node_id, with_for_update=True)
    if node is None:
        raise Problem(404, "Not found", f"no node {node_id}: register it first")
    node.last_heartbeat_at = utcnow()
    if node.state != "READY":
        node.state = "READY"
        planning_hooks.bump_and_request(session, f"node {node_id} is back")
    session.add(node)
    return node


def node_status(session: Session, node: NodeRow) -> NodeStatus:
    cluster = _cluster(session)
    return NodeStatus(
        id=node.id,
        hostname=node.hostname,
        gpus=node.gpus,
        gpu_type=node.gpu_type,
        state="READY" if node.state == "READY" else "LOST",
        last_heartbeat_at=node.last_heartbeat_at,
        registered_at=node.registered_at,
        current_round=cluster.current_round if cluster else -1,
        round_ends_at=cluster.round_ends_at if cluster else None,
        state_version=cluster.state_version if cluster else 0,
    )


def node_leases(session: Session, node_id: str, running: list[str]) -> NodeLeases:
    """The node's live leases of unfinished jobs, and the attempts it must stop."""
    if session.get(NodeRow, node_id) is None:
        raise Problem(404, "Not found", f"no node {node_id}: register it first")
    cluster = _cluster(session)
    current = cluster.current_round if cluster else -1
    rows = session.exec(
        select(LeaseRow, JobRow)
        .join(JobRow, col(JobRow.id) == col(LeaseRow.job_id))
        .where(LeaseRow.node_id == node_id)
        .where(
            col(LeaseRow.state).in_(LIVE)
            | (
                col(LeaseRow.state).in_((LeaseState.REVOKED.value, LeaseState.LOST.value))
                & (col(LeaseRow.round_index) >= current - STOP_ROUNDS)
            )
        )
        .order_by(col(LeaseRow.round_index), col(LeaseRow.id))
    ).all()
    leases = [
        _lease_public(lease, job)
        for lease, job in rows
        if lease.state in LIVE and not JobState(job.state).terminal
    ]
    live = {lease.attempt_id for lease in leases}
    stop = {lease.id for lease, _ in rows if lease.id not in live}
    stop.update(attempt for attempt in running if attempt not in live)
    return NodeLeases(
        node=node_id,
        current_round=current,
        round_ends_at=cluster.round_ends_at if cluster else None,
        leases=leases,
        stop=sorted(stop),
    )


def visible_lease(session: Session, principal: Principal, attempt_id: str) -> LeaseRow:
    """The lease if the caller may act on it; else 404 (another node's attempts do not exist
    for an agent)."""
    require(principal, Role.AGENT, Role.ADMIN)
    lease = session.get(LeaseRow, attempt_id)
    if lease is None or (principal.role is Role.AGENT and lease.node_id != principal.node):
        raise Problem(404, "Not found", f"no attempt {attempt_id}")
    return lease


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """``status``: the lease and job after the report. ``refused``: why the attempt must stop
    instead (the route answers 409, ``stop: true``), None when the report was applied."""

    status: LeaseStatusPublic
    refused: str | None = None


def report_status(
    session: Session, principal: Principal, attempt_id: str, report: LeaseStatusReport
) -> ReportOutcome:
    """Apply an agent's report on one attempt (see the module docstring of :mod:`api.leases`).

    - ``started`` / ``running`` on a live lease: the lease moves on, the job becomes RUNNING;
      on an attempt that must not run (revoked, lost, stopped, its job finished): refused.
    - ``checkpointed``: the attempt stopped with a checkpoint; its job, unless it runs
      elsewhere, is SUSPENDED.
    - ``exited``: code 0 means the job finished: SUCCEEDED. A nonzero code fails the job
      (FAILED, no retry) unless the process was asked to stop: the attempt had been revoked,
      or the report says ``stop_requested`` (the agent stopped it on its own: its lease ran
      out, the agent is draining, or the server said stop before a revoke reached this
      lease). A stop that ends in a signal (SIGTERM before the program's handler was
      installed: -15; SIGKILL after the grace period: -9) or a nonzero code is the stop that
      was asked for, not a failure: the job goes back to the queue (SUSPENDED with a
      checkpoint, else PENDING).
    - a lost attempt's reports are all refused: its job has already gone back to the queue.

    Locks the job, then the lease (then the cluster row, when the version is bumped): the
    order the round driver takes them in.
    """
    job_id = visible_lease(session, principal, attempt_id).job_id
    job = session.get(JobRow, job_id, with_for_update=True, populate_existing=True)
    lease = session.get(LeaseRow, attempt_id, with_for_update=True, populate_existing=True)
    if job is None or lease is None:
        raise Problem(404, "Not found", f"no attempt {attempt_id}")
    refused = _apply(session, lease, job, report)
    stop = lease.state not in LIVE or JobState(job.state).terminal
    status = LeaseStatusPublic(
        attempt_id=lease.id,
        job_id=job.id,
        state=LeaseState(lease.state).value,
        job_state=JobState(job.state),
        ends_at=lease.ends_at,
        stop=stop or refused is not None,
    )
    return ReportOutcome(status=status, refused=refused)


def _apply(session: Session, lease: LeaseRow, job: JobRow, report: LeaseStatusReport) -> str | None:
    """Apply ``report``; the reason it is refused, or None."""
    if lease.state == LeaseState.LOST.value:
        return f"attempt {lease.id} was lost with its node; its job went back to the queue"
    if lease.state in STOPPED:
        if _same_stop(lease, report):
            return None
        return f"attempt {lease.id} has already stopped ({lease.state.lower()})"
    revoked = lease.state == LeaseState.REVOKED.value
    finished = JobState(job.state).terminal
    if report.state in ("started", "running"):
        if revoked:
            return f"attempt {lease.id} was revoked"
        if finished:
            _revoke(session, lease)
            return f"job {job.id} is {job.state.lower()}"
        _run(session, lease, job, report.state)
        return None
    where = f"attempt {lease.id} on {lease.node_id}"
    if report.state == "checkpointed":
        _stop_lease(session, lease, LeaseState.CHECKPOINTED, None)
        if not finished:
            stop_running(session, job, f"{where} checkpointed", except_attempt=lease.id)
        return None
    code = report.exit_code if report.exit_code is not None else 0
    _stop_lease(session, lease, LeaseState.EXITED, code)
    if finished:
        return None
    if code == 0:
        _finish(session, job, JobState.SUCCEEDED, f"{where} exited 0", lease.id)
    elif revoked or report.stop_requested:
        stop_running(session, job, f"{where} stopped (exit {code})", except_attempt=lease.id)
    else:
        _finish(session, job, JobState.FAILED, f"{where} exited {code}", lease.id)
    return None


def _same_stop(lease: LeaseRow, report: LeaseStatusReport) -> bool:
    if report.state == "checkpointed":
        return lease.state == LeaseState.CHECKPOINTED.value
    return (
        report.state == "exited"
        and lease.state == LeaseState.EXITED.value
        and lease.exit_code == report.exit_code
    )


def _run(session: Session, lease: LeaseRow, job: JobRow, reported: str) -> None:
    if reported == "running" or lease.state == LeaseState.ISSUED.value:
        target = LeaseState.RUNNING if reported == "running" else LeaseState.STARTED
        if lease.state != target.value:
            lease.state = target.value
            lease.updated_at = utcnow()
            session.add(lease)
    if job.state != JobState.RUNNING.value:
        record_state(
            session, job, JobState.RUNNING, f"attempt {lease.id} started on {lease.node_id}"
        )


def _stop_lease(session: Session, lease: LeaseRow, state: LeaseState, code: int | None) -> None:
    lease.state = state.value
    lease.exit_code = code
    lease.updated_at = utcnow()
    session.add(lease)


def _revoke(session: Session, lease: LeaseRow) -> None:
    lease.state = LeaseState.REVOKED.value
    lease.updated_at = utcnow()
    session.add(lease)


def _finish(session: Session, job: JobRow, target: JobState, reason: str, attempt: str) -> None:
    """End the job: through RUNNING if it never reported starting (it did run), then
    ``target``; its other attempts are revoked and the cluster's version bumped."""
    if target is JobState.SUCCEEDED and job.state != JobState.RUNNING.value:
        record_state(session, job, JobState.RUNNING, f"attempt {attempt} ran (reported at exit)")
    record_state(session, job, target, reason)
    revoke_live_leases(session, job.id, except_attempt=attempt)
    planning_hooks.bump_and_request(session, f"job {job.id} {target.value.lower()}")


def _lease_public(lease: LeaseRow, job: JobRow) -> LeasePublic:
    directory = checkpoint_dir(job.id)
    return LeasePublic(
        attempt_id=lease.id,
        job_id=job.id,
        node=lease.node_id,
        round_index=lease.round_index,
        gpus=list(lease.gpus),
        ends_at=lease.ends_at,
        state=LeaseState(lease.state).value,
        batch_size=job.batch_size,
        checkpoint_dir=directory,
        env={
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in lease.gpus),
            "SHOCKWAVE_JOB_ID": job.id,
            "SHOCKWAVE_ATTEMPT_ID": lease.id,
            "SHOCKWAVE_BATCH_SIZE": str(job.batch_size),
            "SHOCKWAVE_CHECKPOINT_DIR": directory,
        },
        command=list(job.command),
        image=job.image,
    )


def _cluster(session: Session) -> ClusterRow | None:
    """The cluster's row without the policy's memory (hundreds of kB at scale, read on every
    poll)."""
    state = cast("QueryableAttribute[Any]", ClusterRow.policy_state)
    return session.get(ClusterRow, CLUSTER, options=(defer(state),))


def job_token(session: Session, principal: Principal, attempt_id: str) -> JobTokenPublic:
    """A token scoped to the attempt's job and to the attempt itself, for its process; only
    for a live attempt of an unfinished job (a stale attempt gets a 409 with ``stop: true``).
    Once the attempt is fenced the token's events are refused (:mod:`api.progress`)."""
    lease = visible_lease(session, principal, attempt_id)
    job = session.get(JobRow, lease.job_id)
    if job is None or lease.state not in LIVE or JobState(job.state).terminal:
        raise Problem(
            409,
            "Stale attempt",
            f"attempt {attempt_id} must stop",
            stop=True,
            attempt_id=attempt_id,
        )
    token = create_token(
        session, Role.JOB, job_id=job.id, attempt_id=lease.id, name=f"attempt {lease.id}"
    )
    return JobTokenPublic(attempt_id=lease.id, job_id=job.id, token=token)
