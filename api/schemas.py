"""Request and response bodies (pydantic). Numbers are bounded so that nothing a client sends
can overflow a database column; the core's model then checks what makes a job possible.

Types are strict: an integer field takes a JSON integer, not ``"2"``, ``2.0`` or ``true``; a
number field takes a JSON number. Every string and list is bounded, and so is the whole job
record (docs/api.md, "Limits"); text a person reads back (names, labels, the model) holds no
control characters."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args

from fastapi import Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator
from pydantic.config import JsonDict

from shockwave.domain.image_reference import IMAGE_MAX_LENGTH, IMAGE_PATTERN
from shockwave.domain.lifecycle import JobState, NodeState
from shockwave.domain.model import VALID_WIDTHS, AdaptationMode
from shockwave.domain.waiting import Cause
from store.tables import INT4_MAX
from store.tenants import MAX_PATH, PATH_PATTERN

BigInt = Annotated[int, Strict(), Field(ge=-(2**31), le=2**31 - 1)]
BatchSizeKey = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
"""A batch size as a JSON object key: always a string on the wire, read as an integer."""
Finite = Annotated[float, Strict(), Field(allow_inf_nan=False, ge=-1e15, le=1e15)]
PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]*$"
"""No control characters (C0, DEL, C1): they rewrite a terminal that prints the text."""
MAX_COMMAND_BYTES = 65_536
"""All of a command's arguments together (UTF-8): a job record stays small, so a page of
jobs and the lease an agent polls do too."""
Name = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/ -]*$")
]
NodeId = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
]
"""A node's id: letters, digits and ``. _ : @ -`` (a hostname, or a cloud instance id)."""
Tenant = Annotated[str, Field(min_length=1, max_length=MAX_PATH, pattern=PATH_PATTERN)]
"""A tenant's path in the tree: ``team``, or ``org/team`` (store.tenants)."""
PriorityClass = Annotated[
    str,
    Field(
        min_length=1,
        max_length=32,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="A priority class the admins defined (setting ``priority_classes``): it "
        "moves the job within its own tenant's share, never into another's.",
    ),
]
Argument = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]
Command = Annotated[
    list[Argument],
    Field(
        max_length=256,
        description="What an agent runs for the job (argv, no shell); empty: none given.",
    ),
]
Image = Annotated[
    str,
    Field(
        min_length=1,
        max_length=IMAGE_MAX_LENGTH,
        pattern=IMAGE_PATTERN,
        description="Container image an agent with a Docker engine runs ``command`` in: a "
        "Docker image reference (``[registry[:port]/]name[:tag][@digest]``, e.g. "
        "``shockwave:latest``).",
    ),
]


