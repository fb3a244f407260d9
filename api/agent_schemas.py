"""Bodies of the agent endpoints (/v1/agent): what a node agent sends and what it gets back.

An agent acts for the node its token names; an admin may act for any node by naming it in
``node``. Text is bounded and free of control characters, so nothing an agent sends can break a
column (Postgres refuses NUL in text).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator

from api.schemas import NodeId, ProgressEventCreate, ScalingEventCreate
from shockwave.domain.lifecycle import JobState, LeaseState, NodeState
from store.tables import INT4_MAX

Label = Annotated[str, Field(max_length=64, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")]
Hostname = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$")]
ExitCode = Annotated[int, Strict(), Field(ge=-(2**31), le=INT4_MAX)]

AttemptIdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[^\x00]+$")]
"""An attempt (lease) id as a path segment: bounded and without NUL."""
AttemptId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\x00]+$")]
"""An attempt (lease) id in a body: bounded and without NUL."""
POLL_ITEMS_MAX = 1024
"""The most attempts (running, or reported on) one poll may carry: far more than a node's GPUs."""
LOG_TAIL_MAX = 8192
"""The most characters of an attempt's output an agent ships (its last ones)."""
LogTail = Annotated[str, Field(max_length=LOG_TAIL_MAX, pattern=r"^[^\x00]*$")]
POLL_WAIT_MAX_S = 30.0
"""The longest a poll may ask to be held (``wait_s``); the server may hold it less."""


class NodeRegister(BaseModel):
    """An agent announces its machine: ``gpus`` GPUs of ``gpu_type`` on ``hostname``.
    Registering again updates the node and makes it READY."""

    model_config = ConfigDict(extra="forbid")

    gpus: Annotated[int, Strict(), Field(ge=1, le=1024)]
    gpu_type: Label = ""
    hostname: Hostname
    node: NodeId | None = Field(default=None, description="Admins only: the node to act for.")


class NodeHeartbeat(BaseModel):
    """A sign of life. An empty body is fine for an agent."""

    model_config = ConfigDict(extra="forbid")

    node: NodeId | None = Field(default=None, description="Admins only: the node to act for.")


class NodeStatus(BaseModel):
    """The node as the server sees it after a register or heartbeat, with the current round.
    ``state_version``: the cluster's version after the call (a register bumps it)."""

    id: str
    hostname: str
    gpus: int
    gpu_type: str
    state: NodeState
    last_heartbeat_at: datetime | None
    registered_at: datetime
    current_round: int
    round_ends_at: datetime | None
    state_version: int


class LeasePublic(BaseModel):
    """One attempt to run a job on this node until ``ends_at`` (the round's end).

    ``gpus`` are local GPU indices. ``env`` is what the job's process needs to start:
    CUDA_VISIBLE_DEVICES, SHOCKWAVE_JOB_ID, SHOCKWAVE_ATTEMPT_ID,
    SHOCKWAVE_BATCH_SIZE and SHOCKWAVE_CHECKPOINT_DIR; the agent adds SHOCKWAVE_API_URL and the
    job-scoped token (POST .../token). ``checkpoint_dir`` is a suggestion relative to the agent's
    work directory, the same for every attempt of the job, so a resumed attempt finds the last
    checkpoint (on several nodes it must be shared storage). ``command`` (argv) and ``image``
    are the job's: what to run, and the container image to run it in where the agent runs
    Docker. ``began_at``: when the lease's time counts from, its round's boundary for a lease
    issued just ahead of it (the driver's boundary lead), else its issue; the service counts
    the job's received service from it (a program starts when its agent has the lease)."""

    attempt_id: str
    job_id: str
    node: str
    round_index: int
    gpus: list[int]
    ends_at: datetime
    began_at: datetime | None = None
    state: LeaseState
    batch_size: int
    checkpoint_dir: str
    env: dict[str, str]
    command: list[str] = []
    image: str | None = None


