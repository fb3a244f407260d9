"""Tables (SQLModel). The schema changes only through the Alembic migrations in migrations/.

- ``jobs``: one row per submitted job: its spec, tenant, state and observed progress (the
  state its client events are folded into, :mod:`shockwave.domain.observed`: ``epochs_done``,
  ``batch_size``, ``attained_s``, ``last_seq``, ``epoch_seconds`` (per batch size: total
  seconds, count), ``scalings`` (sorted ``[epoch, seq, batch size]``), and the means derived
  from them, ``measured_epoch_seconds``), and ``carried_s``: the seconds its earlier attempts
  trained since its last reported epoch (a program stopped mid-epoch resumes from there;
  :func:`store.jobs.bank_training`).
- ``job_events``: everything that happened to a job, in order: client events (epoch progress,
  batch-size scaling) carry the client's per-job sequence number, unique per job, so a
  duplicate or reordered post is harmless; state changes are server events with a reason.
- ``tokens``: bearer tokens, stored as SHA-256 hashes, with a role and its scope, an optional
  expiry, when it was revoked (kept, not deleted) and when it was last used.
- ``idempotency_keys``: the first response to each (token, key), replayed on retry; the
  unique constraint, not a read-then-write, makes concurrent retries safe.
- ``nodes``: GPU machines registered by their agents (READY, or LOST once heartbeats stop).
- ``node_approvals``: the GPUs an operator approved for a node (count, and type where set);
  a node gets leases only once approved, and never for more GPUs than approved.
- ``population_priors``: per cluster and tenant, what the tenant's jobs that succeeded teach
  the predictor (:mod:`shockwave.domain.population`), learnt as each one succeeds.
- ``tenants``: the configured tenants of the tree (shares and limits, :mod:`store.tenants`);
  ``tenant_changes``: every change to one, with its time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, Column, DateTime, Index, Text, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from shockwave.domain.lifecycle import LeaseState, NodeState

INT4_MAX = 2**31 - 1
"""The largest value of an integer column (Postgres ``integer``): ids, sequence numbers."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp on every database: stored in UTC, read back with UTC attached.

    Postgres keeps the zone itself; SQLite has no timestamp type and would hand back naive
    values, which are not RFC 3339 date-times.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _ts(**kwargs: Any) -> Any:
    return Field(default_factory=utcnow, sa_type=UTCDateTime, **kwargs)


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_tenant_created", "tenant", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=36)
    tenant: str = Field(index=True, max_length=64)
    name: str = Field(index=True, max_length=128)
    state: str = Field(index=True, max_length=16)
    gpus: int
    epochs: int
    samples_per_epoch: int
    initial_batch_size: int
    mode: str = Field(max_length=16)
    batch_sizes: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    throughput: dict[str, float] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )
    budget: float = 1.0
    model: str = Field(default="", max_length=128)
    type_throughput: dict[str, dict[str, float]] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    epochs_done: float = 0.0
    batch_size: int
    attained_s: float = 0.0
    carried_s: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})
    measured_epoch_seconds: dict[str, float] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    epoch_seconds: dict[str, list[float]] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    scalings: list[list[int]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default="[]")
    )
    last_seq: int = 0
    command: list[str] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default="[]")
    )
    image: str | None = Field(default=None, max_length=255)
    env: dict[str, str] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    elastic: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    priority: str | None = Field(default=None, max_length=32)
    submitted_by: str = Field(default="", max_length=64, sa_column_kwargs={"server_default": ""})
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


class JobEventRow(SQLModel, table=True):
    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36, ondelete="CASCADE")
    seq: int | None = None
    kind: str = Field(max_length=16)
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    reason: str = Field(default="", max_length=256)
    created_at: datetime = _ts()


class TokenRow(SQLModel, table=True):
    __tablename__ = "tokens"

    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(unique=True, max_length=64)
    role: str = Field(max_length=16)
    tenant: str | None = Field(default=None, max_length=64)
    node: str | None = Field(default=None, max_length=128)
    job_id: str | None = Field(default=None, max_length=36)
    attempt_id: str | None = Field(default=None, index=True, max_length=36)
    name: str = Field(default="", max_length=128)
    created_at: datetime = _ts()
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class IdempotencyRow(SQLModel, table=True):
    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("principal", "key", name="uq_idempotency_principal_key"),)

    id: int | None = Field(default=None, primary_key=True)
    principal: str = Field(max_length=64)
    key: str = Field(max_length=255)
    request_hash: str = Field(max_length=64)
    status_code: int | None = None
    response: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    location: str | None = Field(default=None, max_length=512)
    created_at: datetime = _ts()


