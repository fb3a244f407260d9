"""leases.began_at, leases.first_ends_at: each attempt's stint as the simulator counts it

Gavel ranks jobs by the service they received since its last recompute. Counted from progress
reports it is off by seconds to tens of seconds (reports lag, partial epochs are estimated),
enough to break the simulator's exact ties among jobs that held the same rounds; counted from
the leases it is what each job held. ``began_at``: when the attempt's time counts from (the
round's boundary for a lease issued just ahead of it, the issue time for a fill);
``first_ends_at``: the end of its first lease, which the restore rule reads (extensions move
``ends_at``). Null on rows written before: those count from ``issued_at`` and ``ends_at``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("began_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("first_ends_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("first_ends_at")
        batch_op.drop_column("began_at")
