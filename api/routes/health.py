"""/healthz (the process is up) and /readyz (it can reach its database)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api.auth import PUBLIC
from api.deps import SessionDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness", openapi_extra=PUBLIC)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz", summary="Readiness: the database answers", response_model=None, openapi_extra=PUBLIC
)
def readyz(session: SessionDep) -> dict[str, str] | JSONResponse:
    try:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    except Exception as error:
        return JSONResponse(
            {"status": "unavailable", "detail": type(error).__name__},
            status_code=503,
            media_type="application/problem+json",
        )
    return {"status": "ok"}
