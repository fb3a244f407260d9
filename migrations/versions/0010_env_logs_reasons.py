"""jobs.env, leases.log_tail and leases.reason: what an operator reads about a job

``jobs.env``: environment variables the job's process gets (besides the SHOCKWAVE_* ones).
``leases.log_tail``: the last few KiB of an attempt's output, shipped by its agent with its
polls (``shockwave jobs logs``, the dashboard's job page). ``leases.reason``: why the round
driver took the attempt back (the preemption's reason, shown in the job's events too).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("env", sa.JSON(), server_default="{}", nullable=False))
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("log_tail", sa.Text(), nullable=True))
        batch_op.add_column(
            sa.Column("reason", sa.String(length=256), server_default="", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("reason")
        batch_op.drop_column("log_tail")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("env")
