"""What integration tests send to the API and how they read its answers."""

from __future__ import annotations

from typing import Any, Protocol

PROBLEM_TYPE = "application/problem+json"
PROBLEM_MEMBERS = ("type", "title", "status", "detail", "instance")


class HttpResponse(Protocol):
    """What both httpx and the TestClient return: enough to read a problem."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Any: ...

    def json(self) -> Any: ...


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def job_body(**overrides: Any) -> dict[str, Any]:
    """A valid submission (one GPU, static batch size), with ``overrides`` applied."""
    body: dict[str, Any] = {
        "name": "resnet18",
        "gpus": 1,
        "epochs": 3,
        "samples_per_epoch": 1000,
        "initial_batch_size": 32,
    }
    body.update(overrides)
    return body


def assert_problem(
    response: HttpResponse, status: int, *, field: str | None = None, path: str | None = None
) -> dict[str, Any]:
    """Check that ``response`` is an RFC 9457 problem with ``status``; return its body.

    ``field``: the problem must name it, both in ``errors[].field`` (as is, or after its location,
    as in ``query.page_size``) and in ``detail``.
    ``path``: the request path the ``instance`` member must equal.
    """
    assert response.status_code == status, (response.status_code, response.json())
    content_type = response.headers.get("content-type", "")
    assert content_type.startswith(PROBLEM_TYPE), content_type
    body: dict[str, Any] = response.json()
    missing = [member for member in PROBLEM_MEMBERS if member not in body]
    assert not missing, f"problem lacks {missing}: {body}"
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["type"], str) and body["type"]
    if path is not None:
        assert body["instance"] == path
    if field is not None:
        named = [str(error.get("field")) for error in body.get("errors", [])]
        assert any(name == field or name.endswith(f".{field}") for name in named), (
            f"{field!r} not among the fields named {named}: {body}"
        )
        assert field in body["detail"], body["detail"]
    return body
