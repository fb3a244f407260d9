"""Where the database is: the one setting every process of the service reads (prefix SHOCKWAVE_).

The API's, the solver service's and the round driver's settings extend :class:`DatabaseSettings`,
so ``SHOCKWAVE_DATABASE_URL`` and ``SHOCKWAVE_DATABASE_SCHEMA`` mean the same everywhere.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DatabaseSettings(BaseSettings):
    """``database_url``: postgresql+psycopg://... or sqlite:///path (the embedded default).
    ``database_schema``: a Postgres schema to use instead of ``public`` (its search_path; tests
    use throwaway schemas)."""

    model_config = SettingsConfigDict(env_prefix="SHOCKWAVE_", extra="ignore")

    database_url: str = "sqlite:///./shockwave.db"
    database_schema: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
