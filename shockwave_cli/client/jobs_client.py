"""A small HTTP client for the Shockwave REST API (v1), used by the ``shockwave jobs`` commands.

It returns the API's JSON as plain dicts and turns every failure into one of two exceptions:
:class:`ApiError` (the API answered with an error, usually an RFC 9457 problem) and
:class:`ApiUnreachable` (no answer at all: connection refused, timeout, DNS).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

DEFAULT_API_URL = "http://127.0.0.1:8000"
Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    message: str


@dataclass(slots=True)
class ApiError(Exception):
    """An error response. ``title``/``detail`` come from the problem body when there is one,
    else from the status line; ``errors`` are the fields the API named."""

    status: int
    title: str
    detail: str
    errors: list[FieldError] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.title}: {self.detail}" if self.detail else self.title

    def one_line(self) -> str:
        """``title: detail``, with any named field the detail does not already mention."""
        missing = [e.field for e in self.errors if e.field and e.field not in self.detail]
        suffix = f" (field: {', '.join(missing)})" if missing else ""
        return " ".join(f"{self}{suffix}".split())


class ApiUnreachable(Exception):
    """The API at ``url`` did not answer: ``reason`` says how it failed."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the Shockwave API at {url}: {reason}")
        self.url = url
        self.reason = reason


def _error_of(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    reason = response.reason_phrase or "HTTP error"
    if not isinstance(body, dict):
        text = response.text.strip().splitlines()
        return ApiError(
            response.status_code,
            f"HTTP {response.status_code} {reason}",
            text[0][:200] if text else "",
        )
    errors = [
        FieldError(str(e.get("field", "")), str(e.get("message", "")))
        for e in body.get("errors") or []
        if isinstance(e, dict)
    ]
    title = str(body.get("title") or f"HTTP {response.status_code} {reason}")
    detail = body.get("detail")
    return ApiError(response.status_code, title, "" if detail is None else str(detail), errors)


class ShockwaveClient:
    """Calls the API at ``base_url`` with bearer ``token`` (none: open mode). Use as a context
    manager, or call :meth:`close`."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Accept": "application/json, application/problem+json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> ShockwaveClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The decoded JSON body of a 2xx answer; :class:`ApiError` otherwise."""
        response = self._send(method, path, json=json, params=params, headers=headers)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                response.status_code, "Bad response", "the API did not answer JSON"
            ) from None

    def text(self, path: str, params: Mapping[str, Any], accept: str) -> str:
        """The body of a 2xx answer to GET ``path`` as text of the ``accept`` type (CSV)."""
        return self._send("GET", path, params=params, headers={"Accept": accept}).text

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """A 2xx answer to ``method path`` (parameters that are None left out); an API that
        does not answer is :class:`ApiUnreachable`, an error answer its :class:`ApiError`."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, json=json, params=query, headers=headers)
        except httpx.ConnectError as error:
            raise ApiUnreachable(self.base_url, _reason(error, "connection refused")) from None
        except httpx.TimeoutException:
            raise ApiUnreachable(self.base_url, "timed out") from None
        except httpx.TransportError as error:
            raise ApiUnreachable(self.base_url, _reason(error, type(error).__name__)) from None
        if response.is_error:
            raise _error_of(response)
        return response

    def submit_job(self, job: Mapping[str, Any], idempotency_key: str | None = None) -> Json:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body: Json = self.request("POST", "/v1/jobs", json=dict(job), headers=headers)
        return body

    def list_jobs(self, **filters: Any) -> Json:
        """One page: ``{"items": [...], "next_page_token": str | None}``. Filters: state,
        tenant, name, page_size, page_token."""
        page: Json = self.request("GET", "/v1/jobs", params=filters)
        return page

    def iter_jobs(
        self, limit: int | None = None, page_token: str | None = None, **filters: Any
    ) -> Iterator[Json]:
        """Every job matching ``filters`` from ``page_token`` on (default: the first page),
        following ``next_page_token`` (at most ``limit`` jobs)."""
        count = 0
        token = page_token
        while True:
            page = self.list_jobs(**filters, page_token=token)
            for job in page.get("items", []):
                if limit is not None and count >= limit:
                    return
                count += 1
                yield job
            token = page.get("next_page_token")
            if not token:
                return

    def get_job(self, job_id: str) -> Json:
        job: Json = self.request("GET", f"/v1/jobs/{_segment(job_id)}")
        return job

    def cancel_job(self, job_id: str) -> Json:
        job: Json = self.request("POST", f"/v1/jobs/{_segment(job_id)}/cancel")
        return job

    def job_events(self, job_id: str, **params: Any) -> Any:
        """The job's events: a page (``items``, ``next_page_token``) or a plain list."""
        return self.request("GET", f"/v1/jobs/{_segment(job_id)}/events", params=params)

    def resolve_job(self, text: str) -> str:
        """The id of the one job whose id starts with ``text`` (a full id is taken as is);
        :class:`ApiError` 404 when none matches, 409 naming the matches when several do."""
        ident = text.strip().lower()
        if FULL_ID.fullmatch(ident):
            return ident
        if not ident or not PREFIX.fullmatch(ident):
            raise ApiError(422, "Invalid job id", f"{text!r} is not a job id or the start of one")
        page = self.list_jobs(id_prefix=ident, page_size=5)
        matches = [str(job["id"]) for job in page.get("items", [])]
        if not matches:
            raise ApiError(404, "Not found", f"no job id starts with {ident!r}")
        if len(matches) > 1:
            shown = ", ".join(matches[:4]) + (", ..." if page.get("next_page_token") else "")
            raise ApiError(409, "Ambiguous job id", f"{ident!r} starts {shown}: give more of it")
        return matches[0]

    def attempts(self, job_id: str) -> list[Json]:
        found: list[Json] = self.request("GET", f"/v1/jobs/{_segment(job_id)}/attempts")
        return found

    def prediction(self, job_id: str) -> Json:
        found: Json = self.request("GET", f"/v1/jobs/{_segment(job_id)}/prediction")
        return found

    def nodes(self, state: str | None = None) -> list[Json]:
        """Every node (following pages)."""
        nodes: list[Json] = []
        token: str | None = None
        while True:
            page = self.request(
                "GET", "/v1/nodes", params={"state": state, "page_size": 500, "page_token": token}
            )
            nodes.extend(page.get("items", []))
            token = page.get("next_page_token")
            if not token:
                return nodes

    def cluster(self) -> Json:
        found: Json = self.request("GET", "/v1/cluster")
        return found

    def schedule(self) -> Json:
        found: Json = self.request("GET", "/v1/schedule")
        return found

    def queue(self) -> list[Json]:
        found: list[Json] = self.request("GET", "/v1/queue")
        return found

    def stream(
        self, last_event_id: str | None = None, job: str | None = None, follow: bool = True
    ) -> Iterator[Json]:
        """The events of ``GET /v1/events`` (server-sent events) as they arrive, each a dict
        with its ``id``; resumes after ``last_event_id``. Ends when the server ends the stream
        (``follow`` false: once what is stored is sent); :class:`ApiUnreachable` when the
        connection drops."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        params = {"job_id": job, "follow": str(follow).lower()}
        if last_event_id is None and not follow:
            params["since"] = "0"
        query = {k: v for k, v in params.items() if v is not None}
        timeout = httpx.Timeout(10.0, read=60.0)
        try:
            with self._http.stream(
                "GET", "/v1/events", params=query, headers=headers, timeout=timeout
            ) as response:
                if response.is_error:
                    response.read()
                    raise _error_of(response)
                data: list[str] = []
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line and data:
                        yield json.loads("\n".join(data))
                        data = []
        except httpx.TransportError as error:
            raise ApiUnreachable(self.base_url, _reason(error, type(error).__name__)) from None


FULL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PREFIX = re.compile(r"[0-9a-f-]{1,36}")


def _segment(text: str) -> str:
    """``text`` as one path segment (a job id cannot smuggle in ``/`` or ``?``)."""
    from urllib.parse import quote

    return quote(text, safe="")


def _reason(error: Exception, fallback: str) -> str:
    text = str(error).strip()
    if "refused" in text.lower() or not text:
        return fallback
    return text
