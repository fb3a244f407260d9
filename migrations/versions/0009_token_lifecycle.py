"""tokens: expiry, revocation and last use (the token lifecycle)

A token may be given an expiry (``expires_at``), revoked (``revoked_at``; the row is kept, so
the list shows what was revoked and when), and records when it was last read from the
database (``last_used_at``: at most one API process's token-cache lifetime late).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("expires_at", "revoked_at", "last_used_at")


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
