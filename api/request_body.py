"""A request's whole body, read once from the ASGI ``receive`` and handed on as it came.

The body limit (:class:`api.app.BodyLimitMiddleware`) reads every body whole before admission
does, and admission (:class:`api.admission.InFlightLimit`) reads an agent's poll to tell which
line it waits in; each hands the app a ``receive`` that replays the body.
"""

from __future__ import annotations

from starlette.types import Message, Receive


class BodyTooLarge(Exception):
    """A request body passed the limit while it streamed in."""


async def read_body(receive: Receive, max_bytes: int | None = None) -> bytes | None:
    """The whole body; None if the client disconnected first. Raises :class:`BodyTooLarge` as
    soon as more than ``max_bytes`` came (None: no limit)."""
    parts: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        part = message.get("body", b"")
        received += len(part)
        if max_bytes is not None and received > max_bytes:
            raise BodyTooLarge
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole, then whatever ``receive`` says next (after the
    body only ``http.disconnect`` can come)."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
