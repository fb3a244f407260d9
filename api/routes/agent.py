"""/v1/agent: node agents register, heartbeat, poll their leases and report on attempts.

Every operation needs an agent token (acting for its own node) or an admin token (naming the
node). See :mod:`api.agent` for what each one does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from starlette.concurrency import run_in_threadpool

from api import admission, agent
from api.agent_schemas import (
    AgentPoll,
    AttemptIdPath,
    JobTokenPublic,
    LeaseStatusPublic,
    LeaseStatusReport,
    NodeHeartbeat,
    NodeLeases,
    NodeRegister,
    NodeStatus,
    PollAnswer,
)
from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, SessionDep
from api.errors import Problem, openapi_problems
from api.settings import Settings
from store.lease_signal import LeaseSignal

router = APIRouter(prefix="/v1/agent", tags=["agent"])
AGENTS = access(admin=ANY, user=DENIED, agent=OWN, job=DENIED)

PROBLEMS = openapi_problems(
    (401, "Missing or unknown token"),
    (403, "Only agents and admins"),
    (404, "No such node or attempt (or not the caller's node)"),
    (413, "Request body too large"),
    (422, "Invalid input; names the field"),
)
REGISTER_PROBLEMS: dict[int | str, dict[str, Any]] = {
    **PROBLEMS,
    **openapi_problems((409, "More GPUs (or another GPU type) than the node was approved for")),
}
STALE: dict[int | str, dict[str, Any]] = {
    **PROBLEMS,
    **openapi_problems((409, "The attempt must stop (revoked, lost or its job finished)")),
}


@router.post(
    "/register",
    response_model=NodeStatus,
    responses=REGISTER_PROBLEMS,
    summary="Register a node",
    openapi_extra=AGENTS,
)
def register(
    data: NodeRegister, request: Request, session: SessionDep, principal: CurrentPrincipal
) -> NodeStatus:
    """Announce the node's GPUs, GPU type and hostname; the node is READY. Registering again
    updates it. When the cluster's capacity changed a new plan is requested; registering again
    unchanged is a heartbeat. The node gets leases once an operator approved its GPUs
    (``PUT /v1/nodes/{node}/approval``; an admin registering a node approves what it
    registers); an agent reporting more GPUs than approved, or another GPU type, is refused
    (409)."""
    node_id = agent.acting_node(principal, data.node)
    node = agent.register(
        session, node_id, data, admission.arrived_at(request.scope), approve=principal.is_admin
    )
    session.commit()
    return agent.node_status(session, node)


@router.post(
    "/heartbeat",
    response_model=NodeStatus,
    responses=PROBLEMS,
    summary="Heartbeat",
    openapi_extra=AGENTS,
)
def heartbeat(
    request: Request,
    session: SessionDep,
    principal: CurrentPrincipal,
    data: Annotated[NodeHeartbeat | None, Body()] = None,
) -> NodeStatus:
    """A sign of life; send one every few seconds. A node silent for the round driver's TTL is
    marked LOST and its jobs go back to the queue. It counts from when the request arrived."""
    node_id = agent.acting_node(principal, data.node if data else None)
    return agent.heartbeat(session, node_id, admission.arrived_at(request.scope))


@router.get(
    "/leases",
    response_model=NodeLeases,
    responses=PROBLEMS,
    summary="Poll leases",
    openapi_extra=AGENTS,
)
def leases(
    session: SessionDep,
    principal: CurrentPrincipal,
    node: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$",
            description="Admins only: the node whose leases to read.",
        ),
    ] = None,
    running: Annotated[
        str | None,
        Query(
            max_length=8192,
            pattern=r"^[A-Za-z0-9,-]*$",
            description="Comma-separated attempt ids the agent runs now; those that must stop "
            "come back in `stop`.",
        ),
    ] = None,
) -> NodeLeases:
    """The leases the node must run now and the attempts it must stop."""
    node_id = agent.acting_node(principal, node)
    attempts = [a for a in (running or "").split(",") if a]
    answer = agent.node_leases(session, node_id, attempts)
    session.commit()  # ends the read in this thread (see api.deps: no thread hop to close)
    return answer


@router.post(
    "/poll",
    response_model=PollAnswer,
    responses=PROBLEMS,
    summary="Poll: reports, heartbeat and leases in one request",
    openapi_extra=AGENTS,
)
async def poll(
    data: AgentPoll, request: Request, session: SessionDep, principal: CurrentPrincipal
) -> PollAnswer:
    """What an agent does each contact, in one round trip: deliver its ``reports`` (each
    answered as its own status report would be, in ``reports``), heartbeat (unless ``heartbeat``
    is false; it counts from when the request arrived), and learn the leases to run and the
    attempts to stop. At most two reports per GPU of the node (at least 8) per poll. A live
    lease listed in ``running`` is acknowledged: it becomes RUNNING, which a ``started`` or
    ``running`` report would otherwise say. The agent's own loop uses this; the separate
    heartbeat, leases and status endpoints answer the same questions one at a time. With
    ``wait_s`` (a bounded long poll) the answer is held while nothing is new for the node
    (:func:`api.agent.has_news`), up to ``wait_s`` after the request arrived (a poll that waited
    for its turn, :mod:`api.admission`, is held that much less): the leases are read again as
    soon as a round driver (of this process, or of another over the database's notification
    channel) commits a round or a fill (store.lease_signal), and, while no channel feeds the
    signal, at least every ``poll_recheck_s``. While held the request takes no thread, no
    connection and no admission slot. A round out before it is due (the round driver's boundary
    lead) wakes every held poll at once: each node's re-read waits its turn
    (:func:`api.agent.stagger_s`), so the answers, and the polls that acknowledge them, come
    spread over the first half of the time left before the round is due, not in one burst; a
    turn past the poll's ``wait_s`` is cut to it (an agent's timeout allows for ``wait_s``, and
    an answer it gave up on loses the job tokens it minted). A
    long poll that had to defer some of what it said (``defer_busy``: a report or event answered
    503, a lease in ``running`` still not RUNNING) is answered at once, not held."""
    node_id = agent.acting_node(principal, data.node)
    signal: LeaseSignal = request.app.state.lease_signal
    seen = signal.generation
    arrived = admission.arrived_at(request.scope)
    answer = await run_in_threadpool(agent.poll, session, principal, node_id, data, arrived)
    if data.wait_s <= 0 or agent.has_news(answer, data) or agent.deferred(answer, data):
        return answer
    settings: Settings = request.app.state.settings
    # the hold counts from the poll's arrival: one that waited in admission's line is held less
    deadline = time.monotonic() + data.wait_s - max(0.0, time.time() - arrived.timestamp())
    again = data.model_copy(update={"reports": [], "events": [], "heartbeat": False, "logs": {}})
    while (left := deadline - time.monotonic()) > 0:
        # fed by the other processes' commits (signal.live): no need to re-read on a timer
        recheck = left if signal.live else min(left, settings.poll_recheck_s)
        async with admission.released():
            notified = await signal.wait(seen, recheck, node_id)
            if notified and signal.everyone_since(seen):
                # its turn, but never past its hold: the agent's timeout allows for wait_s
                turn = agent.stagger_s(node_id, answer.round_ends_at)
                await asyncio.sleep(min(turn, max(0.0, deadline - time.monotonic())))
        if not notified and deadline - time.monotonic() <= 0:
            break  # held to the end with no news: the first answer still holds
        seen = signal.generation
        fresh = await run_in_threadpool(agent.poll, session, principal, node_id, again)
        answer = fresh.model_copy(update={"reports": answer.reports, "events": answer.events})
        if agent.has_news(fresh, data):
            break
    return answer


@router.post(
    "/leases/{attempt_id}/status",
    response_model=LeaseStatusPublic,
    responses=STALE,
    summary="Report an attempt's status",
    openapi_extra=AGENTS,
)
def report_status(
    attempt_id: AttemptIdPath,
    report: LeaseStatusReport,
    session: SessionDep,
    principal: CurrentPrincipal,
) -> LeaseStatusPublic:
    """Report that the attempt started, is running, checkpointed, or exited with a code. A
    report for an attempt that must not run is a 409 problem with ``stop: true``. The same
    report twice gets the same answer."""
    outcome = agent.report_status(session, principal, attempt_id, report)
    session.commit()
    if outcome.refused is not None:
        raise Problem(
            409,
            "Stale attempt",
            f"{outcome.refused}: stop it",
            stop=True,
            attempt_id=attempt_id,
            job_state=outcome.status.job_state.value,
        )
    return outcome.status


@router.post(
    "/leases/{attempt_id}/token",
    status_code=201,
    response_model=JobTokenPublic,
    responses=STALE,
    summary="Get a job-scoped token for an attempt",
    openapi_extra=AGENTS,
)
def job_token(
    attempt_id: AttemptIdPath, session: SessionDep, principal: CurrentPrincipal
) -> JobTokenPublic:
    """A new token for the attempt's job (its SHOCKWAVE_TOKEN): it may post that job's events
    and read the job, nothing else. Shown once."""
    return agent.job_token(session, principal, attempt_id)
