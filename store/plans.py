"""Stored plans: the one for a version and base round, the freshest with a column for a round,
the newest of a cluster.

A plan's ``rounds[t]`` are the job ids of round ``base_round + t`` (:class:`~store.tables.PlanRow`);
the solver service writes them (:mod:`solver_service.planning`), the round driver and the
prediction endpoint read them through these queries.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func
from sqlmodel import Session, col, select

from store.tables import PlanRow

MAX_PLAN_WINDOW = 256
"""Plans whose base round lies further back than this are not searched for a column."""


def plan_at(
    session: Session, cluster_id: str, state_version: int, base_round: int
) -> PlanRow | None:
    """The stored plan for this cluster, version and base round, if any."""
    return session.exec(
        select(PlanRow).where(
            PlanRow.cluster_id == cluster_id,
            PlanRow.state_version == state_version,
            PlanRow.base_round == base_round,
        )
    ).first()


PlanRef = tuple[int, datetime]
"""A stored plan's id and creation time: what names it (a stored plan never changes), so a
reader that kept what it read of a plan need not read its row again."""


def freshest_plan(
    session: Session, cluster_id: str, r: int, made_by: datetime | None = None
) -> PlanRow | None:
    """The plan with a column for round ``r`` made at the highest state version (the latest
    base round among equals), or None; ``made_by``: among the plans stored by then only.

    Only that one plan is loaded: the candidates are ranked by their ids, base rounds and
    column counts (``json_array_length``, on Postgres and SQLite alike), because a busy
    cluster stores a plan per change and each carries a whole window of job ids."""
    ref = freshest_plan_ref(session, cluster_id, r, made_by)
    return None if ref is None else session.get(PlanRow, ref[0])


def freshest_plan_ref(
    session: Session, cluster_id: str, r: int, made_by: datetime | None = None
) -> PlanRef | None:
    """:func:`freshest_plan`'s plan named, not read (:data:`PlanRef`)."""
    query = select(PlanRow.id, PlanRow.created_at).where(
        PlanRow.cluster_id == cluster_id,
        col(PlanRow.base_round) <= r,
        col(PlanRow.base_round) > r - MAX_PLAN_WINDOW,
        func.json_array_length(col(PlanRow.rounds)) > r - col(PlanRow.base_round),
    )
    if made_by is not None:
        query = query.where(col(PlanRow.created_at) <= made_by)
    ranked = session.exec(
        query.order_by(col(PlanRow.state_version).desc(), col(PlanRow.base_round).desc()).limit(1)
    ).first()
    if ranked is None or ranked[0] is None:
        return None
    return ranked[0], ranked[1]


def newest_plan(session: Session, cluster_id: str) -> PlanRow | None:
    """The plan made at the cluster's highest state version (the last stored among equals)."""
    return session.exec(
        select(PlanRow)
        .where(PlanRow.cluster_id == cluster_id)
        .order_by(col(PlanRow.state_version).desc(), col(PlanRow.id).desc())
        .limit(1)
    ).first()


def newest_plan_ref(session: Session, cluster_id: str) -> PlanRef | None:
    """:func:`newest_plan`'s plan named, not read (:data:`PlanRef`)."""
    ranked = session.exec(
        select(PlanRow.id, PlanRow.created_at)
        .where(PlanRow.cluster_id == cluster_id)
        .order_by(col(PlanRow.state_version).desc(), col(PlanRow.id).desc())
        .limit(1)
    ).first()
    if ranked is None or ranked[0] is None:
        return None
    return ranked[0], ranked[1]
