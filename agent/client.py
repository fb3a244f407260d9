"""The /v1/agent API over HTTP (docs/service.md, "Agent endpoints").

Every call is one request with a short timeout; it never retries on its own, so a call never
holds the agent loop longer than the timeout. What failed is told apart:

- :class:`ApiUnavailable`: no answer, a timeout, a 5xx or a 429. Transient: the loop keeps
  every process running and tries again after :class:`shockwave.domain.backoff.Backoff`'s delay.
- :class:`ApiRefused`: a 4xx problem. The server answered; ``stop`` says it wants the attempt
  stopped (attempt fencing, a 409 with ``stop: true``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import httpx

from agent.config import Machine

ReportState = Literal["started", "running", "checkpointed", "exited"]


class ApiUnavailable(Exception):
    """The API did not answer usefully (connection refused, timeout, 5xx, 429)."""


class ApiRefused(Exception):
    """The API answered with a 4xx problem: ``status`` and the problem body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        detail = problem.get("detail") or problem.get("title") or ""
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.problem = problem

    @property
    def stop(self) -> bool:
        """The server says the attempt must stop (a 409 with ``stop: true``)."""
        return self.status == 409 and self.problem.get("stop") is True


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease as polled: run ``command`` (in ``image`` with Docker) for ``job_id`` on the
    local ``gpus`` until ``ends_at`` (seconds since the epoch). ``env`` is the server's part of
    the job's environment; ``checkpoint_dir`` is relative to the agent's work directory."""

    attempt_id: str
    job_id: str
    round_index: int
    gpus: tuple[int, ...]
    ends_at: float
    batch_size: int
    checkpoint_dir: str
    env: dict[str, str]
    command: tuple[str, ...]
    image: str | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Lease:
        return cls(
            attempt_id=str(body["attempt_id"]),
            job_id=str(body["job_id"]),
            round_index=int(body["round_index"]),
            gpus=tuple(int(g) for g in body["gpus"]),
            ends_at=parse_time(str(body["ends_at"])),
            batch_size=int(body["batch_size"]),
            checkpoint_dir=str(body["checkpoint_dir"]),
            env={str(k): str(v) for k, v in body.get("env", {}).items()},
            command=tuple(str(a) for a in body.get("command") or ()),
            image=body.get("image") or None,
        )


@dataclass(frozen=True, slots=True)
class LeasePoll:
    """What the node must run (``leases``, by attempt id) and must stop (``stop``).
    From ``POST /v1/agent/poll``: ``reports``, the answer to each report sent, in order
    (``{"attempt_id", "status", "stop", ...}``: ``status`` is what the report alone would have
    got, 200, 404 or 409); ``tokens``, a job token for each lease not yet running when asked
    for."""

    leases: dict[str, Lease]
    stop: frozenset[str]
    reports: tuple[dict[str, Any], ...] = ()
    tokens: dict[str, str] = field(default_factory=dict)
    current_round: int | None = None
    """The round the answer is from (None: not said)."""
    round_ends_at: float | None = None
    """When that round ends, seconds since the epoch (None: not said, or no round yet)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """A bounded long poll: hold the answer up to ``seconds`` while nothing is new for the
    node and the current round is still ``seen_round`` (``wait_s``/``seen_round`` of
    ``POST /v1/agent/poll``)."""

    seconds: float
    seen_round: int


@dataclass(frozen=True, slots=True)
class Report:
    """A report on ``attempt_id`` not yet delivered (the agent's outbox, :mod:`agent.state`).
    ``stop_requested`` (``exited`` only): the agent had asked the process to stop, so its exit
    code is that stop, not a failure."""

    attempt_id: str
    state: ReportState
    exit_code: int | None = None
    stop_requested: bool = False

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"state": self.state}
        if self.state == "exited":
            body["exit_code"] = self.exit_code
            if self.stop_requested:
                body["stop_requested"] = True
        return body


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp as seconds since the epoch (UTC when it names no zone)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC).timestamp()
    return moment.timestamp()


