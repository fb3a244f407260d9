"""the large JSON documents stored without compression: a plan's rounds, the policy's memory, a
round's jobs

Each is a list or map of job ids (random UUIDs) that Postgres's default compression (pglz)
tries and fails to shrink: at 10,000 jobs a plan's rounds are 6 MB, the policy's memory 8 MB,
a round's jobs 200 kB, each stored at full size after the attempt, which cost about 0.4 s of
the database's CPU for the 8 MB memory alone. Every plan writes the first two and every
boundary and mid-round fill the third. ``STORAGE EXTERNAL`` keeps such a value out of line
without trying to compress it. Postgres only (SQLite stores them as they are).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29 18:30:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("plans", "rounds"), ("clusters", "policy_state"), ("rounds", "jobs"))


def _storage(mode: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in COLUMNS:
        op.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" SET STORAGE {mode}')


def upgrade() -> None:
    _storage("EXTERNAL")


def downgrade() -> None:
    _storage("EXTENDED")
