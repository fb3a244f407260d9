"""/v1/events: job state changes and preemptions as server-sent events.

Each event is one job event row (``kind`` state or preemption) that the caller may see: a user
its tenant's jobs, an admin every job, a job token its own job. Its SSE id is the row's id, so a
client that reconnects with ``Last-Event-ID`` (browsers' EventSource do it by themselves) gets
exactly what it missed, in order. Without one the stream starts at the newest event (``since=0``
replays from the first). The database is read every ``poll_s`` seconds in the thread pool; a
comment line every 15 s keeps proxies from closing an idle stream. ``follow=false`` sends what
is stored and ends (for scripts and generated clients that do not stream).

The stream holds no request slot of the API's admission limit (:class:`api.admission.InFlightLimit`
exempts it): a few followers must not starve the API. What bounds streams instead: each one
reads the database every ``poll_s`` (at least 1 s), each token holds at most
``max_streams_per_token`` open at once and each API process at most ``max_streams``; a stream
over either cap is refused with a 429 problem (Retry-After) before it opens. 200 streams of
one token polling ten times a second made everyone else's requests 15x slower.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from api.admission import close_session
from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, SessionDep
from api.errors import openapi_problems
from api.schemas import StreamEvent
from api.settings import Settings
from store import jobs, views
from store.principals import Principal, Role, require

router = APIRouter(prefix="/v1", tags=["events"])

STREAM_PATH = "/v1/events"
BATCH = 200
KEEPALIVE_S = 15.0
MIN_POLL_S = 1.0
"""The shortest ``poll_s``: each open stream costs a database read this often."""
RETRY_AFTER_S = 5


class OpenStreams:
    """The streams open in this process, per token (the principal's key) and in all: a stream
    is counted from its admission (:meth:`admit`) until its response ends, whichever way
    (:class:`CountedStream`)."""

    def __init__(self, per_token: int, total: int) -> None:
        self.per_token = per_token
        self.total = total
        self.by_key: dict[str, int] = {}
        self.open = 0

    def admit(self, key: str) -> None:
        """Count one more stream of ``key``; 429 (and nothing counted) over either cap."""
        if self.by_key.get(key, 0) >= self.per_token:
            self._refuse(f"this token has {self.per_token} event streams open, the most allowed")
        if self.open >= self.total:
            self._refuse(f"this API process serves {self.total} event streams, the most allowed")
        self.by_key[key] = self.by_key.get(key, 0) + 1
        self.open += 1

    def release(self, key: str) -> None:
        left = self.by_key.get(key, 0) - 1
        if left > 0:
            self.by_key[key] = left
        else:
            self.by_key.pop(key, None)
        self.open = max(0, self.open - 1)

    @staticmethod
    def _refuse(detail: str) -> None:
        raise HTTPException(
            429,
            f"{detail}: close one, or retry after {RETRY_AFTER_S} s",
            {"Retry-After": str(RETRY_AFTER_S)},
        )


def open_streams(request: Request) -> OpenStreams:
    """The app's stream counter (made on first use from its settings)."""
    streams: OpenStreams | None = getattr(request.app.state, "open_streams", None)
    if streams is None:
        settings: Settings = request.app.state.settings
        streams = OpenStreams(settings.max_streams_per_token, settings.max_streams)
        request.app.state.open_streams = streams
    return streams


class CountedStream(StreamingResponse):
    """A streaming response that gives its place among the open streams back when it ends,
    however it ends (finished, the client gone, cancelled)."""

    def __init__(self, *args: object, streams: OpenStreams, key: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._streams = streams
        self._key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._streams.release(self._key)


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "A text/event-stream: `id: <event id>`, `event: state|preemption`, "
            "`data:` the event as JSON (`id`, `job_id`, `name`, `tenant`, `kind`, `from`, "
            "`to`, `state`, `reason`, `created_at`) per event.",
            "content": {"text/event-stream": {}},
        },
        **openapi_problems(
            (401, "Missing or unknown token"),
            (403, "Role not allowed"),
            (404, "No such job (or not visible to the caller)"),
            (422, "Invalid input; names the field"),
            (429, "Too many open streams for this token or this API process; Retry-After"),
        ),
    },
    summary="Stream job state changes and preemptions (server-sent events)",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=OWN),
)
async def stream_events(
    request: Request,
    session: SessionDep,
    principal: CurrentPrincipal,
    job_id: Annotated[
        str | None,
        Query(max_length=64, pattern=r"^[^\x00]+$", description="Only this job's events"),
    ] = None,
    since: Annotated[
        int | None,
        Query(ge=0, le=2**31 - 1, description="Start after this event id (0: from the first)"),
    ] = None,
    follow: Annotated[
        bool, Query(description="Keep the stream open for new events (false: end at once)")
    ] = True,
    poll_s: Annotated[
        float, Query(ge=MIN_POLL_S, le=10.0, description="Seconds between reads (at least 1)")
    ] = 1.0,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", max_length=16, description="Resume after this event id"),
    ] = None,
) -> StreamingResponse:
    """Server-sent events of job state changes and preemptions (module docstring)."""
    await close_session(session)  # the token lookup's connection goes back to the pool now
    engine: Engine = request.app.state.engine
    require(principal, Role.ADMIN, Role.USER, Role.JOB)
    streams = open_streams(request)
    streams.admit(principal.key)
    try:
        after = await run_in_threadpool(_start, engine, principal, job_id, since, last_event_id)
        return CountedStream(
            _events(request, engine, principal, job_id, after, follow, poll_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            streams=streams,
            key=principal.key,
        )
    except BaseException:
        streams.release(principal.key)
        raise


def _start(
    engine: Engine, principal: Principal, job: str | None, since: int | None, last: str | None
) -> int:
    """The event id to stream after: Last-Event-ID, else ``since``, else the newest; checks
    that ``job`` is visible (404) before the stream opens."""
    with Session(engine) as session:
        if job is not None:
            jobs.visible_job(session, principal, job)
        if last is not None and last.strip().isdigit():
            return int(last.strip())
        if since is not None:
            return since
        return views.last_event_id(session)


def _read(
    engine: Engine, principal: Principal, after: int, job: str | None
) -> list[dict[str, object]]:
    with Session(engine) as session:
        return views.stream_since(session, principal, after, job, BATCH)


async def _events(
    request: Request,
    engine: Engine,
    principal: Principal,
    job: str | None,
    after: int,
    follow: bool,
    poll_s: float,
) -> AsyncIterator[str]:
    yield f"retry: {int(poll_s * 1000)}\n\n"
    quiet_since = time.monotonic()
    while True:
        batch = await run_in_threadpool(_read, engine, principal, after, job)
        for event in batch:
            body = StreamEvent.model_validate(event).model_dump(mode="json", by_alias=True)
            after = int(body["id"])
            yield f"id: {after}\nevent: {body['kind']}\ndata: {json.dumps(body)}\n\n"
        if batch:
            quiet_since = time.monotonic()
            if len(batch) == BATCH:
                continue
        if not follow:
            return
        if time.monotonic() - quiet_since >= KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        if await request.is_disconnected():
            return
        await asyncio.sleep(poll_s)