class AgentApi(Protocol):
    """What the agent loop needs of the server (:class:`AgentClient`, or a fake in tests)."""

    def register(self, machine: Machine, hostname: str) -> dict[str, Any]: ...

    def poll(
        self,
        running: list[str],
        reports: list[Report],
        heartbeat: bool,
        tokens: bool,
        logs: dict[str, str] | None = None,
        wait: Wait | None = None,
    ) -> LeasePoll: ...

    def job_token(self, attempt_id: str) -> str: ...


class AgentClient:
    """The agent endpoints, acting with ``token`` (None: open mode) for ``node`` (sent when
    set; an agent token's node is implied)."""

    def __init__(
        self,
        api_url: str,
        token: str | None,
        node: str | None,
        timeout_s: float,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.node = node
        self.long_polls = True
        """False once the server refused ``wait_s`` (an older one: 422): plain polls then."""
        self.defers_busy = True
        """False once the server refused ``defer_busy`` (an older one: 422): its polls then
        wait for a job another transaction holds, and answer no report 503."""
        self._http = httpx.Client(
            base_url=api_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def register(self, machine: Machine, hostname: str) -> dict[str, Any]:
        body = {"gpus": machine.gpus, "gpu_type": machine.gpu_type, "hostname": hostname}
        return self._call("POST", "/v1/agent/register", json=self._named(body))

    def poll(
        self,
        running: list[str],
        reports: list[Report],
        heartbeat: bool,
        tokens: bool,
        logs: dict[str, str] | None = None,
        wait: Wait | None = None,
    ) -> LeasePoll:
        """One contact in one request: deliver ``reports``, heartbeat (when ``heartbeat``),
        tell the server what runs here and learn the leases (with a job token for each new
        one, when ``tokens``); ``logs``: the tail of attempts' output, by attempt id;
        ``wait``: let the server hold the answer until it has news (a bounded long poll)."""
        body = self._named(
            {
                "heartbeat": heartbeat,
                "tokens": tokens,
                "reports": [{"attempt_id": r.attempt_id, **r.body()} for r in reports],
                "running": running,
            }
        )
        if logs:
            body["logs"] = logs
        if self.defers_busy:
            try:
                answer = self._post_poll({**body, "defer_busy": True}, wait)
            except ApiRefused as error:
                if error.status != 422:
                    raise
                self.defers_busy = False  # a server that predates it: the polls wait
                answer = self._post_poll(body, wait)
        else:
            answer = self._post_poll(body, wait)
        try:
            leases = [Lease.parse(item) for item in answer["leases"]]
            stop = frozenset(str(a) for a in answer["stop"])
            answers = tuple(dict(item) for item in answer["reports"])
            minted = {str(k): str(v) for k, v in answer["tokens"].items()}
            current = answer.get("current_round")
            current = None if current is None else int(current)
            ends = answer.get("round_ends_at")
            ends = None if not ends else parse_time(str(ends))
            if len(answers) != len(reports):
                raise ValueError(f"{len(answers)} report answers for {len(reports)} reports")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ApiUnavailable(f"POST /v1/agent/poll: unexpected answer ({error!r})") from error
        by_id = {lease.attempt_id: lease for lease in leases}
        return LeasePoll(
            leases=by_id,
            stop=stop,
            reports=answers,
            tokens=minted,
            current_round=current,
            round_ends_at=ends,
        )

    def _post_poll(self, body: dict[str, Any], wait: Wait | None) -> Any:
        if wait is None or not self.long_polls:
            return self._call("POST", "/v1/agent/poll", json=body)
        try:
            return self._call(
                "POST",
                "/v1/agent/poll",
                json={**body, "wait_s": wait.seconds, "seen_round": wait.seen_round},
            )
        except ApiRefused as error:
            if error.status != 422:
                raise
            self.long_polls = False  # a server without long polls: ask plainly
            return self._call("POST", "/v1/agent/poll", json=body)

    def job_token(self, attempt_id: str) -> str:
        return str(self._call("POST", f"/v1/agent/leases/{attempt_id}/token")["token"])

    def _named(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "node": self.node} if self.node is not None else body

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise ApiUnavailable(f"{method} {path}: {type(error).__name__}: {error}") from error
        if response.status_code >= 500 or response.status_code == 429:
            raise ApiUnavailable(f"{method} {path}: HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if response.status_code >= 400:
            raise ApiRefused(response.status_code, body)
        return body