class NodeRow(SQLModel, table=True):
    """A GPU machine. ``state``: READY (heartbeating) or LOST (heartbeats stopped for the TTL);
    ``last_heartbeat_at`` is None until the agent's first heartbeat."""

    __tablename__ = "nodes"
    __table_args__ = (
        CheckConstraint("gpus >= 1 AND gpus <= 1024", name="ck_nodes_gpus"),
        CheckConstraint(
            f"state IN ({', '.join(repr(s.value) for s in NodeState)})", name="ck_nodes_state"
        ),
    )

    id: str = Field(primary_key=True, max_length=128)
    hostname: str = Field(max_length=255)
    gpus: int
    gpu_type: str = Field(default="", max_length=64)
    state: str = Field(default=NodeState.READY.value, max_length=16)
    last_heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    registered_at: datetime = _ts()


class ClusterRow(SQLModel, table=True):
    """The one scheduled cluster (id "default"): its policy, round length and where it stands.

    ``state_version`` is bumped by every change a plan depends on (a job arrives or finishes,
    a scaling event, a node joins or is lost); a plan made at an older version is stale.
    ``policy_state`` is the policy's memory between solves (shockwave.domain.state_codec JSON).
    ``current_round`` is the round whose leases are out, -1 before the first.
    """

    __tablename__ = "clusters"

    id: str = Field(primary_key=True, max_length=64)
    policy: str = Field(default="shockwave", max_length=64)
    replan: str = Field(default="reactive", max_length=16)
    round_seconds: float = 120.0
    state_version: int = 0
    policy_state: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    current_round: int = -1
    round_started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    round_ends_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    updated_at: datetime = _ts()


