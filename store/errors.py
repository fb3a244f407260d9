"""Domain errors: what the data layer refuses, and why, without any HTTP in it.

Each error carries a short ``title``, a ``detail`` sentence for a person, the input ``field`` at
fault when there is one, and ``extra`` members for a client to act on (``stop: true`` tells an
agent or a training program to stop an attempt). The API maps each kind to its status in one
place (:mod:`api.errors`): :class:`NotFound` 404, :class:`Forbidden` 403, :class:`Conflict`
409, :class:`InvalidInput` 422. A caller that may not see something gets :class:`NotFound`,
never :class:`Forbidden`, so existence does not leak across tenants or nodes.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DomainError(Exception):
    """A refused operation (see the module docstring); subclasses name the kind."""

    default_title: ClassVar[str] = "Refused"

    def __init__(
        self, detail: str, *, title: str | None = None, field: str | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.title = title or self.default_title
        self.field = field
        self.extra = extra


class NotFound(DomainError):
    """No such thing, or not one the caller may see."""

    default_title = "Not found"


class Forbidden(DomainError):
    """The caller may see the thing but not do this (or its role may not do it at all)."""

    default_title = "Forbidden"


class Conflict(DomainError):
    """The thing is not in a state that allows this (finished, fenced, still in progress)."""

    default_title = "Conflict"


class InvalidInput(DomainError):
    """The input is well-formed but not acceptable; ``field`` names the part at fault."""

    default_title = "Invalid request"
