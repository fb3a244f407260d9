"""Security headers on every response: a strict Content-Security-Policy, ``nosniff``, no
framing, no referrer.

Every page the API serves loads only from this origin (the dashboard and the offline Swagger UI
and ReDoc assets are shipped in the package), so the policy allows ``'self'`` and nothing else:
no inline script, no inline style, no plugin, no ``<base>``, and no framing by anyone
(``frame-ancestors 'none'``, and ``X-Frame-Options: DENY`` for older browsers). A stored value
that ever slipped past the dashboard's escaping could then run no script of its own.

The two documentation pages (``/docs``, ``/redoc``) and Swagger UI's OAuth2 redirect are made by
FastAPI with inline scripts and styles. Their policy allows exactly those inline scripts, by
their SHA-256 hash, computed from the page as served (so a page that changes stays allowed and
nothing else is); their inline and runtime styles are allowed (ReDoc and Swagger UI style their
elements as they render; a style cannot run code), as are blob: workers (ReDoc's search).

A response that sets its own ``Content-Security-Policy`` keeps it.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

STRICT_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; manifest-src 'self'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
"""The policy of every response but the documentation pages'."""
DOCS_PAGES = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})
"""Pages made with inline scripts (FastAPI's Swagger UI and ReDoc pages)."""
FIXED_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.DOTALL | re.I)
MAX_DOCS_PAGE_BYTES = 1_000_000
"""A documentation page larger than this is sent with the strict policy (never expected)."""


def docs_policy(html: bytes) -> str:
    """The policy of a documentation page: the strict one, but for its inline scripts (by
    hash), inline styles and blob: workers."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(html)
    )
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
        "worker-src 'self' blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )


class SecurityHeaders:
    """Pure ASGI middleware adding the headers of the module docstring to every HTTP
    response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") in DOCS_PAGES:
            await self._docs_page(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = _secured(list(message.get("headers", [])), STRICT_POLICY)
            await send(message)

        await self.app(scope, receive, with_headers)

    async def _docs_page(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Hold the (small) page until it is whole, then send it with its own policy."""
        start: Message | None = None
        parts: list[bytes] = []
        size = 0
        passing = False

        async def holding(message: Message) -> None:
            nonlocal start, size, passing
            if passing:
                await send(message)
                return
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            more = message.get("more_body", False)
            if size > MAX_DOCS_PAGE_BYTES:  # not a page we know: the strict policy, streamed
                passing = True
                start["headers"] = _secured(list(start.get("headers", [])), STRICT_POLICY)
                await send(start)
                await send(
                    {"type": "http.response.body", "body": b"".join(parts), "more_body": more}
                )
                return
            if more:
                return
            body = b"".join(parts)
            start["headers"] = _secured(list(start.get("headers", [])), docs_policy(body))
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, holding)


def _secured(headers: list[tuple[bytes, bytes]], policy: str) -> list[tuple[bytes, bytes]]:
    """``headers`` with the fixed security headers and ``policy`` added where not set."""
    present = {name.lower() for name, _ in headers}
    added = [(name, value) for name, value in FIXED_HEADERS if name not in present]
    if b"content-security-policy" not in present:
        added.append((b"content-security-policy", policy.encode()))
    return headers + added
