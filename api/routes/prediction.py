"""/v1/jobs/{id}/prediction: "why am I waiting"."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends

from api import prediction
from api.auth import ANY, DENIED, OWN, access
from api.deps import CurrentPrincipal, SessionDep
from api.errors import openapi_problems
from api.routes.events import JobId
from api.schemas import PredictionPublic
from store import jobs
from store.principals import Role, require
from store.tables import utcnow

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def get_now() -> datetime:
    """The shell's clock (override in tests through ``app.dependency_overrides``)."""
    return utcnow()


@router.get(
    "/{job_id}/prediction",
    response_model=PredictionPublic,
    responses=openapi_problems(
        (401, "Missing or unknown token"),
        (403, "Role not allowed"),
        (404, "No such job (or not visible to the caller)"),
        (422, "Invalid input; names the field"),
    ),
    summary="Why am I waiting: predicted regimes, remaining time, FTF estimate, planned rounds",
    openapi_extra=access(admin=ANY, user=OWN, agent=DENIED, job=OWN),
)
def get_prediction(
    job_id: JobId,
    session: SessionDep,
    principal: CurrentPrincipal,
    now: Annotated[datetime, Depends(get_now)],
) -> PredictionPublic:
    """The job's predicted batch-size regimes (past ones as observed), its predicted remaining
    and total exclusive run time in seconds, and its finish-time-fairness estimate with the
    contention factor used (today's active jobs per READY GPU, at least 1). ``planned_rounds``
    stays empty, with a ``reason`` saying so, until a solver service has planned the job."""
    require(principal, Role.ADMIN, Role.USER, Role.JOB)
    row = jobs.visible_job(session, principal, job_id)
    return prediction.explain(session, row, now)
