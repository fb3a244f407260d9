"""``shockwave admin list-tokens``, ``revoke-token`` and ``set-token-expiry``: the token
lifecycle on the database directly (the API's ``/v1/tokens`` does the same for admins over
HTTP). ``create-token`` is in :mod:`shockwave_cli.commands.api_commands`; :func:`parse_duration`
reads its ``--expires-in``. A revocation reaches every API process within its token cache's lifetime
(10 s)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from shockwave_cli.client.jobs_render import short_time, user_text
from shockwave_cli.commands.api_commands import (
    DATABASE_ERROR_EXIT,
    USAGE_ERROR_EXIT,
    _database_error,
    _fail,
    _migrate,
    _settings,
    admin_app,
    console,
    errors,
)

if TYPE_CHECKING:
    from sqlmodel import Session

    from store.tables import TokenRow

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
MAX_EXPIRY_S = 10 * 366 * 86_400
DURATION = re.compile(r"^\s*(\d{1,9})\s*([smhd]?)\s*$")


def parse_duration(option: str, text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``12h`` or ``30d`` as a duration of at most ten years; a
    usage error naming ``option`` otherwise."""
    match = DURATION.match(text)
    if match is None:
        _fail(
            f"{option}: expected a duration such as 3600, 15m, 12h or 30d, got {text!r}",
            USAGE_ERROR_EXIT,
        )
    seconds = int(match.group(1)) * UNITS[match.group(2) or "s"]
    if not 0 < seconds <= MAX_EXPIRY_S:
        _fail(f"{option}: must be between 1 s and ten years, got {text!r}", USAGE_ERROR_EXIT)
    return timedelta(seconds=seconds)


@contextmanager
def _database() -> Iterator[Session]:
    """A session on the migrated database that SHOCKWAVE_DATABASE_URL names; a database error
    is one line and exit code 1."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from store.db import make_engine

    settings = _settings()
    _migrate(settings.database_url, settings.database_schema)
    engine = make_engine(settings.database_url, settings.database_schema)
    try:
        with Session(engine) as session:
            yield session
    except SQLAlchemyError as error:
        _fail(_database_error(settings.database_url, error), DATABASE_ERROR_EXIT)
    finally:
        engine.dispose()


def _state(row: TokenRow, now: datetime) -> str:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= now:
        return "expired"
    return "active"


@admin_app.command("list-tokens")
def list_tokens_command(
    role: Annotated[
        str | None, typer.Option(help="Only this role's tokens (job tokens: --role job).")
    ] = None,
) -> None:
    """List tokens: id, role, scope, name, state, and when each was made, expires and was last
    used. Never a secret (only hashes are stored)."""
    from store.principals import Role
    from store.tokens import token_page

    if role is not None and role not in {r.value for r in Role}:
        _fail(f"--role: expected one of {', '.join(r.value for r in Role)}", USAGE_ERROR_EXIT)
    table = Table(title="Tokens", title_justify="left")
    for column in ("id", "role", "scope", "name", "state", "created", "expires", "last used"):
        table.add_column(column, overflow="fold")
    now = datetime.now(UTC)
    with _database() as session:
        page: str | None = None
        while True:
            rows, page = token_page(
                session, page_size=500, page_token=page, role=Role(role) if role else None
            )
            for row in rows:
                scope = row.tenant or row.node or row.job_id or ""
                table.add_row(
                    str(row.id),
                    row.role,
                    user_text(scope),
                    user_text(row.name),
                    _state(row, now),
                    short_time(row.created_at.isoformat()),
                    short_time(row.expires_at.isoformat()) if row.expires_at else "never",
                    short_time(row.last_used_at.isoformat()) if row.last_used_at else "-",
                )
            if page is None:
                break
    console.print(table)


def _change(token_id: int, act: Callable[[Session, int], TokenRow], done: str) -> None:
    from store.errors import DomainError

    with _database() as session:
        try:
            row = act(session, token_id)
        except DomainError as error:
            _fail(str(error), USAGE_ERROR_EXIT)
        session.commit()
        errors.print(f"Token {row.id} ({row.role}{', ' + row.name if row.name else ''}) {done}.")


@admin_app.command("revoke-token")
def revoke_token_command(
    token_id: Annotated[int, typer.Argument(help="The token's id (list-tokens shows it).")],
) -> None:
    """Revoke a token: it stops working within 10 s (the API's token cache); it stays listed."""
    from store.tokens import revoke_token

    _change(token_id, revoke_token, "revoked; API processes refuse it within 10 s")


@admin_app.command("set-token-expiry")
def set_token_expiry_command(
    token_id: Annotated[int, typer.Argument(help="The token's id (list-tokens shows it).")],
    expires_in: Annotated[
        str | None, typer.Option(help="From now: 3600, 15m, 12h or 30d.", show_default=False)
    ] = None,
    never: Annotated[bool, typer.Option("--never", help="Remove the token's expiry.")] = False,
) -> None:
    """Give a token an expiry (``--expires-in``) or remove it (``--never``)."""
    from store.tokens import set_expiry

    if (expires_in is None) == (not never):
        _fail("give exactly one of --expires-in and --never", USAGE_ERROR_EXIT)
    when = None if never else datetime.now(UTC) + parse_duration("--expires-in", expires_in or "")
    shown = "never expires" if when is None else f"expires at {short_time(when.isoformat())}"
    _change(token_id, lambda session, i: set_expiry(session, i, when), f"now {shown}")