GpuCount = Literal[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
"""The gang sizes a job may ask for (the core's VALID_WIDTHS: powers of two up to 1024), an
enum in the OpenAPI document."""
assert get_args(GpuCount) == VALID_WIDTHS, "GpuCount must list the core's VALID_WIDTHS"
GpuCountKey = Literal["1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024"]
"""A GPU count as a JSON object key."""
assert get_args(GpuCountKey) == tuple(map(str, VALID_WIDTHS)), "GpuCountKey must match GpuCount"


def _strict_int(value: object) -> object:
    """A JSON integer only: a Literal of ints takes ``true`` for 1 (``True == 1``) and Strict()
    does not apply to a Literal, so a boolean is refused here (strict types, docs/api.md)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            "must be an integer (a power of two from 1 to 1024), not a string, number or boolean"
        )
    return value


EnvName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]
Env = Annotated[
    dict[EnvName, EnvValue],
    Field(
        max_length=64,
        description="Environment variables of the job's process (the SHOCKWAVE_* and "
        "CUDA_VISIBLE_DEVICES variables the agent sets win over these).",
    ),
]

JOB_EXAMPLE: JsonDict = {
    "name": "resnet18-gns",
    "gpus": 2,
    "epochs": 30,
    "samples_per_epoch": 50000,
    "initial_batch_size": 32,
    "mode": "gns",
    "batch_sizes": [32, 64, 128, 256],
    "throughput": {"32": 800.0, "64": 1400.0},
    "command": ["python", "train.py", "--data", "/data/cifar10"],
    "env": {"OMP_NUM_THREADS": "4"},
}


class ElasticCreate(BaseModel):
    """An elastic job's GPU counts (docs/elastic.md): the market may run it on any power of two
    from ``min_gpus`` to ``max_gpus`` (its requested ``gpus`` among them). ``speedup``: its
    throughput on a count over its throughput on the requested one, per batch size
    (``{"2": {"32": 1.8}}``); where none is declared a sublinear guess is used."""

    model_config = ConfigDict(extra="forbid")

    min_gpus: Annotated[GpuCount, BeforeValidator(_strict_int)]
    max_gpus: Annotated[GpuCount, BeforeValidator(_strict_int)]
    speedup: Annotated[
        dict[GpuCountKey, Annotated[dict[BatchSizeKey, Finite], Field(max_length=64)]],
        Field(max_length=len(VALID_WIDTHS)),
    ] = {}


class JobCreate(BaseModel):
    """A job submission. ``throughput``: samples per second of the whole
    gang at each batch size, if known. ``tenant``: only an admin may set it; a user's jobs
    belong to the user's tenant. ``command`` (argv) is what a node agent runs for the job, in
    the container ``image`` where the agent runs Docker; a job without one is planned but no
    agent can run it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [JOB_EXAMPLE]})

    name: Name = "job"
    tenant: Tenant | None = None
    gpus: Annotated[
        GpuCount,
        BeforeValidator(_strict_int),
        Field(
            description="GPUs the job's gang needs: a power of two from 1 to 1024; a gang wider "
            "than a node spans nodes."
        ),
    ]
    epochs: BigInt
    samples_per_epoch: BigInt
    initial_batch_size: BigInt
    mode: AdaptationMode = AdaptationMode.STATIC
    batch_sizes: Annotated[list[BigInt], Field(max_length=64)] = []
    throughput: Annotated[dict[BatchSizeKey, Finite], Field(max_length=64)] = {}
    type_throughput: Annotated[
        dict[
            Annotated[str, Field(min_length=1, max_length=64, pattern=PRINTABLE)],
            Annotated[dict[BatchSizeKey, Finite], Field(max_length=64)],
        ],
        Field(
            max_length=16,
            description="Throughput on other GPU types: type -> batch size -> samples/s of "
            "the gang (docs/heterogeneity.md); ``throughput`` is on the job's reference type.",
        ),
    ] = {}
    budget: Annotated[
        float | None,
        Strict(),
        Field(
            allow_inf_nan=False,
            gt=0,
            le=1e15,
            description="The job's weight inside its tenant's share; admins only (a user "
            "names a ``priority`` class). Default: the priority class's weight, else 1.",
        ),
    ] = None
    priority: PriorityClass | None = None
    model: Annotated[str, Field(max_length=128, pattern=PRINTABLE)] = ""
    command: Command = []
    image: Image | None = None
    env: Env = {}
    elastic: ElasticCreate | None = None

    @field_validator("command")
    @classmethod
    def _program_named(cls, value: list[str]) -> list[str]:
        if value and not value[0]:
            raise ValueError("the first argument names the program: it must not be empty")
        size = sum(len(argument.encode()) for argument in value)
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"the command is {size} bytes; at most {MAX_COMMAND_BYTES} in all")
        return value


class JobSummary(BaseModel):
    """A job as a list shows it: what it is and where it stands, without the heavy fields
    (``command``, ``throughput``, ``batch_sizes``, ``measured_epoch_seconds``, ``image``),
    which the single-job read carries (GET /v1/jobs/{id})."""

    id: str
    tenant: str
    name: str
    state: JobState
    gpus: int
    epochs: int
    samples_per_epoch: int
    initial_batch_size: int
    mode: str
    budget: float
    priority: str | None = None
    model: str
    epochs_done: float
    batch_size: int
    attained_s: float
    created_at: datetime
    updated_at: datetime
    waiting_reason: str | None = None
    """Set while a queued job cannot run now whatever the plan says: wider than all the ready
    nodes together, or its gang would put its tenant over ``max_gpus`` ("tenant at its GPU
    limit"). It stays PENDING and holds up no other job."""


class JobPublic(JobSummary):
    """A job in full: its summary's fields and the heavy ones."""

    batch_sizes: list[int]
    throughput: dict[str, float]
    type_throughput: dict[str, dict[str, float]] = {}
    measured_epoch_seconds: dict[str, float] = {}
    command: list[str] = []
    image: str | None = None
    env: dict[str, str] = {}


class EventPublic(BaseModel):
    id: int
    job_id: str
    seq: int | None
    kind: str
    payload: dict[str, Any]
    reason: str
    created_at: datetime


JobIdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[^\x00]+$")]
"""A job id as a path segment: bounded, and without NUL (which Postgres text refuses)."""

