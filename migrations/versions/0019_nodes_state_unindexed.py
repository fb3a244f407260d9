"""nodes.state no longer indexed: a node's heartbeat finds its row by its key

A node's state has two values and nearly every node is READY, so the index on it never
narrows a read: every reader of the READY nodes reads them all. Its harm was the heartbeat
(``UPDATE nodes ... WHERE id = :node AND state = 'READY'``, every agent poll): on a table
whose statistics are not gathered yet (a cluster whose nodes just registered, or a database
without autovacuum) the planner took the index on ``state`` and read every READY node's row
to find one, a thousand rows a poll at a thousand nodes. Without it the only index on the
predicate is the primary key.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29 18:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_nodes_state", table_name="nodes")


def downgrade() -> None:
    op.create_index("ix_nodes_state", "nodes", ["state"])
