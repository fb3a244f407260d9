"""The cluster version, and a plan request when something a plan depends on changes.

Routes call :func:`bump_and_request` inside the transaction that records the change (a job
arrives, finishes or is cancelled, a scaling event, a node joins or is lost). The cluster's
``state_version`` is bumped in that same transaction, so a plan made from older data is
recognisably stale, and, in reactive mode, a plan at the new version is asked for once the
transaction has committed (never before: a worker must find the data there). In lazy mode it
only bumps; the round driver asks for a plan once per interval.

Who is asked is a port: a :data:`PlanRequest` the process's composition root hands in (the
solver service's requester, see :mod:`solver_service.enqueue`) and :func:`attach` ties to a
session. The data layer knows nothing of Celery or of the solver: a session with no requester
attached bumps the version and asks nobody (the round driver asks every round anyway).

The bump itself is deferred to the moment the transaction commits (SQLAlchemy's
``before_commit``): the ``UPDATE`` locks the cluster's one row until the transaction ends, and
every writer needs that row, so taken early it would serialize whole transactions (a submission
held it while it inserted the job, its event and its idempotency record: docs/api.md measured
submissions queueing on it). Taken last, it is held only for the commit itself. One transaction
bumps the version once, however many changes it records: the version says "the data changed
since", not how many times. The version and the data still change atomically.

The same transaction sends a :data:`~store.lease_signal.CLUSTER` notification (Postgres
``NOTIFY``, delivered with the commit): a round driver in another process wakes and starts
waiting jobs on the GPUs the change freed (work conservation) without waiting for its tick.

The request after commit never fails the request that made it: an unreachable broker is logged
and skipped (the data is committed; the round driver asks again every round).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import event, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col

from store.lease_signal import CLUSTER, announce
from store.tables import ClusterRow, utcnow

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "default"
PlanRequest = Callable[[str, int], None]
"""``request_plan(cluster_id, state_version)``: ask for a plan; must return quickly and must
not raise for an unreachable solver service (it may be down: the data is committed)."""
_REQUESTER = "shockwave.plan_requester"
_BUMPS = "shockwave.state_bumps"
_PENDING = "shockwave.plan_requests"
_HOOKED = "shockwave.plan_hooks"


def no_plan_requests(cluster_id: str, state_version: int) -> None:
    """A :data:`PlanRequest` that asks nobody (plans then come when the round driver asks)."""
    log.debug("no solver attached: plan %s@%s not requested", cluster_id, state_version)


def attach(session: Session, request_plan: PlanRequest) -> Session:
    """Make ``request_plan`` the port ``session``'s committed changes ask for plans through."""
    session.info[_REQUESTER] = request_plan
    return session


def ensure_cluster(session: Session, cluster_id: str = DEFAULT_CLUSTER) -> None:
    """Create the cluster's row with its defaults if it does not exist (safe under races)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    row = ClusterRow(id=cluster_id).model_dump()
    session.execute(insert(ClusterRow).values(**row).on_conflict_do_nothing())


def bump_state_version(session: Session, cluster_id: str = DEFAULT_CLUSTER) -> tuple[int, str]:
    """Increment the cluster's state version in the caller's transaction (creating the row if
    needed); the new version and the cluster's re-plan mode. The row stays locked until the
    transaction ends, so concurrent bumps serialize: call it as late in the transaction as
    possible. One round trip when the row exists (the usual case), three the first time."""
    bumped = _increment(session, cluster_id)
    if bumped is None:
        ensure_cluster(session, cluster_id)
        bumped = _increment(session, cluster_id)
    assert bumped is not None, f"cluster {cluster_id} vanished"
    return bumped


def _increment(session: Session, cluster_id: str) -> tuple[int, str] | None:
    row = session.execute(
        update(ClusterRow)
        .where(col(ClusterRow.id) == cluster_id)
        .values(state_version=col(ClusterRow.state_version) + 1, updated_at=utcnow())
        .returning(col(ClusterRow.state_version), col(ClusterRow.replan))
    ).one_or_none()
    return None if row is None else (int(row[0]), str(row[1]))


def bump_and_request(session: Session, reason: str, cluster_id: str = DEFAULT_CLUSTER) -> None:
    """Record that the cluster changed (``reason``, for the log): its version is bumped when
    ``session`` commits, last thing in the transaction, and in reactive mode a plan at the new
    version is asked for after the commit. Nothing happens if the transaction rolls back."""
    bumps: dict[str, list[str]] = session.info.setdefault(_BUMPS, {})
    bumps.setdefault(cluster_id, []).append(reason)
    _hook(session)


def request_after_commit(session: Session, cluster_id: str, state_version: int) -> None:
    """Ask for a plan of ``cluster_id`` at ``state_version`` once ``session`` commits; forget
    it if the transaction rolls back. Several requests in one transaction send the newest."""
    pending: dict[str, int] = session.info.setdefault(_PENDING, {})
    pending[cluster_id] = max(state_version, pending.get(cluster_id, state_version))
    _hook(session)


def _hook(session: Session) -> None:
    if not session.info.get(_HOOKED):
        event.listen(session, "before_commit", _apply_bumps)
        event.listen(session, "after_commit", _send_pending)
        event.listen(session, "after_rollback", _drop_pending)
        session.info[_HOOKED] = True


def _apply_bumps(session: Session) -> None:
    """``before_commit``: bump each changed cluster once (in a fixed order, so two
    transactions never wait on each other's cluster rows), queue the plan requests, and tell
    a round driver in another process (store.lease_signal: sent with the commit)."""
    bumps: dict[str, list[str]] = session.info.pop(_BUMPS, {})
    if bumps:
        announce(session, CLUSTER)
    for cluster_id in sorted(bumps):
        version, replan = bump_state_version(session, cluster_id)
        log.debug("cluster %s at version %s: %s", cluster_id, version, "; ".join(bumps[cluster_id]))
        if replan == "reactive":
            request_after_commit(session, cluster_id, version)


def _send_pending(session: Session) -> None:
    request_plan: PlanRequest = session.info.get(_REQUESTER, no_plan_requests)
    pending: dict[str, int] = session.info.pop(_PENDING, {})
    for cluster_id, version in pending.items():
        try:
            request_plan(cluster_id, version)
        except Exception:
            log.exception("plan request %s@%s failed; the driver asks again", cluster_id, version)


def _drop_pending(session: Session) -> None:
    session.info.pop(_BUMPS, None)
    session.info.pop(_PENDING, None)
