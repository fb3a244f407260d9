"""shockwave_fleet/wire.py, the fleet's and the load generators' HTTP client, against a small
asyncio server: bodies by length and chunked, keep-alive reuse, a kept-alive connection the
server closed, timeouts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from shockwave_fleet import wire

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Answers one request (its head and body); whether to keep the connection open."""


async def serve(handler: Handler) -> tuple[asyncio.Server, str, list[int]]:
    """A server on a free port; ``connections`` counts the connections it accepted."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length)
                if not await handler(head + body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", connections


def answer(status: int, body: bytes, *extra: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def echo(request: bytes, writer: asyncio.StreamWriter) -> bool:
    head, _, body = request.partition(b"\r\n\r\n")
    target = head.split(b" ")[1].decode()
    writer.write(answer(200, json.dumps({"target": target, "body": body.decode()}).encode()))
    await writer.drain()
    return True


def test_json_bodies_query_parameters_and_keep_alive() -> None:
    async def main() -> None:
        server, base, connections = await serve(echo)
        client = wire.Client(base, timeout_s=5.0)
        first = await client.request("POST", "/v1/x", json={"a": 1}, headers={"X-Y": "z"})
        second = await client.request("GET", "/v1/y", params={"running": "a,b"})
        await client.aclose()
        server.close()
        assert first.status_code == 200 and first.is_success
        assert first.json() == {"target": "/v1/x", "body": '{"a":1}'}
        assert second.json() == {"target": "/v1/y?running=a%2Cb", "body": ""}
        assert len(connections) == 1, "the second request reused the connection"

    asyncio.run(main())


def test_chunked_answers_and_error_statuses_are_responses() -> None:
    async def chunked(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'3\r\n{"a\r\n4\r\n":1}\r\n0\r\n\r\n'
        )
        await writer.drain()
        return True

    async def main() -> None:
        server, base, _ = await serve(chunked)
        client = wire.Client(base, timeout_s=5.0)
        response = await client.request("POST", "/x")
        await client.aclose()
        server.close()
        assert (response.status_code, response.is_success, response.json()) == (
            409,
            False,
            {"a": 1},
        )

    asyncio.run(main())


def test_a_get_is_sent_again_when_the_kept_alive_connection_was_closed_but_a_post_is_not() -> None:
    async def once(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await echo(request, writer)
        return False  # the server closes every connection after one answer, unannounced

    def unnoticed(client: wire.Client) -> None:
        """Make the idle connection look open, as when the server's close is still in flight
        when the next request goes out."""
        client._idle[-1].reader._eof = False  # type: ignore[attr-defined]

    async def main() -> None:
        server, base, connections = await serve(once)
        client = wire.Client(base, timeout_s=5.0)
        await client.request("GET", "/a")
        unnoticed(client)
        again = await client.request("GET", "/b")
        unnoticed(client)
        with pytest.raises(wire.ReadError):
            await client.request("POST", "/c", json={})
        await client.aclose()
        server.close()
        assert again.json()["target"] == "/b"
        assert len(connections) == 2, "/a, then /b on a fresh connection; /c was not resent"

    asyncio.run(main())


def test_a_connection_idle_too_long_is_not_reused_so_a_post_never_races_the_servers_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "IDLE_REUSE_S", 0.05)

    async def main() -> None:
        server, base, connections = await serve(echo)
        client = wire.Client(base, timeout_s=5.0)
        await client.request("POST", "/a", json={})
        await client.request("POST", "/b", json={})  # at once: the same connection
        await asyncio.sleep(0.1)
        late = await client.request("POST", "/c", json={})
        await client.aclose()
        server.close()
        assert late.json()["target"] == "/c"
        assert len(connections) == 2, "/a and /b on one connection, /c on a new one"

    asyncio.run(main())


def test_no_answer_in_time_is_a_read_timeout_and_no_server_a_connect_error() -> None:
    async def silent(_: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    async def main() -> None:
        server, base, _ = await serve(silent)
        client = wire.Client(base, timeout_s=0.2)
        with pytest.raises(wire.ReadTimeout):
            await client.request("GET", "/slow")
        server.close()
        await server.wait_closed()
        with pytest.raises(wire.ConnectError):
            await wire.Client(base, timeout_s=1.0).request("GET", "/gone")

    asyncio.run(main())
