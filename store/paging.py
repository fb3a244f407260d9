"""Keyset pagination, one way for every list: opaque page tokens and the page cut.

A page token is ``kind:key`` in unpadded URL-safe base64: ``kind`` names the list it belongs to
(``job``, ``event``, ``node``) and ``key`` the sort key of the last item a page held; the next
page starts after it. A token of another list, one that does not decode, or one whose key
holds a NUL (which Postgres text refuses) is :class:`~store.errors.InvalidInput` naming
``page_token``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from typing import TypeVar

from store.errors import InvalidInput

T = TypeVar("T")

MALFORMED = "malformed page_token"


def page_token(kind: str, key: str) -> str:
    """The token of a page that ends at ``key`` in the list ``kind``."""
    return base64.urlsafe_b64encode(f"{kind}:{key}".encode()).decode().rstrip("=")


def page_key(kind: str, token: str) -> str:
    """The key ``token`` carries for the list ``kind`` (see the module docstring)."""
    try:
        raw = base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode()).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError) as error:
        raise InvalidInput(MALFORMED, field="page_token") from error
    prefix, _, key = raw.partition(":")
    if prefix != kind or not key or "\x00" in key:
        raise InvalidInput(MALFORMED, field="page_token")
    return key


def cut(
    rows: Sequence[T], page_size: int, key: Callable[[T], str], kind: str
) -> tuple[list[T], str | None]:
    """The first ``page_size`` of ``rows`` (read with a limit of ``page_size + 1``) and the
    next page's token, None when nothing follows."""
    if len(rows) <= page_size:
        return list(rows), None
    page = list(rows[:page_size])
    return page, page_token(kind, key(page[-1]))
