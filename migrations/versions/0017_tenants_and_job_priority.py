"""tenants, tenant_changes, jobs.priority, jobs.submitted_by: the tenant tree, shares, limits

``tenants``: one row per configured tenant, keyed by its path in the tree (``org/team``; its
parent is the path without the last segment). ``weight``: its share among its siblings;
``guaranteed_gpus``, ``max_gpus``: GPUs it is guaranteed and the most it may hold (null: none);
``max_jobs``: the most jobs it may have queued and running (null: no limit). A tenant without
a row has weight 1 and no limits. ``tenant_changes``: every change, with its time, who made it
and the settings after it. ``jobs.priority``: the job's priority class (null: none named);
``jobs.submitted_by``: the caller that submitted it (``token:<id>``; empty on rows from
before), which usage groups by.

Revision ID: 0017
Revises: 0015
Create Date: 2026-11-29 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("path", sa.String(length=64), primary_key=True),
        sa.Column("parent", sa.String(length=64), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False, server_default="1"),
        sa.Column("guaranteed_gpus", sa.Integer(), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_jobs", sa.Integer(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("weight > 0", name="ck_tenants_weight"),
        sa.CheckConstraint("guaranteed_gpus >= 0", name="ck_tenants_guaranteed"),
        sa.CheckConstraint("max_gpus >= 0", name="ck_tenants_max_gpus"),
        sa.CheckConstraint("max_jobs >= 0", name="ck_tenants_max_jobs"),
    )
    op.create_index("ix_tenants_parent", "tenants", ["parent"])
    op.create_table(
        "tenant_changes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("path", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("guaranteed_gpus", sa.Integer(), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_jobs", sa.Integer(), nullable=True),
        sa.Column("changed_by", sa.String(length=64), nullable=False, server_default=""),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_tenant_changes_path", "tenant_changes", ["path", "changed_at"])
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.String(length=32), nullable=True))
        batch_op.add_column(
            sa.Column("submitted_by", sa.String(length=64), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("submitted_by")
        batch_op.drop_column("priority")
    op.drop_index("ix_tenant_changes_path", table_name="tenant_changes")
    op.drop_table("tenant_changes")
    op.drop_index("ix_tenants_parent", table_name="tenants")
    op.drop_table("tenants")