class NodeLeases(BaseModel):
    """What a node must run now (``leases``) and what it must stop (``stop``: attempt ids).

    ``stop`` holds this node's attempts revoked or lost in the last rounds, and every attempt
    the agent said it runs (``running``) that is not one of ``leases``: an agent reports what it
    runs, the server answers with what must stop. Anything the agent runs that is not in
    ``leases`` must stop too."""

    node: str
    current_round: int
    round_ends_at: datetime | None
    leases: list[LeasePublic]
    stop: list[str]


class LeaseStatusReport(BaseModel):
    """What happened to an attempt: ``started`` (the process is up), ``running`` (still up),
    ``checkpointed`` (it saved its state and stopped), ``exited`` (it ended with
    ``exit_code``, required for ``exited`` only). ``stop_requested`` (``exited`` only): the
    agent had asked the process to stop (SIGTERM), so a nonzero code or a signal is that stop,
    not a failure: the job goes back to the queue instead of FAILED."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["started", "running", "checkpointed", "exited"]
    exit_code: ExitCode | None = Field(default=None, validate_default=True)
    stop_requested: Annotated[bool, Strict()] = Field(default=False, validate_default=True)

    @field_validator("exit_code")
    @classmethod
    def _exit_code_with_exited(cls, value: int | None, info: ValidationInfo) -> int | None:
        exited = info.data.get("state") == "exited"
        if exited and value is None:
            raise ValueError("required when state is 'exited'")
        if not exited and value is not None:
            raise ValueError("only allowed when state is 'exited'")
        return value

    @field_validator("stop_requested")
    @classmethod
    def _stop_requested_with_exited(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("state") != "exited":
            raise ValueError("only allowed when state is 'exited'")
        return value


class LeaseStatusPublic(BaseModel):
    """The attempt and its job after a report. ``stop``: the attempt must not run (it was
    revoked or its job has finished); false while it may keep running until ``ends_at``."""

    attempt_id: str
    job_id: str
    state: LeaseState
    job_state: JobState
    ends_at: datetime
    stop: bool


class AttemptReport(LeaseStatusReport):
    """A :class:`LeaseStatusReport` on attempt ``attempt_id``, carried in a poll."""

    attempt_id: AttemptId


class AttemptProgress(ProgressEventCreate):
    """A progress event (``POST /v1/jobs/{id}/events``) of attempt ``attempt_id``'s job,
    carried in its node's poll."""

    attempt_id: AttemptId


class AttemptScaling(ScalingEventCreate):
    """A scaling event of attempt ``attempt_id``'s job, carried in its node's poll."""

    attempt_id: AttemptId


AttemptEvent = Annotated[AttemptProgress | AttemptScaling, Field(discriminator="kind")]


class EventAnswer(BaseModel):
    """What one event of a poll got: ``status`` is what the same event posted with the
    attempt's job token would have got (201 stored, 200 a duplicate, 404 no such attempt on
    this node, 409 refused, 422 invalid), or 503 (a poll with ``defer_busy``: its job was busy,
    nothing was recorded, send it again); ``stop``: the attempt is fenced and must stop."""

    attempt_id: str
    seq: int
    status: int
    stop: bool = False
    detail: str | None = None