class PlanRow(SQLModel, table=True):
    """A solved plan: ``rounds[t]`` are the job ids for round ``base_round + t``."""

    __tablename__ = "plans"
    __table_args__ = (
        UniqueConstraint("cluster_id", "state_version", "base_round", name="uq_plans_version"),
    )

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(foreign_key="clusters.id", index=True, max_length=64)
    state_version: int
    base_round: int
    policy: str = Field(max_length=64)
    rounds: list[list[str]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    types: dict[str, str] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    widths: dict[str, int] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    objective: float | None = None
    bound: float | None = None
    gain_gap: float | None = None
    status: str = Field(default="", max_length=32)
    solver: str = Field(default="", max_length=32)
    solve_seconds: float = 0.0
    created_at: datetime = _ts()


class RoundRow(SQLModel, table=True):
    """A round the driver issued. ``source``: plan (the freshest plan), previous_plan (its next
    column) or greedy (no plan at all): the fallbacks are counted from here. ``jobs``: the jobs
    placed, highest priority first. ``plan_age_s``: how old the plan was at the boundary (None
    for greedy). ``leases_*``: what the boundary did to leases (issued new attempts, extended
    continuing ones, revoked the rest)."""

    __tablename__ = "rounds"

    cluster_id: str = Field(foreign_key="clusters.id", primary_key=True, max_length=64)
    index: int = Field(primary_key=True)
    plan_id: int | None = Field(default=None, foreign_key="plans.id")
    source: str = Field(max_length=16)
    jobs: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    started_at: datetime = _ts()
    ends_at: datetime = _ts()
    plan_age_s: float | None = None
    leases_issued: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    leases_extended: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    leases_revoked: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class LeaseRow(SQLModel, table=True):
    """One attempt to run a job on a node's GPUs for a round (the id is the attempt id).

    ``state``: ISSUED -> STARTED -> RUNNING -> CHECKPOINTED | EXITED, or REVOKED (the driver
    took it back) / LOST (the node stopped heartbeating). ``gpus`` are local GPU indices.
    ``began_at``: when the attempt's time counts from (the round's boundary for a lease issued
    just ahead of it, else ``issued_at``); ``first_ends_at``: the end of its first lease
    (``ends_at`` moves when it is extended). Both null on rows from before migration 0014. They
    give the job's stints (:func:`store.snapshot.stints_of`).

    Indexes: a node's or a job's leases in some states are read through ``(node_id, state)``
    and ``(job_id, state)``, whose both columns narrow the read whether or not the table's
    statistics were gathered; ``state`` alone serves the reads of every live lease (the round
    driver's).
    """

    __tablename__ = "leases"
    __table_args__ = (
        Index("ix_leases_node_state", "node_id", "state"),
        Index("ix_leases_job_state", "job_id", "state"),
        Index("ix_leases_state", "state"),
    )

    id: str = Field(primary_key=True, max_length=36)
    job_id: str = Field(foreign_key="jobs.id", max_length=36, ondelete="CASCADE")
    node_id: str = Field(foreign_key="nodes.id", max_length=128)
    round_index: int = Field(index=True)
    gpus: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    state: str = Field(default=LeaseState.ISSUED.value, max_length=16)
    exit_code: int | None = None
    log_tail: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    reason: str = Field(default="", max_length=256, sa_column_kwargs={"server_default": ""})
    issued_at: datetime = _ts()
    ends_at: datetime = _ts()
    updated_at: datetime = _ts()
    began_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    first_ends_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class NodeApprovalRow(SQLModel, table=True):
    """What an operator approved for node ``node_id``: at most ``gpus`` GPUs, of ``gpu_type``
    (empty: any type). Kept apart from ``nodes`` so that a node can be approved before its
    agent first registers (enrollment)."""

    __tablename__ = "node_approvals"
    __table_args__ = (CheckConstraint("gpus >= 1 AND gpus <= 1024", name="ck_node_approvals_gpus"),)

    node_id: str = Field(primary_key=True, max_length=128)
    gpus: int
    gpu_type: str = Field(default="", max_length=64)
    approved_at: datetime = _ts()


class PopulationRow(SQLModel, table=True):
    """A tenant's population prior on a cluster
    (:meth:`shockwave.domain.population.PopulationPrior.as_json`), learnt from ``learnt`` of the
    tenant's jobs that succeeded; updated in the transaction that ends each."""

    __tablename__ = "population_priors"

    cluster_id: str = Field(foreign_key="clusters.id", primary_key=True, max_length=64)
    tenant: str = Field(primary_key=True, max_length=64)
    prior: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    learnt: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    updated_at: datetime = _ts()


class TenantRow(SQLModel, table=True):
    """A configured tenant: its ``path`` in the tree (``org/team``), its ``parent`` (the path
    without its last segment, None at the top), its ``weight`` among its siblings and its
    limits (None: none). ``version`` counts its changes (each one is a ``tenant_changes`` row).
    A tenant without a row has weight 1 and no limits."""

    __tablename__ = "tenants"
    __table_args__ = (
        CheckConstraint("weight > 0", name="ck_tenants_weight"),
        CheckConstraint("guaranteed_gpus >= 0", name="ck_tenants_guaranteed"),
        CheckConstraint("max_gpus >= 0", name="ck_tenants_max_gpus"),
        CheckConstraint("max_jobs >= 0", name="ck_tenants_max_jobs"),
    )

    path: str = Field(primary_key=True, max_length=64)
    parent: str | None = Field(default=None, index=True, max_length=64)
    weight: float = 1.0
    guaranteed_gpus: int | None = None
    max_gpus: int | None = None
    max_jobs: int | None = None
    version: int = 1
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


class TenantChangeRow(SQLModel, table=True):
    """One change to a tenant: its settings after the change, who made it and when."""

    __tablename__ = "tenant_changes"
    __table_args__ = (Index("ix_tenant_changes_path", "path", "changed_at"),)

    id: int | None = Field(default=None, primary_key=True)
    path: str = Field(max_length=64)
    version: int
    weight: float
    guaranteed_gpus: int | None = None
    max_gpus: int | None = None
    max_jobs: int | None = None
    changed_by: str = Field(default="", max_length=64)
    changed_at: datetime = _ts()
