"""The boundary gate: a round driver that writes a boundary or a fill, which locks every active
job and every live lease, first waits for the agents' polls already holding job locks, and
no poll starts taking them meanwhile.

Without it the driver's lock of the active jobs (one ``SELECT ... FOR UPDATE`` in arrival
order) met, row after row, the jobs that polls arriving during it had locked ahead of it (a
poll locks the jobs its reports, events and starts name, for its whole transaction): at a
thousand nodes, a hundred polls a second on an API process short of CPU, the waits added up
to seconds a boundary. With the gate the driver waits once, for the polls in flight when it
closes the gate, and a poll that finds it closed defers its job work at once
(``defer_busy``: its reports and events answered 503, its starts acknowledged later), as it
would for each job the driver holds.

On Postgres the gate is a transaction-level advisory lock, one per database schema: the
driver takes it exclusively, a poll shared, each released at its transaction's end; the
driver takes it before any row lock, and a poll before its job locks, so neither waits for
the other while holding what the other waits for. Elsewhere (SQLite, one writer at a time)
it is always open.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlmodel import Session

GATE = 0x5357_0001
"""The advisory lock's first key (the second: the schema's name, hashed)."""

_CLOSE = text("SELECT pg_advisory_xact_lock(:gate, hashtext(current_schema()))")
_PASS = text("SELECT pg_advisory_xact_lock_shared(:gate, hashtext(current_schema()))")
_TRY_PASS = text("SELECT pg_try_advisory_xact_lock_shared(:gate, hashtext(current_schema()))")


def close(session: Session) -> None:
    """Close the gate until ``session``'s transaction ends, once the polls that passed it have
    ended theirs (a boundary or a fill, before it locks any job)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_CLOSE, {"gate": GATE})


def pass_through(connection: Connection, *, wait: bool) -> bool:
    """Pass the gate for the rest of ``connection``'s transaction (a poll, before it locks any
    job): whether it passed. ``wait``: wait while the gate is closed (a poll that waits for
    busy jobs anyway); else it passes only when the gate is open and no driver waits at it."""
    if connection.dialect.name != "postgresql":
        return True
    if wait:
        connection.execute(_PASS, {"gate": GATE})
        return True
    return bool(connection.execute(_TRY_PASS, {"gate": GATE}).scalar_one())
