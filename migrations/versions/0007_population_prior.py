"""population_priors: the prior learnt from the jobs that succeeded, one row per cluster

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "population_priors",
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("prior", sa.JSON(), nullable=False),
        sa.Column("learnt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.PrimaryKeyConstraint("cluster_id"),
    )


def downgrade() -> None:
    op.drop_table("population_priors")
