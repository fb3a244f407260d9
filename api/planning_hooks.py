"""Ask for a new plan when something a plan depends on changes (SPEC 3.4, re-planning).

Routes call :func:`bump_and_request` inside the transaction that records the change (a job
arrives, finishes or is cancelled, a scaling event, a node joins or is lost). It bumps the
cluster's ``state_version`` in that same transaction, so a plan made from older data is
recognisably stale, and, in reactive mode, asks the solver service for a plan at the new
version once the transaction has committed (never before: a worker must find the data there).
In lazy mode it only bumps; the round driver asks for a plan once per interval.

The request after commit never fails the request that made it: an unreachable broker is logged
and skipped (the data is committed; the round driver asks again every round).
"""

from __future__ import annotations

import logging

from sqlalchemy import event, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col

from api.tables import ClusterRow, utcnow

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "default"
_PENDING = "shockwave.plan_requests"
_HOOKED = "shockwave.plan_hooks"


def ensure_cluster(session: Session, cluster_id: str = DEFAULT_CLUSTER) -> None:
    """Create the cluster's row with its defaults if it does not exist (safe under races)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    row = ClusterRow(id=cluster_id).model_dump()
    session.execute(insert(ClusterRow).values(**row).on_conflict_do_nothing())


def bump_state_version(session: Session, cluster_id: str = DEFAULT_CLUSTER) -> tuple[int, str]:
    """Increment the cluster's state version in the caller's transaction (creating the row if
    needed); the new version and the cluster's re-plan mode. The row stays locked until the
    transaction ends, so concurrent bumps serialize."""
    ensure_cluster(session, cluster_id)
    version, replan = session.execute(
        update(ClusterRow)
        .where(col(ClusterRow.id) == cluster_id)
        .values(state_version=col(ClusterRow.state_version) + 1, updated_at=utcnow())
        .returning(col(ClusterRow.state_version), col(ClusterRow.replan))
    ).one()
    return int(version), str(replan)


def bump_and_request(session: Session, reason: str, cluster_id: str = DEFAULT_CLUSTER) -> int:
    """Record that the cluster changed (``reason``, for the log) and, in reactive mode, ask for
    a plan after the transaction commits. Returns the new state version."""
    version, replan = bump_state_version(session, cluster_id)
    log.debug("cluster %s at version %s: %s", cluster_id, version, reason)
    if replan == "reactive":
        request_after_commit(session, cluster_id, version)
    return version


def request_after_commit(session: Session, cluster_id: str, state_version: int) -> None:
    """Ask for a plan of ``cluster_id`` at ``state_version`` once ``session`` commits; forget
    it if the transaction rolls back. Several requests in one transaction send the newest."""
    pending: dict[str, int] = session.info.setdefault(_PENDING, {})
    pending[cluster_id] = max(state_version, pending.get(cluster_id, state_version))
    if not session.info.get(_HOOKED):
        event.listen(session, "after_commit", _send_pending)
        event.listen(session, "after_rollback", _drop_pending)
        session.info[_HOOKED] = True


def _send_pending(session: Session) -> None:
    from solver_service.enqueue import request_plan

    pending: dict[str, int] = session.info.pop(_PENDING, {})
    for cluster_id, version in pending.items():
        try:
            request_plan(cluster_id, version)
        except Exception:
            log.exception("plan request %s@%s failed; the driver asks again", cluster_id, version)


def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)
