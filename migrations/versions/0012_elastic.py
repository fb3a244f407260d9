"""jobs.elastic and plans.widths: elastic workers

``jobs.elastic``: an elastic job's range of GPU counts and its declared speed-ups
(``{"min_gpus": 1, "max_gpus": 8, "speedup": {"2": {"32": 1.8}}}``), NULL for a job that runs on
its requested count only. ``plans.widths``: the GPU count a plan gives each elastic job it runs
on other than its requested one (``{job id: gpus}``); the round driver leases that many.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("elastic", sa.JSON(), nullable=True))
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("widths", sa.JSON(), server_default="{}", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("widths")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("elastic")
