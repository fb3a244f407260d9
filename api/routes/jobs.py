"""/v1/jobs: submit, list, get, cancel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from sqlmodel import Session

from api.auth import ANY, DENIED, HIDDEN, OWN, SEE_ONLY, access
from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.schemas import AttemptPublic, JobCreate, JobIdPath, JobPublic, JobSummary, Page
from shockwave.domain.lifecycle import JobState
from store import cluster_version, jobs, views
from store.snapshot import (
    UNREAD,
    TenantHold,
    Unread,
    ready_gpus,
    tenant_usage,
    waiting_reason,
)
from store.tables import JobRow

J = TypeVar("J", bound=JobSummary)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _public(row: JobRow, session: Session) -> JobPublic:
    return _with_reason(JobPublic, row, session, None, UNREAD)


SUMMARY_COLUMNS = tuple(
    getattr(JobRow, name) for name in JobSummary.model_fields if name != "waiting_reason"
)
"""The columns a list reads of each job: its summary's (and what its ``waiting_reason``
needs: state, GPUs, tenant, id), none of the heavy JSON fields."""


def _summary(
    row: Any, session: Session, ready: Mapping[str, int] | None, usage: TenantHold | None
) -> JobSummary:
    return _with_reason(JobSummary, row, session, ready, usage)


def _with_reason(
    model: type[J],
    row: Any,
    session: Session,
    ready: Mapping[str, int] | None,
    usage: TenantHold | Unread | None,
) -> J:
    """``row`` as ``model`` (a summary or the full job) with its ``waiting_reason``."""
    job = model.model_validate(row, from_attributes=True)
    job.waiting_reason = waiting_reason(session, row, ready, usage)
    return job


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retry-safe key: the same key and body replay the first response.",
    ),
]

PROBLEM_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"description": text, "content": {"application/problem+json": {}}}
    for code, text in (
        (401, "Missing or unknown token"),
        (403, "Role not allowed"),
        (404, "No such job (or not visible to the caller)"),
        (409, "Illegal state transition; or the tenant is at its max_jobs"),
        (413, "Request body too large"),
        (422, "Invalid input; names the field"),
    )
}


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    responses=PROBLEM_RESPONSES,
    summary="Submit a job",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=DENIED),
)
def submit_job(
    data: JobCreate,
    request: Request,
    session: SessionDep,
    principal: CurrentPrincipal,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """A user's job belongs to the user's tenant; ``budget`` is refused (422) from anyone but
    an admin: a user names a ``priority`` class, which moves the job only among its own
    tenant's jobs. A tenant with ``max_jobs`` jobs queued and running refuses more (409,
    ``limit: "max_jobs"``)."""

    def act() -> jobs.Response:
        row = jobs.create_job(session, principal, data, settings.priority_classes)
        session.flush()
        cluster_version.bump_and_request(session, "job submitted")
        body = _public(row, session).model_dump(mode="json")
        return 201, body, f"/v1/jobs/{row.id}"

    status, body, location = jobs.idempotent(
        session, principal, idempotency_key, data.model_dump(mode="json"), act
    )
    headers = {"Location": location} if location else None
    return JSONResponse(body, status_code=status, headers=headers)


@router.get(
    "",
    response_model=Page[JobSummary],
    responses=PROBLEM_RESPONSES,
    summary="List jobs (summaries: the heavy fields are on GET /v1/jobs/{id})",
    openapi_extra=access(admin=ANY, user=OWN, agent=OWN, job=OWN),
)
def list_jobs(
    session: SessionDep,
    principal: CurrentPrincipal,
    settings: SettingsDep,
    page_size: Annotated[int | None, Query(ge=1, le=500)] = None,
    page_token: Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_=-]*$")] = None,
    state: JobState | None = None,
    tenant: Annotated[str | None, Query(max_length=64, pattern=r"^[^\x00]*$")] = None,
    name: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
    id_prefix: Annotated[
        str | None,
        Query(
            max_length=36,
            pattern=r"^[0-9a-fA-F-]*$",
            description="Only jobs whose id starts with this (the CLI's short ids)",
        ),
    ] = None,
) -> Page[JobSummary]:
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    rows, token = jobs.list_jobs(
        session,
        principal,
        columns=SUMMARY_COLUMNS,
        page_size=size,
        page_token=page_token,
        state=state,
        tenant=tenant,
        name=name,
        id_prefix=id_prefix.lower() if id_prefix else None,
    )
    ready = ready_gpus(session)
    usage = tenant_usage(session)
    items = [_summary(r, session, ready, usage) for r in rows]
    return Page[JobSummary](items=items, next_page_token=token)


@router.get(
    "/{job_id}",
    response_model=JobPublic,
    responses=PROBLEM_RESPONSES,
    summary="Get a job",
    openapi_extra=access(admin=ANY, user=OWN, agent=HIDDEN, job=OWN),
)
def get_job(job_id: JobIdPath, session: SessionDep, principal: CurrentPrincipal) -> JobPublic:
    return _public(jobs.visible_job(session, principal, job_id), session)


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses=PROBLEM_RESPONSES,
    summary="Cancel a job",
    openapi_extra=access(admin=ANY, user=OWN, agent=HIDDEN, job=SEE_ONLY),
)
def cancel_job(job_id: JobIdPath, session: SessionDep, principal: CurrentPrincipal) -> JobPublic:
    row = jobs.cancel_job(session, principal, job_id)
    cluster_version.bump_and_request(session, "job cancelled")
    session.commit()
    session.refresh(row)
    return _public(row, session)


@router.get(
    "/{job_id}/attempts",
    response_model=list[AttemptPublic],
    responses=PROBLEM_RESPONSES,
    summary="List a job's attempts, with the tail of each one's output",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=OWN),
)
def list_job_attempts(
    job_id: JobIdPath, session: SessionDep, principal: CurrentPrincipal
) -> list[AttemptPublic]:
    """Every attempt (lease) of the job, oldest first: node, round, GPUs, state, exit code,
    why the round driver took it back, and the last few KiB of its output as its agent last
    shipped them (``shockwave jobs logs`` prints the newest)."""
    return [
        AttemptPublic(
            attempt_id=row.id,
            node_id=row.node_id,
            round_index=row.round_index,
            gpus=[int(g) for g in row.gpus],
            state=row.state,
            exit_code=row.exit_code,
            reason=row.reason,
            log_tail=row.log_tail,
            issued_at=row.issued_at,
            updated_at=row.updated_at,
        )
        for row in views.attempts(session, principal, job_id)
    ]
