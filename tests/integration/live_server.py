"""A real uvicorn server in a thread, for tests that need requests to run concurrently (the
TestClient runs one request at a time, so it cannot show what happens when they overlap)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from api.http_limits import configure

START_TIMEOUT_S = 10.0


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on a free localhost port for the duration; yields its base URL.

    The listening socket is bound before the server starts, so no other process can take the
    port in between.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    http = configure(app.state.settings)  # the HTTP server's head limits, as in production
    config = uvicorn.Config(app, log_level="warning", lifespan="auto", backlog=256, http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)
        listener.close()