SafeText = Annotated[str, Field(max_length=128, pattern=r"^[^\x00]*$")]

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list; pass ``next_page_token`` back as ``page_token`` for the next one."""

    items: list[T]
    next_page_token: str | None = None


Seq = Annotated[
    int, Strict(), Field(ge=1, le=INT4_MAX, description="The client's per-job sequence number")
]
Positive = Annotated[int, Strict(), Field(ge=1, le=INT4_MAX)]


class ProgressEventCreate(BaseModel):
    """An epoch finished: ``epoch`` is the 1-based index of the finished epoch, ``samples`` the
    samples it processed, ``seconds`` the wall time it took at ``batch_size``."""

    model_config = ConfigDict(extra="forbid")

    seq: Seq
    kind: Literal["progress"]
    epoch: Positive
    samples: Annotated[int, Strict(), Field(ge=0, le=INT4_MAX)]
    seconds: Annotated[float, Strict(), Field(gt=0, le=1e9, allow_inf_nan=False)]
    batch_size: Positive


class ScalingEventCreate(BaseModel):
    """The job changed its batch size: it trains at ``batch_size`` from epoch ``epoch`` on
    (0 = from the start)."""

    model_config = ConfigDict(extra="forbid")

    seq: Seq
    kind: Literal["scaling"]
    batch_size: Positive
    epoch: Annotated[int, Strict(), Field(ge=0, le=INT4_MAX)]


EventCreate = Annotated[ProgressEventCreate | ScalingEventCreate, Field(discriminator="kind")]


class RegimePublic(BaseModel):
    """One regime of the predicted trajectory. ``phase``: past (observed), current, future
    (predicted). ``epoch_seconds_source``: measured from the job's events, declared in its
    throughput profile, or estimated (the latest measurement, else a default guess)."""

    batch_size: int
    epochs: float
    epoch_seconds: float
    phase: Literal["past", "current", "future"]
    epoch_seconds_source: Literal["measured", "declared", "estimated"]


class PredictionPublic(BaseModel):
    """ "Why am I waiting": the job's predicted regimes, remaining and total exclusive run time
    (seconds), its finish-time-fairness estimate rho_hat (> 1: on course to finish later than
    under an equal share) and the contention factor used, and the rounds the current plan gives
    it (``planned_rounds``, round indices) with the ``reason`` in words; on a cluster of several
    GPU types, ``planned_gpu_type``: the type the plan puts it on."""

    job_id: str
    state: JobState
    epochs: int
    epochs_done: float
    batch_size: int
    regimes: list[RegimePublic]
    remaining_seconds: float
    total_seconds: float
    attained_s: float
    age_s: float
    ftf_estimate: float
    contention: float
    planned_rounds: list[int]
    planned_gpu_type: str | None = None
    cause: Cause
    reason: str


class NodeSummary(BaseModel):
    """What every caller may see of a node."""

    id: str
    gpus: int
    state: NodeState


class NodePublic(NodeSummary):
    """A node as admins and agents see it."""

    hostname: str
    gpu_type: str
    last_heartbeat_at: datetime | None
    registered_at: datetime


class NodeApproval(BaseModel):
    """An operator's approval of a node's GPUs: at most ``gpus`` GPUs, of ``gpu_type`` (empty:
    any type). The node gets leases only once approved, never for more GPUs than approved."""

    model_config = ConfigDict(extra="forbid")

    gpus: Annotated[int, Strict(), Field(ge=1, le=1024)]
    gpu_type: Annotated[str, Field(max_length=64, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")] = ""


class NodeApprovalPublic(NodeApproval):
    """A node's approval as stored."""

    node: str
    approved_at: datetime


class ClusterPublic(BaseModel):
    """Capacity and load. ``total_gpus``: GPUs of all registered nodes; ``ready_gpus``: of the
    READY ones (a node's GPUs count as far as an operator approved them). ``nodes``: node
    counts by state (None for users). ``jobs``: job counts by state, of ``tenant`` only when
    it is set (a user sees its own tenant's jobs), else of everyone."""

    total_gpus: int
    ready_gpus: int
    nodes: dict[str, int] | None
    jobs: dict[str, int]
    tenant: str | None


class SchedulePublic(BaseModel):
    """The current round (index) and its plan; both None, with a ``reason``, before any round
    driver has run."""

    round: int | None
    plan: dict[str, Any] | None
    reason: str


