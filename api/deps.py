"""Typed dependencies injected into routes: the session, the settings, the caller.

They are ``async`` and do no blocking I/O on the event loop, so that a request makes one trip
to the thread pool (its route, which does the database work), not one per dependency: each trip
costs a thread handoff, a large share of a cheap request's CPU (docs/reliability.md, "Load").
The two that may touch the database hand that part to the thread pool themselves: reading a
token not in the cache, and closing a session that still holds a connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from api.admission import close_session
from api.auth import bearer_digest, cached_principal, stored_principal
from api.ratelimit import RateLimiter
from api.settings import Settings
from store.cluster_version import attach
from store.principals import OPEN, Principal, Role


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for the request, asking for plans through the app's port. Opening one does
    no I/O (it connects on first use); closing one that holds a connection rolls back and
    returns it to the pool, in a thread of its own (:func:`api.admission.close_session`: never
    behind the requests that may be waiting on its locks)."""
    session = attach(Session(request.app.state.engine), request.app.state.request_plan)
    try:
        yield session
    finally:
        await close_session(session)


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


async def get_principal(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    """The authenticated caller, within its rate limit: its token's bucket, or its client IP's
    when it has no valid token (so guessing tokens is throttled too). Admins are not limited
    unless ``rate_limit_admin``. Over the limit: 429 with Retry-After, before any work. A
    metrics token is refused (403): it scrapes ``/metrics`` and nothing else."""
    principal = await _authenticated(request, session, settings)
    if principal.role is Role.METRICS:
        raise HTTPException(403, "a metrics token may only scrape /metrics")
    if principal.fenced is not None:
        raise HTTPException(
            401,
            f"this job token's attempt has ended: {principal.fenced}",
            {"WWW-Authenticate": "Bearer"},
        )
    return principal


async def get_reporter(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    """:func:`get_principal`, but a job token whose attempt has ended or is fenced passes: where
    its process reports events, it is told to stop (409 ``fenced``, :mod:`store.events`)
    rather than refused as unknown."""
    principal = await _authenticated(request, session, settings)
    if principal.role is Role.METRICS:
        raise HTTPException(403, "a metrics token may only scrape /metrics")
    return principal


async def get_scraper(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    """Who scrapes ``/metrics``: a metrics or an admin token (open mode: anyone local). The
    metrics carry every tenant's job counts and the node counts users may not see."""
    principal = await _authenticated(request, session, settings)
    if principal.role not in (Role.METRICS, Role.ADMIN):
        raise HTTPException(403, "/metrics needs a metrics or an admin token")
    return principal


async def _authenticated(request: Request, session: Session, settings: Settings) -> Principal:
    limiter: RateLimiter = request.app.state.rate_limiter
    try:
        digest = bearer_digest(request, settings.open_mode)
        if digest is None:
            principal = OPEN
        else:
            cached = cached_principal(session, digest)
            if cached is None:
                cached = await run_in_threadpool(stored_principal, session, digest)
            principal = cached
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
ReportingPrincipal = Annotated[Principal, Depends(get_reporter)]
Scraper = Annotated[Principal, Depends(get_scraper)]
