"""Settings, read once from the environment at the process's entry point (prefix SHOCKWAVE_)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """``database_url``: postgresql+psycopg://... or sqlite:///path (the embedded default).
    ``open_mode``: accept requests without a token as an admin; only honoured when the API
    listens on localhost. ``max_body_bytes``: larger request bodies get 413.
    ``default_page_size`` / ``max_page_size``: list pagination. ``database_schema``: a Postgres
    schema to use instead of ``public`` (its search_path; tests use throwaway schemas)."""

    model_config = SettingsConfigDict(env_prefix="SHOCKWAVE_", extra="ignore")

    database_url: str = "sqlite:///./shockwave.db"
    database_schema: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    open_mode: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1_000_000
    default_page_size: int = 50
    max_page_size: int = 500
