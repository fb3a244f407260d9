"""nodes; jobs.measured_epoch_seconds (mean seconds per epoch at each batch size, from events)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26 01:18:39.290172
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("hostname", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("state", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('READY', 'LOST')", name="ck_nodes_state"),
        sa.CheckConstraint("gpus >= 1 AND gpus <= 1024", name="ck_nodes_gpus"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_state"), ["state"], unique=False)

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("measured_epoch_seconds", sa.JSON(), server_default="{}", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("measured_epoch_seconds")

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_state"))

    op.drop_table("nodes")
