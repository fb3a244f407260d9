"""jobs.carried_s: training since the last reported epoch, kept across attempts

A program stopped mid-epoch checkpoints where it is and resumes from there; the seconds its
attempts trained since its last reported epoch are banked on the job when an attempt stops
(``store.jobs.bank_training``) and cleared by its next reported epoch, so the planner's
snapshot sees the part of an epoch a preempted job had already done, as the simulator does.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 02:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("carried_s", sa.Float(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("carried_s")
