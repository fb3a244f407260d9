"""/v1/jobs/{id}/events: a job's progress and scaling events (post, list, get one)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import JSONResponse

from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, ReportingPrincipal, SessionDep, SettingsDep
from api.errors import openapi_problems
from api.observability import MetricsDep
from api.routes.jobs import IdempotencyKey
from api.schemas import EventCreate, EventPublic, JobIdPath, Page
from shockwave.domain.observed import ClientEvent
from store import cluster_version, events, jobs
from store.tables import INT4_MAX, JobEventRow

router = APIRouter(prefix="/v1/jobs", tags=["events"])


def _public(row: JobEventRow) -> EventPublic:
    return EventPublic.model_validate(row, from_attributes=True)


def _client_event(event: EventCreate) -> ClientEvent:
    """The event as the data layer stores it: its body without ``seq`` and ``kind``."""
    payload = event.model_dump(mode="json", exclude={"seq", "kind"})
    return ClientEvent(seq=event.seq, kind=event.kind, payload=payload)


JobId = JobIdPath
REPORTERS = access(admin=ANY, user=OWN, agent=DENIED, job=OWN)

PROBLEMS = openapi_problems(
    (401, "Missing or unknown token"),
    (403, "Role not allowed (agents do not report job events)"),
    (404, "No such job or event (or not visible to the caller)"),
    (413, "Request body too large"),
    (422, "Invalid input; names the field"),
)
POST_PROBLEMS: dict[int | str, dict[str, Any]] = {
    **PROBLEMS,
    **openapi_problems(
        (
            409,
            "The seq was recorded with a different body, the job has finished, or the "
            "token's attempt is fenced (`fenced: true`: stop the process)",
        ),
    ),
    200: {
        "model": EventPublic,
        "description": "A duplicate (same seq, same body): the stored event",
    },
}


@router.post(
    "/{job_id}/events",
    status_code=201,
    response_model=EventPublic,
    responses=POST_PROBLEMS,
    summary="Report a job's epoch progress or batch-size change",
    openapi_extra=REPORTERS,
)
def post_event(
    job_id: JobId,
    event: Annotated[EventCreate, Body()],
    session: SessionDep,
    principal: ReportingPrincipal,
    metrics: MetricsDep,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Record one event. ``seq`` is the client's per-job sequence number: re-posting the same
    seq and body answers 200 with the stored event, another body under a recorded seq is a 409,
    and events may arrive in any order. The job's observed state (epochs done, batch size,
    attained seconds, measured epoch seconds) is recomputed in the same transaction."""

    def act() -> jobs.Response:
        status, row = events.record_event(session, principal, job_id, _client_event(event))
        session.flush()
        if status == 201 and event.kind == "scaling":
            cluster_version.bump_and_request(session, "batch size changed")
        body = _public(row).model_dump(mode="json")
        return status, body, f"/v1/jobs/{job_id}/events/{row.id}"

    request_body = {"job_id": job_id, "event": event.model_dump(mode="json")}
    status, body, location = jobs.idempotent(session, principal, idempotency_key, request_body, act)
    metrics.job_events.labels(event.kind, "recorded" if status == 201 else "replayed").inc()
    headers = {"Location": location} if location else None
    return JSONResponse(body, status_code=status, headers=headers)


@router.get(
    "/{job_id}/events",
    response_model=Page[EventPublic],
    responses=PROBLEMS,
    summary="List a job's events",
    openapi_extra=REPORTERS,
)
def list_events(
    job_id: JobId,
    session: SessionDep,
    principal: CurrentPrincipal,
    settings: SettingsDep,
    page_size: Annotated[int | None, Query(ge=1, le=500)] = None,
    page_token: Annotated[str | None, Query(max_length=512)] = None,
    kind: events.EventKind | None = None,
) -> Page[EventPublic]:
    """The job's events in the order they were stored: client events and state changes."""
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    rows, token = events.list_events(
        session, principal, job_id, page_size=size, page_token=page_token, kind=kind
    )
    return Page[EventPublic](items=[_public(r) for r in rows], next_page_token=token)


@router.get(
    "/{job_id}/events/{event_id}",
    response_model=EventPublic,
    responses=PROBLEMS,
    summary="Get one event of a job",
    openapi_extra=REPORTERS,
)
def get_event(
    job_id: JobId,
    event_id: Annotated[int, Path(ge=1, le=INT4_MAX)],
    session: SessionDep,
    principal: CurrentPrincipal,
) -> EventPublic:
    return _public(events.visible_event(session, principal, job_id, event_id))
