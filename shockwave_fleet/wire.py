"""A small HTTP/1.1 keep-alive client on asyncio streams, for the benches' load generators.

Why not httpx: the load bench (bench/load.py) runs its generator on the same 2-core machine as
the servers it measures, and httpx's asyncio client spent about 5 ms of CPU per request there
(its connection pool and per-request machinery): the generator saturated a core at 175 requests
a second and its own lag, not the server, set the latencies it reported. This client does only
what the benches need, at a fraction of that cost: keep-alive connections to one server, JSON
bodies, query parameters, ``Content-Length`` and chunked responses, a timeout per request.

Shape: ``Client(base_url, timeout_s)``; ``await client.request(method, path, headers=...,
json=..., params=...)`` returns a :class:`Response` (any status) or raises a
:class:`TransportError` subclass named like httpx's (``ConnectError``, ``ReadError``,
``ReadTimeout``), so figures keep their error names. A connection that failed or that the
server closes is dropped; the others are reused, one request at a time each, unless they sat
idle for ``IDLE_REUSE_S``: the server closes a connection idle past its keep-alive timeout
(uvicorn's is 5 s), and a request sent as it closes is lost (a ``ReadError``; only a request
that changes nothing is sent again), so the client stops reusing one well before.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

IDLE_REUSE_S = 3.0
"""A connection idle longer than this is closed rather than reused (uvicorn's keep-alive
timeout is 5 s; a loaded server may close late or early by a scheduling delay)."""


class TransportError(Exception):
    """The request got no complete answer."""


class ConnectError(TransportError):
    """The connection could not be opened."""


class ReadError(TransportError):
    """The connection failed or closed before a whole answer came."""


class ReadTimeout(TransportError):
    """No whole answer within the request's timeout."""


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: its status, lower-cased headers and body."""

    status_code: int
    headers: dict[str, str]
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def close(self) -> None:
        self.writer.close()

    async def exchange(self, request: bytes, head_only: bool) -> tuple[Response, bool]:
        """Send ``request``, read the answer: (response, whether the connection is reusable)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ReadError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        reusable = headers.get("connection", "").lower() != "close"
        if head_only or status in (204, 304) or 100 <= status < 200:
            body = b""
        elif "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked()
        else:
            body = await self.reader.read()
            reusable = False
        return Response(status, headers, body), reusable

    async def _chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)


IDEMPOTENT = ("GET", "HEAD")
"""Methods sent again on a fresh connection when a kept-alive one turns out closed."""


def _answered(error: BaseException) -> bool:
    """Whether part of an answer had come before ``error`` (then it is not a closed idle
    connection, and the request is not sent again)."""
    return isinstance(error, asyncio.IncompleteReadError) and bool(error.partial)


class Client:
    """Keep-alive connections to the server at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or 80
        self.authority = url.netloc
        self.timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        """One request on an idle connection (or a new one); raises :class:`TransportError`.
        ``timeout_s``: this request's timeout (default the client's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if self._closed:
            raise TransportError("the client is closed")
        target = f"{path}?{urlencode(params)}" if params else path
        body = b"" if json is None else jsonlib.dumps(json, separators=(",", ":")).encode()
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}"]
        if json is not None:
            lines.append("Content-Type: application/json")
        if body or method not in ("GET", "HEAD", "DELETE"):
            lines.append(f"Content-Length: {len(body)}")
        lines.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        try:
            async with asyncio.timeout(timeout_s):
                reused = self._reusable()
                connection = reused or await self._connect()
                try:
                    response, reusable = await connection.exchange(request, method == "HEAD")
                except (OSError, asyncio.IncompleteReadError) as error:
                    connection.close()
                    if reused is None or method not in IDEMPOTENT or _answered(error):
                        raise
                    # The server closed the kept-alive connection as we sent (its keep-alive
                    # timeout): a request that changes nothing is sent once more, afresh.
                    connection = await self._connect()
                    try:
                        response, reusable = await connection.exchange(request, method == "HEAD")
                    except BaseException:
                        connection.close()
                        raise
                except BaseException:
                    connection.close()
                    raise
        except TimeoutError as error:
            raise ReadTimeout(f"no answer in {timeout_s:g} s") from error
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            raise ReadError(f"{type(error).__name__}: {error}") from error
        except ValueError as error:  # a malformed length or chunk size
            raise ReadError(f"malformed answer: {error}") from error
        if reusable and not self._closed:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.close()
        return response

    def _reusable(self) -> _Connection | None:
        """The most recently used idle connection the server has not closed and will not close
        soon (module docstring); older ones are closed."""
        fresh_after = asyncio.get_running_loop().time() - IDLE_REUSE_S
        while self._idle:
            connection = self._idle.pop()
            if (
                connection.idle_since >= fresh_after
                and not connection.reader.at_eof()
                and not connection.writer.is_closing()
            ):
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as error:
            raise ConnectError(f"{self.authority}: {error}") from error
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close when their request ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
