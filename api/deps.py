"""Typed dependencies injected into routes: the session, the settings, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlmodel import Session

from api.auth import Principal, authenticate
from api.ratelimit import RateLimiter
from api.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


def get_principal(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    """The authenticated caller, within its rate limit: its token's bucket, or its client IP's
    when it has no valid token (so guessing tokens is throttled too). Admins are not limited
    unless ``rate_limit_admin``. Over the limit: 429 with Retry-After, before any work."""
    limiter: RateLimiter = request.app.state.rate_limiter
    try:
        principal = authenticate(request, session, settings.open_mode)
    except HTTPException:
        _throttle(limiter, f"ip:{request.client.host if request.client else ''}", "address")
        raise
    if not principal.is_admin or settings.rate_limit_admin:
        _throttle(limiter, principal.key, "token")
    return principal


def _throttle(limiter: RateLimiter, key: str, what: str) -> None:
    wait_s = limiter.acquire(key)
    if wait_s:
        raise HTTPException(
            429,
            f"too many requests from this {what}: retry after {wait_s} s",
            {"Retry-After": str(wait_s)},
        )


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