class AgentPoll(BaseModel):
    """One contact of an agent (``POST /v1/agent/poll``): the reports it owes, in the order
    they happened, and the attempts it runs now. ``heartbeat``: count the contact as a sign of
    life (an agent that heartbeats less often than it polls sends false in between)."""

    model_config = ConfigDict(extra="forbid")

    node: NodeId | None = Field(default=None, description="Admins only: the node to act for.")
    heartbeat: Annotated[bool, Strict()] = True
    tokens: Annotated[bool, Strict()] = Field(
        default=False,
        description="Mint a job token for each live lease not listed in `running` (the agent "
        "is about to start it), returned in `tokens`: it saves a token request per new lease. "
        "A token the agent does not use dies with its attempt.",
    )
    reports: list[AttemptReport] = Field(default=[], max_length=POLL_ITEMS_MAX)
    events: list[AttemptEvent] = Field(
        default=[],
        max_length=POLL_ITEMS_MAX,
        description="Job events (progress, scaling) of the node's attempts, in order: each is "
        "recorded as if its attempt's job token had posted it, and answered in `events`. So a "
        "node's jobs report in its one request per interval instead of one request each. At "
        "most two per GPU of the node (at least 8) per poll.",
    )
    running: list[AttemptId] = Field(
        default=[],
        max_length=POLL_ITEMS_MAX,
        description="Attempts whose processes are up on the node now. A live lease listed "
        "here is RUNNING (the poll acknowledges its start and its extensions); any other comes "
        "back in `stop`.",
    )
    logs: dict[AttemptId, LogTail] = Field(
        default={},
        max_length=POLL_ITEMS_MAX,
        description="The tail of each attempt's output (its last "
        f"{LOG_TAIL_MAX} characters), by attempt id: `shockwave jobs logs` and the dashboard "
        "show it. Attempts of other nodes are ignored.",
    )
    wait_s: float = Field(
        default=0.0,
        ge=0.0,
        le=POLL_WAIT_MAX_S,
        description="A bounded long poll: when nothing is new for the node (no live lease "
        "outside `running`, nothing in `running` to stop, and the current round is "
        "`seen_round`), hold the answer up to this many seconds until something is (the next "
        "round is out, a lease is issued or revoked), then answer. The reports and the "
        "heartbeat are applied before the wait. 0 (the default): answer at once.",
    )
    defer_busy: Annotated[bool, Strict()] = Field(
        default=False,
        description="The agent sends again what the server answers 503: a report or event on "
        "a job whose row another transaction holds at this moment (the round driver writing a "
        "boundary, for seconds on a large cluster) is answered 503 (nothing recorded; send it "
        "again in a later poll), and a start in `running` on such a job is acknowledged by a "
        "later poll, instead of the poll waiting for that transaction. False (the default, "
        "agents that predate it): the poll waits.",
    )
    seen_round: int | None = Field(
        default=None,
        ge=-1,
        le=INT4_MAX,
        description="With `wait_s`: the round the agent's last answer named "
        "(`current_round`); a later round ends the wait even when the node's leases are only "
        "extended. Without it only the node's leases end the wait.",
    )


class ReportAnswer(BaseModel):
    """What one report of a poll got: ``status`` is the HTTP status the same report sent on
    its own (``POST /v1/agent/leases/{attempt_id}/status``) would have got (200, 404 or 409),
    or 503 (a poll with ``defer_busy``: its job was busy, nothing was applied, send it again);
    ``stop``: the attempt must stop; ``detail``: why, when refused; ``lease``: the attempt
    and its job after the report (200 only)."""

    attempt_id: str
    status: int
    stop: bool
    detail: str | None = None
    lease: LeaseStatusPublic | None = None


class PollAnswer(NodeLeases):
    """A poll's answer: what :class:`NodeLeases` says (run ``leases``, stop ``stop``), the
    node's state after the contact, and an answer to each report, in order."""

    node_state: NodeState
    state_version: int
    reports: list[ReportAnswer]
    events: list[EventAnswer] = []
    tokens: dict[str, str] = Field(
        default={},
        description="Asked for with `tokens`: a new job token (SHOCKWAVE_TOKEN) for each live "
        "lease the agent does not run yet, by attempt id. Shown once; stored hashed.",
    )


class JobTokenPublic(BaseModel):
    """A token scoped to one job, for its training process (SHOCKWAVE_TOKEN): it may post
    that job's events and read that job, nothing else. Shown once; stored hashed."""

    attempt_id: str
    job_id: str
    token: str
