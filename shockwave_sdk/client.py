"""Reporting a job's epochs and batch-size changes to the Shockwave API.

``POST /v1/jobs/{id}/events`` (docs/api.md) with the job-scoped token the agent hands the process.
Every event is first numbered and written to the job's :class:`~shockwave_sdk.outbox.EventOutbox`
(in the checkpoint directory), then sent with ``Idempotency-Key`` derived from its seq, and
retried with exponential backoff and jitter while the API is unreachable, answers 5xx or 429, or
is still running the first copy of the request (409). A delivery gives up at its deadline and
leaves the event pending: the next report, :meth:`ShockwaveClient.flush`, or the next attempt
sends it (while the API is known to be away, reports try once without waiting). An API outage
therefore never stops training, and no event is lost or counted twice.

Refusals that no retry can fix raise: :class:`JobFinished` when the job is already finished or
cancelled (the program should stop), :class:`EventRejected` for any other 4xx (a bad event, a
token that may not post for this job). The refused event is dropped from the outbox.

Attempt fencing: the agent's token speaks for one attempt, and once the server has fenced it
(lost with its node, revoked with a newer attempt under way, or stopped) an event is refused
with ``409 Attempt fenced``; a newer attempt's claim on the outbox file says the same locally
(:class:`~shockwave_sdk.outbox.OutboxTaken`). Either way this process is an attempt the job has
moved on from: another attempt may already train it from the same checkpoint directory. So
nothing more may be written there, not even a checkpoint (it would overwrite the newer
attempt's); the one exception is taking the refused event back out of the outbox while no newer
attempt has claimed it, so that no later attempt sends it in its own name. By default the SDK
ends the process at once (``os._exit(FENCED_EXIT_CODE)``: no ``finally`` block, no ``atexit``
hook, no checkpoint handler runs); ``on_fenced`` replaces that, and if it returns,
:class:`AttemptFenced` is raised by this and every later report.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, NoReturn

import httpx

from shockwave_sdk.checkpoint import CheckpointStore
from shockwave_sdk.environment import JobEnvironment
from shockwave_sdk.outbox import Event, EventOutbox, OutboxTaken

JOB_RECORD_NAME = "shockwave-job.json"
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
FENCED_EXIT_CODE = 75
"""The exit status of a process the SDK ends because its attempt was fenced."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long one delivery keeps trying. ``deadline_s``: the whole delivery, all events and
    retries; backoff doubles from ``first_delay_s`` up to ``max_delay_s``, each delay drawn
    uniformly from its upper half (jitter); ``request_timeout_s``: one HTTP request (of the
    client the SDK makes; an ``http`` client passed in keeps its own timeout)."""

    deadline_s: float = 15.0
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0
    request_timeout_s: float = 5.0

    def delay(self, retry: int, rng: random.Random) -> float:
        ceiling = min(self.max_delay_s, self.first_delay_s * 2.0 ** min(retry, 32))
        return ceiling * rng.uniform(0.5, 1.0)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What became of one event: ``delivered`` (``status`` 201 new, 200 a replay of one the API
    already had) or still pending in the outbox."""

    seq: int
    delivered: bool
    status: int | None = None
    event_id: int | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """The job as the API describes it (``GET /v1/jobs/{id}``), the fields a training program
    needs to configure itself."""

    id: str
    name: str
    state: str
    gpus: int
    epochs: int
    samples_per_epoch: int
    initial_batch_size: int
    mode: str
    batch_sizes: tuple[int, ...]
    batch_size: int
    epochs_done: float

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> JobRecord:
        return cls(
            id=str(body["id"]),
            name=str(body["name"]),
            state=str(body["state"]),
            gpus=int(body["gpus"]),
            epochs=int(body["epochs"]),
            samples_per_epoch=int(body["samples_per_epoch"]),
            initial_batch_size=int(body["initial_batch_size"]),
            mode=str(body["mode"]),
            batch_sizes=tuple(int(b) for b in body["batch_sizes"]),
            batch_size=int(body["batch_size"]),
            epochs_done=float(body["epochs_done"]),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class EventRejected(Exception):
    """The API refused an event for good (a 4xx no retry can fix). ``problem``: its problem
    details (RFC 9457), or ``{}``."""

    def __init__(self, status: int, problem: Mapping[str, Any], event: Mapping[str, Any]):
        detail = problem.get("detail") or problem.get("title") or f"HTTP {status}"
        super().__init__(f"event seq {event.get('seq')} refused: {status} {detail}")
        self.status = status
        self.problem = dict(problem)
        self.event = dict(event)


class JobFinished(EventRejected):
    """The job is finished or cancelled: it takes no more events, and its program should stop."""


class AttemptFenced(EventRejected):
    """This process's attempt was fenced: the job may already run elsewhere from the same
    checkpoint directory. The program must stop at once and write nothing more there (no
    checkpoint). Raised only when an ``on_fenced`` hook returns; by default the process ends."""


def exit_fenced(fenced: AttemptFenced) -> None:
    """The default reaction to fencing: say why on stderr and end the process now, with
    :data:`FENCED_EXIT_CODE`, skipping every cleanup that could write a checkpoint."""
    print(f"shockwave: {fenced}: stopping this process now", file=sys.stderr, flush=True)
    os._exit(FENCED_EXIT_CODE)


class ApiUnavailable(Exception):
    """A read (not an event) could not reach the API before its deadline."""


class _Transient(Exception):
    """A failure worth retrying (transport error, 5xx, 429, an idempotent request in flight)."""


class _SeqTaken(Exception):
    """The event's seq already holds another event (an earlier outbox was lost)."""


class ShockwaveClient:
    """A training process's connection to the API, for one job.

    ``http``: an ``httpx.Client`` to send with (tests pass FastAPI's ``TestClient``); by default
    one is made and closed with this client. ``should_give_up``: polled between retries, so a
    process that has been asked to stop does not spend its grace period waiting for the API
    (pass ``lambda: stop.requested``). ``on_fenced``: what to do once this attempt is fenced
    (module docstring); default :func:`exit_fenced`. ``sleep``, ``clock`` and ``rng`` are
    injectable for tests.
    """

    def __init__(
        self,
        *,
        api_url: str,
        job_id: str,
        token: str | None,
        outbox: EventOutbox,
        http: httpx.Client | None = None,
        retry: RetryPolicy | None = None,
        should_give_up: Callable[[], bool] | None = None,
        on_fenced: Callable[[AttemptFenced], None] = exit_fenced,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.job_id = job_id
        self.outbox = outbox
        self.retry = retry or RetryPolicy()
        self._owns_http = http is None
        self._http = http or httpx.Client(timeout=self.retry.request_timeout_s)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._should_give_up = should_give_up or (lambda: False)
        self._on_fenced = on_fenced
        self._fenced: AttemptFenced | None = None
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._api_away = False

    @classmethod
    def from_environment(cls, env: JobEnvironment, **options: Any) -> ShockwaveClient:
        """The client for the job the agent started this process for (its outbox lives in
        ``SHOCKWAVE_CHECKPOINT_DIR``). Raises ``ValueError`` outside a managed job."""
        if env.job_id is None or env.api_url is None or env.checkpoint_dir is None:
            raise ValueError(
                "not started by a Shockwave agent: SHOCKWAVE_JOB_ID, SHOCKWAVE_API_URL and "
                "SHOCKWAVE_CHECKPOINT_DIR must all be set"
            )
        outbox = EventOutbox(
            CheckpointStore(env.checkpoint_dir), env.job_id, attempt=env.attempt_id
        )
        return cls(
            api_url=env.api_url, job_id=env.job_id, token=env.token, outbox=outbox, **options
        )

    # -- events ---------------------------------------------------------------------------

    def report_epoch_end(
        self, epoch: int, samples: int, seconds: float, batch_size: int
    ) -> Delivery:
        """Epoch ``epoch`` (1-based) finished: it processed ``samples`` samples in ``seconds``
        of wall time at ``batch_size``."""
        return self._send(
            {
                "kind": "progress",
                "epoch": int(epoch),
                "samples": int(samples),
                "seconds": float(seconds),
                "batch_size": int(batch_size),
            }
        )

    def request_batch_size(self, batch_size: int, epoch: int) -> Delivery:
        """The job trains at ``batch_size`` from epoch ``epoch`` on (the number of epochs
        finished before the change; 0 = from the start). The scheduler replans with it."""
        return self._send({"kind": "scaling", "batch_size": int(batch_size), "epoch": int(epoch)})

    def flush(self, deadline_s: float | None = None) -> int:
        """Try to deliver every pending event within ``deadline_s`` (default: the retry
        policy's); returns how many are still pending."""
        with self._lock, self._fencing():
            self._deliver_pending(self._clock() + (deadline_s or self.retry.deadline_s))
            return len(self.outbox.pending())

    def _send(self, body: Mapping[str, Any]) -> Delivery:
        """Store the event, then deliver it and any older pending ones. While the API is known
        to be away (the last delivery ran out of time), one try and no retries: training does
        not stall for a whole deadline at every report of an outage."""
        with self._lock, self._fencing():
            event = self.outbox.add(body)
            budget = 0.0 if self._api_away else self.retry.deadline_s
            outcomes = self._deliver_pending(self._clock() + budget)
            seq = int(event["seq"])
            return outcomes.get(seq, Delivery(seq=seq, delivered=False))

    @contextmanager
    def _fencing(self) -> Iterator[None]:
        """Refuse to act once fenced; turn a fencing found out inside into the reaction."""
        if self._fenced is not None:
            raise self._fenced
        try:
            yield
        except OutboxTaken as taken:
            self._fence(AttemptFenced(409, {"detail": str(taken), "fenced": True}, {}))
        except AttemptFenced as fenced:
            self._fence(fenced)

    def _fence(self, fenced: AttemptFenced) -> NoReturn:
        self._fenced = fenced
        self._on_fenced(fenced)
        raise fenced

    def _deliver_pending(self, deadline: float) -> dict[int, Delivery]:
        """Send pending events in seq order until one cannot get through before ``deadline``;
        returns the outcome of each one sent, by the seq it was first given."""
        outcomes: dict[int, Delivery] = {}
        self._api_away = False
        for event in self.outbox.pending():
            first_seq = int(event["seq"])
            delivery = self._deliver(event, deadline)
            if delivery is None:
                self._api_away = True
                break
            outcomes[first_seq] = delivery
        return outcomes

    def _deliver(self, event: Event, deadline: float) -> Delivery | None:
        renumbered = False
        retry = 0
        while True:
            try:
                status, body = self._post(event)
            except _SeqTaken:
                try:
                    known = 0 if renumbered else self._server_last_seq()
                except ApiUnavailable:
                    return None
                except EventRejected:
                    known = 0  # the events cannot be listed: step past the taken seq one by one
                event = self.outbox.renumber(int(event["seq"]), known)
                renumbered = True
                continue
            except AttemptFenced:
                with suppress(OutboxTaken):  # taken: the file is not ours to touch any more
                    self.outbox.delivered(int(event["seq"]))
                raise
            except EventRejected:
                self.outbox.delivered(int(event["seq"]))
                raise
            except _Transient:
                delay = self.retry.delay(retry, self._rng)
                retry += 1
                if self._should_give_up() or self._clock() + delay > deadline:
                    return None
                self._sleep(delay)
                continue
            self.outbox.delivered(int(event["seq"]))
            event_id = body.get("id") if isinstance(body, Mapping) else None
            return Delivery(
                seq=int(event["seq"]),
                delivered=True,
                status=status,
                event_id=int(event_id) if isinstance(event_id, int) else None,
            )

    def _post(self, event: Event) -> tuple[int, Any]:
        key = f"shockwave-sdk:{self.job_id}:{event['seq']}"
        headers = {**self._headers, "Idempotency-Key": key}
        try:
            response = self._http.post(
                f"{self.api_url}/v1/jobs/{self.job_id}/events",
                json=event,
                headers=headers,
            )
        except httpx.TransportError as error:
            raise _Transient(str(error)) from error
        if response.status_code in (200, 201):
            return response.status_code, response.json()
        problem = _problem(response)
        if response.status_code in TRANSIENT_STATUSES:
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code == 409:
            if problem.get("fenced") is True:
                raise AttemptFenced(409, problem, event)
            if any(e.get("field") == "seq" for e in problem.get("errors", []) or []):
                raise _SeqTaken()
            if self._job_state() in TERMINAL_STATES:
                raise JobFinished(409, problem, event)
            raise _Transient("HTTP 409: the same request is still in progress")
        raise EventRejected(response.status_code, problem, event)

    # -- reads ----------------------------------------------------------------------------

    def job(self, deadline_s: float | None = None) -> JobRecord:
        """The job's record; retried like events, raises :class:`ApiUnavailable` past the
        deadline and :class:`EventRejected` on a 4xx (no such job for this token)."""
        return JobRecord.from_api(self._get(f"/v1/jobs/{self.job_id}", deadline_s))

    def _job_state(self) -> str | None:
        try:
            return str(self._get(f"/v1/jobs/{self.job_id}", self.retry.request_timeout_s)["state"])
        except (ApiUnavailable, EventRejected):
            return None

    def _server_last_seq(self) -> int:
        """The highest seq among the job's stored events (pages through them)."""
        highest, token = 0, None
        while True:
            params = {"page_size": "500", **({"page_token": token} if token else {})}
            page = self._get(f"/v1/jobs/{self.job_id}/events", None, params)
            for item in page["items"]:
                if item.get("seq") is not None:
                    highest = max(highest, int(item["seq"]))
            token = page.get("next_page_token")
            if not token:
                return highest

    def _get(
        self, path: str, deadline_s: float | None, params: Mapping[str, str] | None = None
    ) -> Any:
        deadline = self._clock() + (deadline_s or self.retry.deadline_s)
        retry = 0
        while True:
            try:
                response = self._http.get(
                    f"{self.api_url}{path}",
                    params=params,
                    headers=self._headers,
                )
                if response.status_code == 200:
                    return response.json()
                if response.status_code not in TRANSIENT_STATUSES:
                    raise EventRejected(response.status_code, _problem(response), {})
                failure = f"HTTP {response.status_code}"
            except httpx.TransportError as error:
                failure = str(error) or type(error).__name__
            delay = self.retry.delay(retry, self._rng)
            retry += 1
            if self._should_give_up() or self._clock() + delay > deadline:
                raise ApiUnavailable(f"GET {self.api_url}{path}: {failure}")
            self._sleep(delay)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ShockwaveClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def remembered_job(
    client: ShockwaveClient, store: CheckpointStore, deadline_s: float | None = None
) -> JobRecord | None:
    """The job's record from the API, remembered in the checkpoint directory: an attempt that
    starts while the API is unreachable configures itself from the last attempt's copy, so it
    trains the same job (same epochs, same batch sizes). ``None`` when neither is available."""
    try:
        record = client.job(deadline_s)
    except ApiUnavailable:
        stored = store.load_json(JOB_RECORD_NAME)
        return JobRecord.from_api(stored) if isinstance(stored, Mapping) else None
    store.save_json(JOB_RECORD_NAME, record.to_json())
    return record


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
