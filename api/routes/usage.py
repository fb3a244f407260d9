"""/v1/usage: GPU-hours, jobs, waits and finish-time fairness per tenant, user or job over a
window (:mod:`store.usage`), as JSON or as CSV (``Accept: text/csv`` or ``format=csv``), the
figures ``sacct``/``sreport`` give. A user sees its own tenant's usage; an admin everyone's."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, SessionDep
from api.errors import PROBLEM, openapi_problems
from api.schemas import Tenant
from api.tenant_schemas import UsagePublic, UsageRowPublic
from store import usage as accounting
from store.errors import InvalidInput
from store.principals import Role, require

router = APIRouter(prefix="/v1/usage", tags=["tenants"])

CSV = "text/csv"
DEFAULT_WINDOW = timedelta(days=1)
PROBLEMS = openapi_problems(
    (401, "Missing, unknown, revoked or expired token"),
    (403, "Admins and users only"),
    (404, "No such tenant (or not the caller's)"),
    (422, "Invalid input; names the field"),
)


def _aware(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidInput(f"{field} needs a time zone (RFC 3339: ...Z or +00:00)", field=field)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"{field} is out of range in UTC", field=field) from None


@router.get(
    "",
    response_model=UsagePublic,
    responses={
        200: {"content": {CSV: {"schema": {"type": "string"}}}, "description": "Usage"},
        **PROBLEMS,
    },
    summary="GPU-hours, jobs, waits and FTF per tenant, user or job (JSON or CSV)",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=DENIED),
)
def get_usage(
    request: Request,
    session: SessionDep,
    principal: CurrentPrincipal,
    since: Annotated[
        datetime | None, Query(description="Start of the window (default: a day before until)")
    ] = None,
    until: Annotated[datetime | None, Query(description="End of the window (default: now)")] = None,
    group_by: Literal["tenant", "user", "job"] = "tenant",
    tenant: Annotated[
        Tenant | None, Query(description="Only this tenant and those below it (admins)")
    ] = None,
    format: Annotated[
        Literal["json", "csv"] | None, Query(description="csv: as Accept: text/csv does")
    ] = None,
) -> Response:
    """The window is ``[since, until)``: a lease's GPU-hours count for the part of its span
    inside it, so the rows sum to the GPU-hours the leases record in it."""
    require(principal, Role.ADMIN, Role.USER)
    now = datetime.now(UTC)
    end = _aware(until, "until") or now
    try:
        start = _aware(since, "since") or end - DEFAULT_WINDOW
    except OverflowError:
        raise InvalidInput("until is too early to count a day back from", field="until") from None
    rows = accounting.usage(
        session,
        principal,
        since=start,
        until=end,
        now=now,
        group_by=accounting.GroupBy(group_by),
        tenant=tenant,
    )
    public = [UsageRowPublic.model_validate(row, from_attributes=True) for row in rows]
    if format == "csv" or (format is None and _wants_csv(request)):
        return Response(_csv(public), media_type=f"{CSV}; charset=utf-8")
    body = UsagePublic(
        since=start,
        until=end,
        group_by=group_by,
        tenant=tenant if principal.role is Role.ADMIN else principal.tenant,
        rows=public,
        total_gpu_hours=sum(row.gpu_hours for row in public),
    )
    return JSONResponse(body.model_dump(mode="json"))


def _wants_csv(request: Request) -> bool:
    """Whether the Accept header prefers CSV to JSON (the first of them it names)."""
    for part in request.headers.get("accept", "").split(","):
        kind = part.split(";")[0].strip().lower()
        if kind == CSV:
            return True
        if kind in ("application/json", PROBLEM, "*/*"):
            return False
    return False


def _csv(rows: list[UsageRowPublic]) -> str:
    """A header line (:data:`store.usage.COLUMNS`) and one line per row; empty cells for
    figures that do not apply (no wait or FTF to average)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(accounting.COLUMNS)
    for row in rows:
        data = row.model_dump()
        writer.writerow(["" if data[c] is None else data[c] for c in accounting.COLUMNS])
    return out.getvalue()
