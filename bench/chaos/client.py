"""HTTP to several API processes at once, riding out the faults the chaos run injects.

Every chaos client (the workload, each simulated agent) talks to all the API processes: a call
goes to the next one in turn, and a transport error (the process was killed, Postgres is
restarting and the request timed out) or a 5xx answer moves it on to the next after a short
pause, until the call's deadline. A 2xx or 4xx answer is final. Calls that create or record
something carry an ``Idempotency-Key`` that the caller keeps across retries, so a retry of a
request that had in fact committed replays the first answer instead of doing it twice.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 5.0
RETRY_PAUSE_S = 0.25
"""The pause once every process failed a try in a row; doubled each time up to
:data:`MAX_PAUSE_S`. A process that fails alone (killed) is skipped without a pause."""
MAX_PAUSE_S = 2.0


class Unavailable(Exception):
    """No API process answered the call (without a 5xx) before its deadline."""


class RoundRobin:
    """Calls to the API processes at ``urls`` in turn, as the bearer of ``token``.

    ``retried`` counts the tries that failed and were retried (transport errors and 5xx)."""

    def __init__(self, urls: Sequence[str], token: str) -> None:
        self.urls = list(urls)
        self._clients = [
            httpx.Client(
                base_url=url,
                headers={"Authorization": f"Bearer {token}"},
                timeout=REQUEST_TIMEOUT_S,
            )
            for url in self.urls
        ]
        self._turn = itertools.cycle(range(len(self._clients)))
        self.retried = 0

    def close(self) -> None:
        for client in self._clients:
            client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        deadline_s: float = 30.0,
    ) -> httpx.Response:
        """The first final answer (2xx-4xx) to ``method path``; raises :class:`Unavailable`
        after ``deadline_s``. ``token``: act with this bearer token instead (a job's own)."""
        extra = dict(headers or {})
        if token is not None:
            extra["Authorization"] = f"Bearer {token}"
        deadline = time.monotonic() + deadline_s
        pause = RETRY_PAUSE_S
        last, failed = "no try", 0
        while True:
            client = self._clients[next(self._turn)]
            try:
                response = client.request(method, path, json=json, params=params, headers=extra)
            except httpx.TransportError as error:
                last = f"{client.base_url}: {type(error).__name__}"
            else:
                if response.status_code < 500:
                    return response
                last = f"{client.base_url}: {response.status_code}"
            self.retried += 1
            failed += 1
            if time.monotonic() > deadline:
                raise Unavailable(f"{method} {path}: {last}")
            if failed % len(self._clients) == 0:  # every process failed once: wait a little
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(MAX_PAUSE_S, pause * 2)
