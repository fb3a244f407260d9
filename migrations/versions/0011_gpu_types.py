"""jobs.type_throughput and plans.types: GPU types in the service

``jobs.type_throughput``: the job's declared throughput on other GPU types, type -> batch
size -> samples/s of its gang (its ``throughput`` is on its reference type).
``plans.types``: job id -> the GPU type the policy planned the job on (typed clusters only;
placement keeps the gang there, and the prediction endpoint reports it).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("type_throughput", sa.JSON(), server_default="{}", nullable=False)
        )
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("types", sa.JSON(), server_default="{}", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("types")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("type_throughput")
