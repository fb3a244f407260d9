"""jobs: the command an agent runs for the job (argv) and an optional container image

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("command", sa.JSON(), server_default="[]", nullable=False))
        batch_op.add_column(sa.Column("image", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("image")
        batch_op.drop_column("command")
