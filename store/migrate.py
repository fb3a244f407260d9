"""Apply the Alembic migrations programmatically (tests, ``shockwave up``, admin commands)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

ROOT = Path(__file__).resolve().parents[1]


def _config(url: str, schema: str | None) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.attributes["url"] = url
    config.attributes["schema"] = schema
    config.attributes["configure_logger"] = False
    return config


def upgrade(url: str, schema: str | None = None, revision: str = "head") -> None:
    """Migrate the database at ``url`` (and Postgres ``schema``, if given) to ``revision``
    (default: the latest schema)."""
    command.upgrade(_config(url, schema), revision)


def downgrade(url: str, schema: str | None = None, revision: str = "base") -> None:
    """Undo migrations down to ``revision`` (default: remove every table they created)."""
    command.downgrade(_config(url, schema), revision)
