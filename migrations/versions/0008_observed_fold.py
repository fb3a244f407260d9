"""jobs.epoch_seconds and jobs.scalings: the state a job's client events are folded into

Each new event is folded into the job's row with constant work instead of re-reading all of
the job's events (shockwave.domain.observed): ``epoch_seconds`` holds, per batch size, the total
seconds and the count of the progress events measured at it (the mean needs both), and
``scalings`` the job's scaling events as sorted ``[epoch, seq, batch size]`` triples (the
regimes are cut from them). Existing jobs get both from their stored events.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 09:00:00.000000
"""

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("epoch_seconds", sa.JSON(), server_default="{}", nullable=False)
        )
        batch_op.add_column(sa.Column("scalings", sa.JSON(), server_default="[]", nullable=False))
    _fold_stored_events()


def _fold_stored_events() -> None:
    """Fill both columns of every job from its stored client events (in seq order)."""
    events = sa.table(
        "job_events",
        sa.column("job_id", sa.String),
        sa.column("seq", sa.Integer),
        sa.column("kind", sa.String),
        sa.column("payload", sa.JSON),
    )
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("epoch_seconds", sa.JSON),
        sa.column("scalings", sa.JSON),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(events.c.job_id, events.c.seq, events.c.kind, events.c.payload)
        .where(events.c.kind.in_(("progress", "scaling")))
        .order_by(events.c.job_id, events.c.seq)
    ).all()
    totals: dict[str, dict[str, list[Any]]] = defaultdict(dict)
    scalings: dict[str, list[list[int]]] = defaultdict(list)
    for job_id, seq, kind, payload in rows:
        if kind == "progress":
            entry = totals[job_id].setdefault(str(int(payload["batch_size"])), [0.0, 0])
            entry[0] += float(payload["seconds"])
            entry[1] += 1
        else:
            scalings[job_id].append([int(payload["epoch"]), int(seq), int(payload["batch_size"])])
    for job_id in sorted(set(totals) | set(scalings)):
        connection.execute(
            jobs.update()
            .where(jobs.c.id == job_id)
            .values(epoch_seconds=totals.get(job_id, {}), scalings=sorted(scalings[job_id]))
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("scalings")
        batch_op.drop_column("epoch_seconds")
