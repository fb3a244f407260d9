"""rounds: plan age at the boundary and the leases the boundary issued, extended and revoked

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 03:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plan_age_s", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("leases_issued", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("leases_extended", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("leases_revoked", sa.Integer(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("leases_revoked")
        batch_op.drop_column("leases_extended")
        batch_op.drop_column("leases_issued")
        batch_op.drop_column("plan_age_s")
