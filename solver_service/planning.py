"""Plan one cluster: snapshot from the database -> the cluster's policy -> a stored plan.

:func:`plan_cluster` is what a solver worker (or the embedded in-process solver) runs for a
request ``(cluster, state_version)``. In order:

1. Skip the request if a plan for the cluster's current version and the next round already
   exists (a redelivered or duplicate request), or if it is stale (the cluster has moved past
   ``state_version``) and a later request is sure to come: in reactive mode every change asks
   for a plan at its own version once it commits, so the newest request plans. In lazy mode
   a change only bumps the version and nobody asks again before the round driver's next
   request, so a stale request plans the cluster as it is now: the plan is tagged with the
   version its snapshot read (at least the one asked), which is what the driver's request
   half-way through a round waits for (dropping it would leave the next round to the
   previous plan).
2. Read the snapshot for round ``current_round + 1`` (:mod:`store.snapshot`) and end
   the read transaction, so no lock or connection is held while the policy runs.
3. Run the cluster's policy (``ClusterRow.policy``, looked up in the core's registry) on it,
   timed with the injected ``timer``; a job the policy cannot model is left out of the plan
   and told why (``shockwave.policies.policy.decide_isolating``; an ``excluded`` event on the job).
   Steps 2 and 3 run with the cycle collector quiet (:mod:`solver_service.collector`).
4. Store the plan, holding the cluster row (``SELECT ... FOR UPDATE`` on Postgres; SQLite has
   one writer at a time): if another worker stored the same plan meanwhile, keep theirs. The
   policy's new memory is saved on the cluster row unless a plan made at a later state (a
   higher version, or the same version and a later base round) is stored already: also when
   the row moved on during the solve (a job event, the boundary), because the plan is still
   the latest decision and the one the round driver uses (as ``previous_plan``, or for its
   next columns), and the newer request already queued by whoever moved the row plans from
   it, as the simulator threads one decision's memory into the next. (Dropping the memory
   then would start the next plan from an older one, so Shockwave would re-solve a window the
   cluster is already following.) The unique (cluster,
   version, base round) constraint settles races the lock cannot see.

A plan's ``rounds[t]`` are the jobs of round ``base_round + t``: ``Decision.rounds``. ``rounds[0]``
is exactly the policy's decision (``Decision.jobs``, work-conserving fill included); for a policy
that plans ahead, ``rounds[1:]`` are the rest of its planned window (``Decision.planned``:
restricted to the jobs in the snapshot and not yet filled with waiting jobs); other policies
decide one round at a time, so their plans have one round. The solve's figures stored with the
plan are ``Decision.solve``'s. Nothing here looks inside a policy's state or params.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from shockwave.domain import state_codec
from shockwave.policies.policy import SolveSummary, decide_isolating, get_policy, service_params
from solver_service.collector import quiet_collector
from store.events import record_exclusions
from store.plans import plan_at
from store.snapshot import WITHOUT_POLICY_STATE, KnownSpecs, NoCapacity, load_snapshot
from store.tables import ClusterRow, PlanRow, utcnow

log = logging.getLogger(__name__)


def plan_cluster(
    session: Session,
    cluster_id: str,
    state_version: int | None,
    *,
    now: datetime,
    timer: Callable[[], float] = time.perf_counter,
    params: Any | None = None,
    solver_time_limit_s: float | None = None,
    time_scale: float = 1.0,
    priority_classes: Mapping[str, float] | None = None,
    known: KnownSpecs | None = None,
) -> PlanRow | None:
    """Plan the next round of ``cluster_id`` as of ``state_version`` (None: whatever version
    the cluster is at; a lazy cluster past it is planned as it is now, step 1). Returns the
    stored plan, the plan that already existed for this version and round, or None when there
    is nothing to do (a stale request a later one supersedes, unknown cluster, no READY node).
    ``params``: the policy's params (default: its defaults, with the cluster's re-plan mode
    and ``solver_time_limit_s`` where the policy has those knobs, its duration knobs divided
    by ``time_scale``). ``priority_classes``: the setting's classes and multipliers.
    ``known``: the job specs this process kept from its earlier plans (:class:`KnownSpecs`).
    Commits ``session``."""
    cluster = session.get(
        ClusterRow, cluster_id, populate_existing=True, options=WITHOUT_POLICY_STATE
    )
    if cluster is None:
        log.info("plan %s@%s: no such cluster", cluster_id, state_version)
        session.rollback()
        return None
    stale = state_version is not None and state_version < cluster.state_version
    if stale and cluster.replan == "reactive":  # a request at the cluster's version follows
        log.info(
            "plan %s@%s: stale (cluster at %s, a request at its version follows)",
            cluster_id,
            state_version,
            cluster.state_version,
        )
        session.rollback()
        return None
    if stale:
        log.info(
            "plan %s@%s: the cluster is at %s, planned as it is (lazy: no later request follows)",
            cluster_id,
            state_version,
            cluster.state_version,
        )
    base_round = cluster.current_round + 1
    existing = plan_at(session, cluster_id, cluster.state_version, base_round)
    if existing is not None:
        log.info("plan %s@%s round %s: already planned", cluster_id, state_version, base_round)
        return _release(session, existing)
    policy = get_policy(cluster.policy)
    if params is None:
        params = service_params(
            policy,
            replan=cluster.replan,
            solver_time_limit_s=solver_time_limit_s,
            time_scale=time_scale,
        )
    with quiet_collector():
        loading = time.perf_counter()
        try:
            snapshot, version = load_snapshot(
                session, cluster_id, base_round, now, priority_classes, known
            )
        except NoCapacity:
            log.info("plan %s@%s: no READY node, nothing to plan", cluster_id, state_version)
            session.rollback()
            return None
        session.rollback()
        loaded = time.perf_counter() - loading

        started = timer()
        decision = decide_isolating(policy, snapshot, params)
        seconds = timer() - started
    timings = PlanTimings(snapshot_s=loaded, solve_s=seconds)

    plan = PlanRow(
        cluster_id=cluster_id,
        state_version=version,
        base_round=base_round,
        policy=policy.name,
        rounds=[list(column) for column in decision.rounds],
        types=dict(decision.types),
        widths=dict(decision.widths),
        solve_seconds=seconds,
        **solve_summary(decision.solve),
    )
    return _store(session, plan, decision.state, timings, decision.excluded)


@dataclasses.dataclass(frozen=True, slots=True)
class PlanTimings:
    """Seconds spent reading the snapshot and in the policy, for the plan's log line along
    with the time to store it (``bench/scale.py`` reads them there). Only the policy's time
    comes from the injected ``timer`` (it is stored with the plan); these are wall times."""

    snapshot_s: float
    solve_s: float


def solve_summary(solve: SolveSummary | None) -> dict[str, Any]:
    """The plan row's columns of a solve's figures (none for a policy that solves nothing)."""
    if solve is None:
        return {}
    return {
        "objective": solve.objective,
        "bound": solve.bound,
        "gain_gap": solve.gain_gap,
        "status": solve.status,
        "solver": solve.solver,
    }


def _store(
    session: Session,
    plan: PlanRow,
    policy_state: object | None,
    timings: PlanTimings,
    excluded: Mapping[str, str],
) -> PlanRow | None:
    storing = time.perf_counter()
    cluster = session.get(
        ClusterRow,
        plan.cluster_id,
        with_for_update=True,
        populate_existing=True,
        options=WITHOUT_POLICY_STATE,
    )
    if cluster is None:
        session.rollback()
        return None
    existing = plan_at(session, plan.cluster_id, plan.state_version, plan.base_round)
    if existing is not None:
        return _release(session, existing)
    newest = not _newer_plan_stored(session, plan)
    plan.created_at = utcnow()  # when it is stored: what a round trip and a plan's age count to
    session.add(plan)
    record_exclusions(session, excluded)
    current = (
        cluster.state_version == plan.state_version and cluster.current_round + 1 == plan.base_round
    )
    if newest:
        cluster.policy_state = state_codec.encode(policy_state)
        cluster.updated_at = utcnow()
        session.add(cluster)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return _release(
            session, plan_at(session, plan.cluster_id, plan.state_version, plan.base_round)
        )
    stored = time.perf_counter() - storing
    session.refresh(plan)
    log.info(
        "plan %s@%s round %s: %s jobs now, %s rounds, %s %s in %.3f s "
        "(snapshot %.3f s, store %.3f s)%s",
        plan.cluster_id,
        plan.state_version,
        plan.base_round,
        len(plan.rounds[0]) if plan.rounds else 0,
        len(plan.rounds),
        plan.solver or plan.policy,
        plan.status,
        plan.solve_seconds,
        timings.snapshot_s,
        stored,
        ""
        if current
        else " (cluster moved on; policy state saved)"
        if newest
        else " (cluster moved on; a newer plan's policy state kept)",
    )
    return _release(session, plan)


def _newer_plan_stored(session: Session, plan: PlanRow) -> bool:
    """Whether a plan made at a later state (a higher version, or the same version and a
    later base round) is stored already: its policy memory, saved with it, is newer than
    ``plan``'s (only where solves overlap: several workers)."""
    newer = session.exec(
        select(PlanRow.id)
        .where(
            PlanRow.cluster_id == plan.cluster_id,
            or_(
                col(PlanRow.state_version) > plan.state_version,
                and_(
                    col(PlanRow.state_version) == plan.state_version,
                    col(PlanRow.base_round) > plan.base_round,
                ),
            ),
        )
        .limit(1)
    ).first()
    return newer is not None


def _release(session: Session, plan: PlanRow | None) -> PlanRow | None:
    """End the session's transaction and hand ``plan`` back loaded and detached, so that it
    stays readable after the caller closes the session."""
    if plan is not None:
        session.expunge(plan)
    session.rollback()
    return plan
