"""node_approvals: the GPUs an operator approved per node; population_priors per tenant

``node_approvals``: a node gets leases only once an operator approved its GPUs (count, and type
where set), and a registration reporting more than approved is refused; an agent's word alone
no longer sets a node's capacity. Nodes registered before this revision are approved as they
stand (their operators already let them run jobs).

``population_priors`` gains ``tenant`` in its key: a tenant's jobs learn only from that
tenant's jobs. The shared rows learnt before cannot be split by tenant and are dropped (each
tenant's prior starts empty, the paper's rule, and relearns as its jobs succeed).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_approvals",
        sa.Column("node_id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("approved_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("gpus >= 1 AND gpus <= 1024", name="ck_node_approvals_gpus"),
        sa.PrimaryKeyConstraint("node_id"),
    )
    op.execute(
        "INSERT INTO node_approvals (node_id, gpus, gpu_type, approved_at) "
        "SELECT id, gpus, gpu_type, registered_at FROM nodes"
    )
    op.drop_table("population_priors")
    op.create_table(
        "population_priors",
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("prior", sa.JSON(), nullable=False),
        sa.Column("learnt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.PrimaryKeyConstraint("cluster_id", "tenant"),
    )


def downgrade() -> None:
    op.drop_table("population_priors")
    op.create_table(
        "population_priors",
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("prior", sa.JSON(), nullable=False),
        sa.Column("learnt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.PrimaryKeyConstraint("cluster_id"),
    )
    op.drop_table("node_approvals")
