"""Settings, read once from the environment at the process's entry point (prefix SHOCKWAVE_)."""

from __future__ import annotations

import math
import re

from pydantic import Field, field_validator

from store.settings import DatabaseSettings


DEFAULT_PRIORITY_CLASSES = {"low": 0.5, "normal": 1.0, "high": 2.0}
MAX_PRIORITY_CLASSES = 16


class Settings(DatabaseSettings):
    """The database (:class:`~store.settings.DatabaseSettings`) and the API's own settings.
    ``open_mode``: accept requests without a token as an admin; only honoured when the API
    listens on localhost. ``max_body_bytes``: larger request bodies get 413.
    ``max_header_bytes`` / ``max_headers``: a request head (request line and headers) over
    that many bytes, or with more header fields, gets 431 from the HTTP server, before the app
    (api.http_limits).
    ``body_timeout_s``: a request body not all in within this time gets 408 (api.app).
    ``default_page_size`` / ``max_page_size``: list pagination.
    ``rate_limit_per_s`` / ``rate_limit_burst``: each token (each client IP for requests without
    a valid token) may send ``burst`` requests at once and ``per_s`` a second after that; more
    get 429 with Retry-After (0 turns the limit off). Per API process, in memory (see
    api.ratelimit). ``rate_limit_admin``: whether admin tokens (and open mode) are limited too;
    off by default, since operators' scripts and benchmarks act as admin. ``worker_threads``:
    how many requests at most run their sync part (the route and its database work) at once
    per process (api.admission); scale out with more processes, not more threads.
    ``poll_recheck_s``: a long poll (``POST /v1/agent/poll`` with ``wait_s``) reads its node's
    leases again at least this often; sooner when the round driver of the same process says the
    leases changed (store.lease_signal), which is the only wake-up ``shockwave up`` needs.
    ``priority_classes``: the priority classes a job may name, each with its weight inside its
    tenant's share (JSON, ``SHOCKWAVE_PRIORITY_CLASSES='{"low": 0.5, "high": 2}'``): a class
    moves a job only among its own tenant's jobs, and ``budget`` itself is for admins only."""

    open_mode: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1_000_000
    max_header_bytes: int = Field(default=32_768, ge=1024, le=1_048_576)
    max_headers: int = Field(default=100, ge=8, le=1000)
    body_timeout_s: float = Field(default=10.0, gt=0)
    worker_threads: int = Field(default=2, ge=1, le=64)
    default_page_size: int = 50
    max_page_size: int = 500
    rate_limit_per_s: float = Field(default=20.0, ge=0)
    rate_limit_burst: int = Field(default=200, ge=1)
    rate_limit_admin: bool = False
    poll_recheck_s: float = Field(default=1.0, gt=0, le=60)
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
                raise ValueError(f"priority class {name!r}: its weight must be in (0, 1e6]")
        return value
