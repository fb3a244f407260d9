"""One mapper from errors to RFC 9457 problem details (application/problem+json).

Every 4xx and 5xx leaves the API through here: validation errors name the field at fault,
the data layer's domain errors (:mod:`store.errors`) map to their status (:data:`STATUS`), the
core's illegal state transitions to 409, a database that cannot be reached (or a transaction it
could not complete: a lost connection, a deadlock, a pool with no free connection) is a 503
with Retry-After, and anything unexpected becomes a 500 without a stack trace.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from shockwave.domain.lifecycle import IllegalTransition
from shockwave.domain.model import ValidationError
from store.errors import Conflict, DomainError, Forbidden, InvalidInput, NotFound

log = logging.getLogger("shockwave.api")

PROBLEM = "application/problem+json"
RETRY_AFTER_S = 2
"""Retry-After of a 503 for a database outage: a restart of Postgres takes seconds."""


STATUS: dict[type[DomainError], int] = {
    NotFound: 404,
    Forbidden: 403,
    Conflict: 409,
    InvalidInput: 422,
}
"""The HTTP status of each kind of domain error."""


class Problem(Exception):
    """An error with an HTTP status, raised by routes (the data layer raises domain errors)."""

    def __init__(
        self, status: int, title: str, detail: str, *, field: str | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.field = field
        self.extra = extra


def openapi_problems(*responses: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for problem+json answers: ``(status, description)``."""
    return {status: {"description": text, "content": {PROBLEM: {}}} for status, text in responses}


def problem_response(
    request: Request,
    status: int,
    title: str,
    detail: str,
    *,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"https://shockwave.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    if errors:
        body["errors"] = errors
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        errors = [{"field": exc.field, "message": exc.detail}] if exc.field else None
        return problem_response(
            request, exc.status, exc.title, exc.detail, errors=errors, **exc.extra
        )

    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> JSONResponse:
        status = next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 400)
        errors = [{"field": exc.field, "message": exc.detail}] if exc.field else None
        return problem_response(request, status, exc.title, exc.detail, errors=errors, **exc.extra)

    @app.exception_handler(ValidationError)
    async def _domain_validation(request: Request, exc: ValidationError) -> JSONResponse:
        return problem_response(
            request,
            422,
            "Invalid job",
            str(exc),
            errors=[{"field": exc.field, "message": exc.message}],
        )

    @app.exception_handler(IllegalTransition)
    async def _conflict(request: Request, exc: IllegalTransition) -> JSONResponse:
        return problem_response(request, 409, "Illegal transition", str(exc))

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for error in exc.errors():
            location = [str(part) for part in error.get("loc", ()) if part != "body"]
            errors.append({"field": ".".join(location) or "body", "message": error.get("msg", "")})
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid request"
        return problem_response(request, 422, "Invalid request", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = {
            401: "Unauthorized",
            403: "Forbidden",
            404: "Not found",
            405: "Method not allowed",
            413: "Request too large",
            429: "Too many requests",
        }.get(exc.status_code, "HTTP error")
        return problem_response(
            request, exc.status_code, title, str(exc.detail), headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(DataError)
    async def _data(request: Request, exc: DataError) -> JSONResponse:
        return problem_response(
            request, 422, "Invalid request", "a value cannot be stored (out of range or invalid)"
        )

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path,
                    type(exc).__name__)  # fmt: skip
        return problem_response(
            request,
            503,
            "Database unavailable",
            "the database could not be reached or could not complete the transaction; retry "
            "(a submission with the same Idempotency-Key is applied at most once)",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    for transient in (OperationalError, InterfaceError, PoolTimeout):
        app.add_exception_handler(transient, _database)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
        return problem_response(
            request, 500, "Internal error", "the server failed; the request was not applied"
        )
