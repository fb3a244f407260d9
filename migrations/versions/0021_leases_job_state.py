"""leases indexed by job and state: a job's live leases read without the state index

A job's leases in some states (whether it runs elsewhere, whether it checkpointed, a revoked
attempt's successor, the live leases a finished job revokes) were read through the index on
``job_id`` and the one on ``state``: on a table whose statistics are not gathered yet (a new
cluster, or a database without autovacuum) the planner combined both (a bitmap AND), and each
such read took every live lease's entry of the state index, thousands at a thousand nodes, to
find a job's one or two; the round driver makes such reads for each job a boundary suspends.
One index on ``(job_id, state)`` narrows the read by both columns and serves every read by
``job_id`` alone (its leading column), so it replaces the index on ``job_id``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-30 07:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_leases_job_state", "leases", ["job_id", "state"])
    op.drop_index("ix_leases_job_id", table_name="leases")


def downgrade() -> None:
    op.create_index("ix_leases_job_id", "leases", ["job_id"])
    op.drop_index("ix_leases_job_state", table_name="leases")
