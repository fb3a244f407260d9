"""Request-head limits in the HTTP server itself, before the app: header bytes and header count.

Why here and not in a middleware: the HTTP parser (httptools, under uvicorn) holds a request's
whole head in memory before the app sees a byte of it, and nothing else bounds it; one 50 MB
header on ``/healthz`` was answered 200, and eight such connections took the API from 191 to
591 MB and ``/healthz`` to 9.5 s. Rate limits and authentication run later still.

:class:`LimitedHttpToolsProtocol` is uvicorn's httptools protocol with two limits: the bytes of
a request's head (request line and headers) and the number of headers. A request over either
is answered ``431 Request Header Fields Too Large`` (a problem document) and its connection is
closed; the head is counted as it arrives, so no more than the limit (and one read) is held.
The limits are class attributes, set once per process from the settings (:func:`configure`:
``max_header_bytes``, ``max_headers``), so that uvicorn's worker processes, which import the
class by name, apply them too.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.settings import Settings

HEAD_END = b"\r\n\r\n"


class _HeadTooLarge(Exception):
    """The request's head passed a limit (raised in a parser callback to stop parsing)."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with limits on the request head (module docstring)."""

    max_header_bytes = Settings.model_fields["max_header_bytes"].default
    max_headers = Settings.model_fields["max_headers"].default

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
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
    return LimitedHttpToolsProtocol
