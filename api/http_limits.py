"""Request-head limits in the HTTP server itself, before the app: header bytes and header count.

Why here and not in a middleware: the HTTP parser (httptools, under uvicorn) holds a request's
whole head in memory before the app sees a byte of it, and nothing else bounds it; one 50 MB
header on ``/healthz`` was answered 200, and eight such connections took the API from 191 to
591 MB and ``/healthz`` to 9.5 s. Rate limits and authentication run later still.

:class:`LimitedHttpToolsProtocol` is uvicorn's httptools protocol with two limits: the bytes of
a request's head (request line and headers) and the number of headers. A request over either
is answered ``431 Request Header Fields Too Large`` (a problem document) and its connection is
closed; the head is counted as it arrives, so no more than the limit (and one read) is held.
Two limits on what a connection may hold, for clients that send and do not read:

- a send timeout: a response whose bytes the client does not take (the socket's send buffer
  stays full, so the app's ``send`` waits) for ``send_timeout_s`` is abandoned and the
  connection closed; the app's ``send`` then returns (the client is gone), the request ends
  and gives back its admission slot (:mod:`api.admission`). Without it, four connections that
  requested the 1.5 MB Swagger bundle and never read held every slot of a process, health
  checks included, for as long as they stayed open.
- pipelining: at most ``max_pipelined`` requests may wait behind the one being answered; of a
  connection that sends more ahead of its answers, the requests already waiting are answered,
  the rest is dropped unread, and the connection closed after the last answer (each waiting
  request is parsed and held in memory).

The limits are class attributes, set once per process from the settings (:func:`configure`:
``max_header_bytes``, ``max_headers``, ``send_timeout_s``, ``max_pipelined``), so that
uvicorn's worker processes, which import the class by name, apply them too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.settings import Settings

HEAD_END = b"\r\n\r\n"


class _HeadTooLarge(Exception):
    """The request's head passed a limit (raised in a parser callback to stop parsing)."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with limits on the request head (module docstring)."""

    max_header_bytes = Settings.model_fields["max_header_bytes"].default
    max_headers = Settings.model_fields["max_headers"].default
    send_timeout_s = Settings.model_fields["send_timeout_s"].default
    max_pipelined = Settings.model_fields["max_pipelined"].default

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._stalled: asyncio.TimerHandle | None = None
        self._running: Any = None
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._tail = b""
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            seen = self._tail + data
            end = seen.find(HEAD_END)
            self._head_bytes += len(data) if end < 0 else max(0, end - len(self._tail))
            self._tail = seen[-(len(HEAD_END) - 1) :]
            if self._head_bytes > self.max_header_bytes:
                self._refuse(f"request headers are limited to {self.max_header_bytes} bytes")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._tail = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refuse(f"requests are limited to {self.max_headers} header fields")
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        if len(self.pipeline) > self.max_pipelined:
            self.pipeline.popleft()  # the request just parsed: dropped, never answered
            self.pipeline[0][0].keep_alive = False  # the last one kept closes the connection
            self._refused = True  # nothing more is read from this connection
            raise _HeadTooLarge

    def pause_writing(self) -> None:
        """The client stopped taking the response's bytes: give it ``send_timeout_s``."""
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.send_timeout_s, self._abandon)

    def resume_writing(self) -> None:
        self._cancel_stall()
        super().resume_writing()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        """As uvicorn's, but the request being answered learns that its client is gone even
        when requests were pipelined behind it (uvicorn tells only the newest one parsed, and
        the one being answered then writes to a closed transport)."""
        self._cancel_stall()
        running = self._running
        if running is not None and not running.response_complete:
            running.disconnected = True
        super().connection_lost(exc)

    def _abandon(self) -> None:
        """The client took nothing for ``send_timeout_s``: drop the connection (the app's
        pending ``send`` returns, the request ends and frees its slot)."""
        self._stalled = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def _cancel_stall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # the parser's error after our refusal: already answered
            super().send_400_response(msg)

    def _refuse(self, detail: str) -> None:
        """Answer 431 with a problem document and close the connection."""
        self._refused = True
        body = json.dumps(
            {
                "type": "about:blank",
                "title": "Request header fields too large",
                "status": 431,
                "detail": detail,
                "instance": (getattr(self, "url", b"") or b"")
                .split(b"?")[0][:256]
                .decode("latin-1"),
            }
        ).encode()
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\n"
            "content-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        ).encode()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()

    def _path(self) -> str:
        """The request's path as far as it arrived (bounded), for the problem's instance."""
        url: bytes = getattr(self, "url", b"") or b""
        return url.split(b"?")[0][:256].decode("latin-1")


def configure(settings: Settings) -> type[LimitedHttpToolsProtocol]:
    """Set this process's head limits from ``settings``; the protocol class to give uvicorn
    (``http=``)."""
    LimitedHttpToolsProtocol.max_header_bytes = settings.max_header_bytes
    LimitedHttpToolsProtocol.max_headers = settings.max_headers
    LimitedHttpToolsProtocol.send_timeout_s = settings.send_timeout_s
    LimitedHttpToolsProtocol.max_pipelined = settings.max_pipelined
    return LimitedHttpToolsProtocol