MAX_TOKEN_LIFETIME_S = 10 * 366 * 86_400
"""The longest expiry a token may be given from now (ten years); none at all: no expiry."""
Lifetime = Annotated[int, Strict(), Field(ge=1, le=MAX_TOKEN_LIFETIME_S)]


class TokenScope(BaseModel):
    """What a token acts for: a user token's ``tenant``, an agent token's ``node``, a job
    token's ``job_id`` (an existing job); admin and metrics tokens take none."""

    model_config = ConfigDict(extra="forbid")

    tenant: Tenant | None = None
    node: NodeId | None = None
    job_id: Annotated[str | None, Field(min_length=1, max_length=36, pattern=r"^[0-9a-f-]+$")] = (
        None
    )


class TokenCreate(BaseModel):
    """A new token: its ``role``, the ``scope`` the role needs, a ``name`` to tell it apart,
    and optionally ``expires_in_s`` (seconds from now; omitted: it never expires)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["admin", "user", "agent", "job", "metrics"]
    scope: TokenScope = TokenScope()
    name: Annotated[str, Field(max_length=128, pattern=PRINTABLE)] = ""
    expires_in_s: Lifetime | None = None


class TokenExpiry(BaseModel):
    """A token's new expiry: ``expires_in_s`` seconds from now, or null for none."""

    model_config = ConfigDict(extra="forbid")

    expires_in_s: Lifetime | None


class TokenPublic(BaseModel):
    """A token as the list shows it: never its secret (only its hash is stored). ``state``:
    active, expired or revoked. ``last_used_at``: when a request last looked it up in the
    database (at most the token cache's lifetime, 10 s, behind its latest use)."""

    id: int
    role: str
    tenant: str | None
    node: str | None
    job_id: str | None
    name: str
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenPublic):
    """A token just made, with its secret ``token``: shown in this answer only."""

    token: str


class AttemptPublic(BaseModel):
    """One attempt to run a job (a lease): where and in which round, its state and exit
    code, why the round driver took it back (``reason``, empty if it did not) and the tail of
    its output as its agent last shipped it (``log_tail``, None before any)."""

    attempt_id: str
    node_id: str
    round_index: int
    gpus: list[int]
    state: str
    exit_code: int | None
    reason: str
    log_tail: str | None
    issued_at: datetime
    updated_at: datetime


class HeldPublic(BaseModel):
    """A job's GPUs in one round (``job_id`` and ``name`` null for another tenant's job)."""

    job_id: str | None
    name: str | None
    node_id: str
    gpus: list[int]
    state: str


class RoundPublic(BaseModel):
    index: int
    source: str
    started_at: datetime
    ends_at: datetime
    held: list[HeldPublic]


class PlannedRound(BaseModel):
    """A round of the freshest plan from the current one on: its index, expected start, and
    the caller's visible jobs in it."""

    index: int
    starts_at: datetime | None
    jobs: list[str]


class RoundsPublic(BaseModel):
    """The Gantt's data: the last rounds issued (who held which GPUs) and the rounds planned
    ahead; ``round_seconds``: the rounds' length; ``current``: the round now (-1 before any)."""

    current: int
    round_seconds: float
    recent: list[RoundPublic]
    planned: list[PlannedRound]


class QueueEntry(BaseModel):
    """One active job in the queue: its state, GPUs, finish-time-fairness estimate
    (``ftf_estimate``: > 1, on course to finish later than under an equal share), when it is
    predicted to start and finish (None when the plan does not say), and why it waits
    (``cause``, ``reason``)."""

    job_id: str
    name: str
    tenant: str
    state: JobState
    gpus: int
    batch_size: int
    epochs: int
    epochs_done: float
    ftf_estimate: float | None = Field(description="null when not finite")
    remaining_seconds: float | None = Field(description="null when not finite")
    predicted_start: datetime | None
    predicted_finish: datetime | None
    cause: Cause
    reason: str


class StreamEvent(BaseModel):
    """One event of ``GET /v1/events`` (the SSE ``data:`` line, JSON): a job's state change
    (``kind`` state: ``from`` and ``to``) or a preemption (``kind`` preemption), with its
    ``reason``; ``state``: the job's state when the event was sent. ``id`` is also the SSE
    event id: send it back as ``Last-Event-ID`` to resume."""

    model_config = ConfigDict(populate_by_name=True)

    id: int
    job_id: str
    name: str
    tenant: str
    kind: Literal["state", "preemption"]
    from_state: JobState | None = Field(default=None, alias="from")
    to: JobState | None = None
    state: JobState
    reason: str
    created_at: datetime
