"""leases.state and tokens.attempt_id indexed: reads every boundary and every poll make

Every boundary and every mid-round fill reads the leases by state (the live ones, locked; the
revoked ones still checkpointing), and the rows of finished attempts stay: without an index
those reads scan every lease the cluster ever issued, a table that grows by the leases each
round issues. An agent's poll that is about to start attempts asks which of them have a job
token (and a stopped attempt's tokens are revoked by attempt): without an index each such
poll scans every token, one per attempt ever started.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29 09:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_leases_state", "leases", ["state"])
    op.create_index("ix_tokens_attempt_id", "tokens", ["attempt_id"])


def downgrade() -> None:
    op.drop_index("ix_tokens_attempt_id", table_name="tokens")
    op.drop_index("ix_leases_state", table_name="leases")
