"""Settings, read once from the environment at the process's entry point (prefix SHOCKWAVE_)."""

from __future__ import annotations

from pydantic import Field

from store.settings import DatabaseSettings


class Settings(DatabaseSettings):
    """The database (:class:`~store.settings.DatabaseSettings`) and the API's own settings.
    ``open_mode``: accept requests without a token as an admin; only honoured when the API
    listens on localhost. ``host`` / ``port``: the address and port the API listens on.
    ``max_body_bytes``: larger request bodies get 413.
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
    ``max_streams_per_token`` / ``max_streams``: event streams (``GET /v1/events``) open at once
    per token and per process; more get 429 (api.routes.stream).
    ``send_timeout_s``: a response the client does not read for this long (the socket's send
    buffer stays full) is abandoned and its connection closed, so that a client that does not
    read frees its request slot (api.http_limits). ``max_pipelined``: requests a connection
    may send ahead of their answers; a connection with more waiting is closed."""

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
    max_streams_per_token: int = Field(default=8, ge=1, le=1000)
    max_streams: int = Field(default=128, ge=1, le=10_000)
    send_timeout_s: float = Field(default=10.0, gt=0, le=600)
    max_pipelined: int = Field(default=4, ge=1, le=100)
    queue_timeout_s: float = Field(default=5.0, gt=0, le=300)
    """A request that waited longer than this since it arrived for its turn (api.admission)
    gets 503 with Retry-After instead of being served: its client has most likely given up
    (the agent's request timeout is 3 s), and serving it would only age the ones behind it."""
