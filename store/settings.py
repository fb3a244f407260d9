"""Where the database is: the one setting every process of the service reads (prefix SHOCKWAVE_).

The API's, the solver service's and the round driver's settings extend :class:`DatabaseSettings`,
so ``SHOCKWAVE_DATABASE_URL`` and ``SHOCKWAVE_DATABASE_SCHEMA`` mean the same everywhere.
"""

from __future__ import annotations

import math
import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PRIORITY_CLASSES = {"low": 0.5, "normal": 1.0, "high": 2.0}
MAX_PRIORITY_CLASSES = 16


class DatabaseSettings(BaseSettings):
    """``database_url``: postgresql+psycopg://... or sqlite:///path (the embedded default).
    ``database_schema``: a Postgres schema to use instead of ``public`` (its search_path; tests
    use throwaway schemas). ``priority_classes``: the priority classes a job may name, each
    with its multiplier of the job's weight inside its tenant's share (JSON:
    ``SHOCKWAVE_PRIORITY_CLASSES='{"low": 0.5, "high": 2}'``): the API checks the names and
    the planner weighs by them, so every process reads the same list; a class moves a job only
    among its own tenant's jobs."""

    model_config = SettingsConfigDict(env_prefix="SHOCKWAVE_", extra="ignore")

    database_url: str = "sqlite:///./shockwave.db"
    database_schema: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    priority_classes: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES)
    )

    @field_validator("priority_classes")
    @classmethod
    def _classes(cls, value: dict[str, float]) -> dict[str, float]:
        if len(value) > MAX_PRIORITY_CLASSES:
            raise ValueError(f"at most {MAX_PRIORITY_CLASSES} priority classes")
        for name, weight in value.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}", name):
                raise ValueError(f"priority class {name!r}: 1-32 letters, digits, '. _ -'")
            if not (math.isfinite(weight) and 0 < weight <= 1e6):
                raise ValueError(f"priority class {name!r}: its multiplier must be in (0, 1e6]")
        return value
