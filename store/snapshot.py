"""The core's :class:`~shockwave.domain.snapshot.Snapshot` of a cluster, read from the database.

What the snapshot for planning round ``r`` holds, and where it comes from:

- ``jobs``: the admitted, unfinished jobs (PENDING, RUNNING, SUSPENDED) in arrival order, each
  with its spec and the progress its client events show (:func:`store.events.active_job`, the
  same view the prediction endpoint uses). ``spec.arrival_s`` and ``now`` are seconds since the
  Unix epoch, so ages and deadlines are real wall-clock spans. The progress is the state every
  recorded event was folded into on the job's row (:mod:`shockwave.domain.observed`); no event is
  read, so the snapshot grows with the cluster's size, not with its history.
- ``progress.epochs_done``: its reported epochs plus the part of the next one it has trained
  since: what its earlier attempts trained after that report (``carried_s``, banked when an
  attempt stopped: a program stopped mid-epoch resumes from its checkpoint) and, for a RUNNING
  job that holds GPUs, the time since its row last changed (its last event, or its start), at
  its epoch time (:meth:`shockwave.domain.snapshot.ActiveJob.trained_for`): the simulator's policy
  sees fractional progress, and whole epochs alone hide up to an epoch of a job.
- ``progress.stints``: its stints on GPUs from its leases (:func:`stints_of`), the service it
  held, which Gavel-style policies rank by (reports lag; leases do not).
- ``progress.gpus``: for a RUNNING job, the global indices of the GPUs its live lease of round
  ``r - 1`` (the round now out) holds; empty otherwise, so the policy sees it as not running.
- ``cluster``: the READY nodes in id order, each with its real GPU count (the core's
  :class:`~shockwave.domain.model.Cluster` is a list of node sizes): global GPUs are numbered node
  after node, so node ``n``'s local GPU ``i`` is global GPU ``cluster.first_gpu(n) + i``
  (:class:`GpuLayout` converts both ways).
- ``round_seconds`` and ``policy_state`` (decoded with :mod:`shockwave.domain.state_codec`) come
  from the cluster's row; ``round_start_s``, when the planned round starts, is the row's
  ``round_ends_at`` (the end of the round out) for the next round.
- ``tenants``: the configured tenants (:mod:`store.tenants`; one without a row has weight 1
  and no limits) and ``priority_classes``, the setting every process shares: the market by
  tenant (:mod:`shockwave.domain.tenancy`) plans with them.
- ``priors`` / ``prior_groups``: each tenant's prior, learnt from its jobs that succeeded
  (:mod:`store.population`), and each job's tenant; with the measured epoch times of the
  tenant's active jobs it is all the predictor knows beyond each job itself (no tenant's jobs
  learn from another's reports).
- ``cluster``: only approved nodes count (``node_approvals``), each with no more GPUs than
  approved.

With no READY node there is nothing to plan on (a cluster of zero nodes cannot be built):
:func:`load_snapshot` raises :class:`NoCapacity`, and callers skip planning until a node
registers (which bumps the cluster's state version and so asks for a plan).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Integer, case, func, true
from sqlalchemy import cast as cast_
from sqlalchemy import select as sa_select
from sqlalchemy.orm import QueryableAttribute, defer, load_only
from sqlmodel import Session, col, select

from shockwave.domain import state_codec
from shockwave.domain.lifecycle import ACTIVE, LIVE_LEASES, JobState, LeaseState, NodeState
from shockwave.domain.model import Cluster, JobSpec, ValidationError
from shockwave.domain.snapshot import ActiveJob, Snapshot
from shockwave.domain.stints import Stint
from shockwave.domain.tenancy import AT_LIMIT, TenantUsage
from shockwave.rounds.engine import unfit_for
from store import events, population, tenants
from store.db import among, one_statement
from store.jobs import trained_since_change
from store.tables import ClusterRow, JobRow, LeaseRow, NodeApprovalRow, NodeRow

log = logging.getLogger(__name__)

WITHOUT_POLICY_STATE = (defer(cast("QueryableAttribute[Any]", ClusterRow.policy_state)),)
"""Load options for a cluster row read for its round, version or settings only: the policy's
memory is a JSON document of hundreds of kB at 900 jobs, not worth parsing for those."""


class UnknownCluster(LookupError):
    """No cluster row with this id."""

    def __init__(self, cluster_id: str) -> None:
        super().__init__(f"no cluster {cluster_id!r}")
        self.cluster_id = cluster_id


class NoCapacity(RuntimeError):
    """The cluster has no READY node, so there is nothing to plan on."""

    def __init__(self, cluster_id: str) -> None:
        super().__init__(f"cluster {cluster_id!r} has no READY node")
        self.cluster_id = cluster_id


@dataclasses.dataclass(frozen=True, slots=True)
class GpuLayout:
    """The READY nodes in id order, each one's GPU count and GPU type: the core's inventory.

    The cluster is typed (:mod:`shockwave.market.heterogeneity`: each gang on one type) when the
    nodes report two or more GPU types (the agents' ``gpu_type``, lower-cased); with one type
    it is the untyped cluster, so a homogeneous service plans exactly as before."""

    node_ids: tuple[str, ...]
    node_gpus: tuple[int, ...]
    node_types: tuple[str, ...] = ()
    _cluster: Cluster = dataclasses.field(init=False, repr=False, compare=False)
    _index: Mapping[str, int] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # built once: a boundary converts every live lease, and a cluster of 1,024 nodes
        # costs milliseconds to build
        kinds = tuple(gpu_kind(t) for t in self.node_types)
        typed = len(set(kinds)) > 1 and len(kinds) == len(self.node_gpus)
        cluster = Cluster(self.node_gpus, kinds) if typed else Cluster(self.node_gpus)
        object.__setattr__(self, "_cluster", cluster)
        object.__setattr__(self, "_index", {node: n for n, node in enumerate(self.node_ids)})

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    def global_gpus(self, node_id: str, local: Sequence[int]) -> tuple[int, ...]:
        """Global indices of ``local`` GPUs of ``node_id``; () if the node is not READY, and
        without local indices the node does not have."""
        n = self._index.get(node_id)
        if n is None:
            return ()
        base = self._cluster.first_gpu(n)
        return tuple(base + g for g in sorted(local) if 0 <= g < self.node_gpus[n])

    def by_node(self, gpus: Sequence[int]) -> dict[str, list[int]]:
        """Global GPU indices grouped into local indices per node id."""
        cluster = self.cluster
        grouped: dict[str, list[int]] = {}
        for g in sorted(gpus):
            n = cluster.node_of(g)
            grouped.setdefault(self.node_ids[n], []).append(g - cluster.first_gpu(n))
        return grouped


def gpu_kind(declared: str) -> str:
    """A node's GPU type as the core compares them: its agent's ``gpu_type`` lower-cased,
    "unknown" when empty."""
    return declared.strip().lower() or "unknown"


_WIDTH = case(
    (col(NodeApprovalRow.gpus) < col(NodeRow.gpus), col(NodeApprovalRow.gpus)),
    else_=col(NodeRow.gpus),
)
"""A READY node's GPUs as :class:`GpuLayout` counts them: what it reports, never more than
approved."""
_APPROVED = col(NodeApprovalRow.node_id) == col(NodeRow.id)
"""A node joined to its operator's approval (a node without one is never laid out)."""
_READY = col(NodeRow.state) == NodeState.READY
"""The nodes the layout counts: READY ones (with :data:`_APPROVED`)."""


def free_gpus(session: Session) -> int:
    """How many GPUs of the READY approved nodes no live lease holds and no revoked attempt
    still uses (the GPUs :func:`gpu_layout` lays out, less each lease's local indices the node
    has, each GPU counted once), in one aggregate read: a round driver asks it every change
    of the cluster, and reading the layout and every lease's row to find it cost tens of
    milliseconds at a thousand nodes."""
    ready = (
        sa_select(col(NodeRow.id).label("id"), _WIDTH.label("width"))
        .join(NodeApprovalRow, _APPROVED)
        .where(_READY)
        .subquery("ready")
    )
    elements = (
        func.json_array_elements_text
        if session.get_bind().dialect.name == "postgresql"
        else func.json_each
    )
    local = elements(col(LeaseRow.gpus)).table_valued("value").alias("gpu")
    gpu = cast_(local.c.value, Integer)
    used = (
        sa_select(col(LeaseRow.node_id), gpu.label("gpu"))
        .select_from(LeaseRow)
        .join(ready, ready.c.id == col(LeaseRow.node_id))
        .join(local, true())
        .where(
            col(LeaseRow.state).in_((*LIVE_LEASES, LeaseState.REVOKED)),
            gpu >= 0,
            gpu < ready.c.width,
        )
        .distinct()
        .subquery("used")
    )
    capacity = sa_select(func.coalesce(func.sum(ready.c.width), 0)).scalar_subquery()
    taken = sa_select(func.count()).select_from(used).scalar_subquery()
    return int(session.execute(sa_select(capacity - taken)).scalar_one())


def ready_gpus(session: Session) -> dict[str, int] | None:
    """The GPUs of the READY approved nodes by type, as :class:`GpuLayout`'s cluster counts
    them (``{"": n}`` when there is one type: the untyped cluster), or None when there is no
    such node: one aggregate, for a caller that needs the capacity and not the layout (a
    user's job list: reading a thousand nodes' rows there costs tens of milliseconds)."""
    rows = session.execute(
        sa_select(
            col(NodeRow.gpu_type),
            func.sum(_WIDTH),
        )
        .join(NodeApprovalRow, _APPROVED)
        .where(_READY)
        .group_by(col(NodeRow.gpu_type))
    ).all()
    if not rows:
        return None
    kinds: dict[str, int] = {}
    for declared, gpus in rows:
        kind = gpu_kind(declared or "")
        kinds[kind] = kinds.get(kind, 0) + int(gpus or 0)
    return kinds if len(kinds) > 1 else {"": sum(kinds.values())}


def load_snapshot(
    session: Session,
    cluster_id: str,
    round_index: int,
    now: datetime,
    priority_classes: Mapping[str, float] | None = None,
    known: KnownSpecs | None = None,
) -> tuple[Snapshot, int]:
    """The snapshot for planning round ``round_index`` at ``now`` (timezone-aware), and the
    cluster's state version it reflects (read first: the jobs read after it are at least that
    new). ``priority_classes``: the classes' multipliers (the processes' shared setting).
    ``known``: the specs a planner process kept from its earlier snapshots (the jobs' rows are
    then read for their state and observed columns only, and the specs of new jobs read and
    checked once); None reads every job's whole row. Raises :class:`UnknownCluster` or
    :class:`NoCapacity`."""
    cluster = session.get(ClusterRow, cluster_id, populate_existing=True)
    if cluster is None:
        raise UnknownCluster(cluster_id)
    version = cluster.state_version
    layout = gpu_layout(session)
    if layout is None:
        raise NoCapacity(cluster_id)
    rows = active_job_rows(session, observed_only=known is not None)
    held = _held_gpus(session, layout, round_index - 1, [r.id for r in rows if _running(r)])
    if known is not None:
        known.learn(session, [r.id for r in rows])
    jobs, excluded = active_jobs(rows, held, now, known)
    stints = stints_of(session, [job.job_id for job in jobs], now)
    jobs = tuple(
        dataclasses.replace(
            job, progress=dataclasses.replace(job.progress, stints=stints.get(job.job_id, ()))
        )
        for job in jobs
    )
    snapshot = Snapshot(
        now=now.timestamp(),
        round_index=round_index,
        round_seconds=cluster.round_seconds,
        cluster=layout.cluster,
        jobs=jobs,
        policy_state=decode_policy_state(cluster),
        excluded=excluded,
        round_start_s=_round_start(cluster, round_index),
        tenants=tenants.core_tenants(session),
        priority_classes=dict(priority_classes or {}),
        prior_groups={row.id: row.tenant for row in rows},
        priors=population.load_priors(session, {row.tenant for row in rows}, cluster_id),
    )
    return snapshot, version


def stints_of(
    session: Session, job_ids: Sequence[str], now: datetime
) -> dict[str, tuple[Stint, ...]]:
    """Each job's stints on GPUs from its leases (one per attempt: a gang's rows on several
    nodes are one stint), in the order they began. A stint counts from the lease's
    ``began_at`` (its round's boundary, or its issue for a fill) and ends: for a live lease, at
    its ``ends_at``, the start of the round being planned (it holds its GPUs to then, as the
    simulator's stint runs to the boundary); for one revoked and still checkpointing, at its
    ``ends_at`` or ``now``, whichever is first; for one confirmed stopped or lost, at its
    ``ends_at`` or its last change, whichever is first (a program revoked at a boundary trains
    to it and confirms after it). Rows from before migration 0014 count from ``issued_at``
    with ``ends_at`` as their first lease's end."""
    if not job_ids:
        return {}
    rows = session.execute(
        sa_select(
            col(LeaseRow.job_id),
            col(LeaseRow.issued_at),
            col(LeaseRow.began_at),
            col(LeaseRow.first_ends_at),
            col(LeaseRow.ends_at),
            col(LeaseRow.updated_at),
            col(LeaseRow.state),
        ).where(among(col(LeaseRow.job_id), job_ids, session))
    ).all()
    spans: dict[str, dict[datetime, Stint]] = {}
    for job_id, issued, began, first_end, ends, updated, state in rows:
        end = held_until(state, ends, updated, now)
        start = (began or issued).timestamp()
        stint = Stint(start, (first_end or ends).timestamp(), max(start, end.timestamp()))
        known = spans.setdefault(job_id, {}).get(issued)
        if known is None or stint.end_s > known.end_s:
            spans[job_id][issued] = stint
    return {
        job_id: tuple(sorted(by_issue.values(), key=lambda s: s.began_s))
        for job_id, by_issue in spans.items()
    }


LIVE_STATES = frozenset(state.value for state in LIVE_LEASES)


def held_until(
    state: str, ends: datetime, updated: datetime, now: datetime, *, live_to_end: bool = True
) -> datetime:
    """When a lease row stops holding its GPUs (the rule :func:`stints_of` states): a live
    lease at its ``ends_at`` (``live_to_end=False``: at ``now``, for what was held so far,
    as usage counts it); a revoked one still checkpointing at its ``ends_at`` or ``now``,
    whichever is first; one confirmed stopped or lost at its ``ends_at`` or its last change,
    whichever is first."""
    if state in LIVE_STATES:
        return ends if live_to_end else min(ends, now)
    if state == LeaseState.REVOKED.value:
        return min(ends, now)
    return min(ends, updated)


def _round_start(cluster: ClusterRow, round_index: int) -> float | None:
    """When round ``round_index`` starts: the end of the round out, where it is the next one
    (plans are made ahead of their round); None otherwise (the policy then takes ``now``)."""
    if round_index != cluster.current_round + 1 or cluster.round_ends_at is None:
        return None
    return cluster.round_ends_at.timestamp()


@dataclasses.dataclass
class KnownSpecs:
    """Each active job's spec (:class:`~shockwave.domain.model.JobSpec`, fixed at submission),
    or why the model refuses it, by job id: kept by a planner process from one snapshot to the
    next, so that a job's spec is read and checked once, not every plan (at 10,000 jobs that
    was most of a snapshot's seconds). Only the jobs of the latest snapshot are kept."""

    specs: dict[str, JobSpec | str] = dataclasses.field(default_factory=dict)

    def learn(self, session: Session, job_ids: Sequence[str]) -> None:
        """Read and check the specs of ``job_ids`` not known yet; forget the others."""
        wanted = set(job_ids)
        self.specs = {j: spec for j, spec in self.specs.items() if j in wanted}
        unknown = [j for j in job_ids if j not in self.specs]
        size = len(unknown) if one_statement(session) else SPEC_CHUNK
        for start in range(0, len(unknown), max(1, size)):
            chunk = unknown[start : start + size]
            query = select(JobRow).where(among(col(JobRow.id), chunk, session))
            for row in session.exec(query.execution_options(populate_existing=True)).all():
                try:
                    self.specs[row.id] = events.spec_of_row(row)
                except ValidationError as error:
                    self.specs[row.id] = f"{REFUSED_SPEC}: {error}"


SPEC_CHUNK = 1000
REFUSED_SPEC = "its stored spec is refused by the model"
OBSERVED_COLUMNS = (
    JobRow.id,
    JobRow.state,
    JobRow.tenant,
    JobRow.created_at,
    JobRow.updated_at,
    JobRow.carried_s,
    JobRow.initial_batch_size,
    JobRow.epochs_done,
    JobRow.attained_s,
    JobRow.epoch_seconds,
    JobRow.scalings,
    JobRow.last_seq,
)
"""What a snapshot reads of a job whose spec it knows: its state, tenant and arrival, and the
observed state its events were folded into (:func:`store.events.observed_of`)."""


def active_jobs(
    rows: Sequence[JobRow],
    held: Mapping[str, tuple[int, ...]],
    now: datetime | None = None,
    known: KnownSpecs | None = None,
) -> tuple[tuple[ActiveJob, ...], dict[str, str]]:
    """The core's jobs of ``rows`` (holding the ``held`` GPUs), and the rows that are no job of
    the model any more, with why: a row stored before a bound of the model existed (such as the
    physical bounds on throughputs and sizes) must not stop the planning of everyone else.

    ``now``: a job is seen as it stands then (:meth:`ActiveJob.trained_for` its carried
    training and, running, the time since its row last changed: its last folded event, or its
    start), not only up to the last epoch it reported; None: as reported. ``known``: each
    job's spec (:class:`KnownSpecs`, which has learnt every row's job), not read from ``rows``."""
    jobs: list[ActiveJob] = []
    excluded: dict[str, str] = {}
    for row in rows:
        try:
            gpus = tuple(sorted(held.get(row.id, ())))
            if known is None:
                job = events.active_job(row, gpus)
            else:
                spec = known.specs[row.id]
                if isinstance(spec, str):
                    excluded[row.id] = spec
                    continue
                job = ActiveJob(spec=spec, progress=events.observed_of(row).progress(gpus))
            if now is not None:
                job = job.trained_for(trained_since_change(row, now), carried_s=row.carried_s)
            jobs.append(job)
        except ValidationError as error:
            excluded[row.id] = f"{REFUSED_SPEC}: {error}"
    return tuple(jobs), excluded


def gpu_layout(session: Session) -> GpuLayout | None:
    """The READY nodes an operator approved, as the core sees them (each with its reported
    GPUs, never more than approved), or None when there is none."""
    nodes = session.execute(
        sa_select(col(NodeRow.id), _WIDTH, col(NodeRow.gpu_type))
        .join(NodeApprovalRow, _APPROVED)
        .where(_READY)
        .order_by(col(NodeRow.id))
    ).all()
    if not nodes:
        return None
    ids, widths, types = zip(*nodes, strict=True)
    return GpuLayout(tuple(ids), tuple(widths), tuple(types))


class Unread:
    """A value not read yet (the default of an argument whose None means "none")."""


UNREAD = Unread()


def waiting_reason(
    session: Session,
    row: JobRow,
    ready: Mapping[str, int] | None = None,
    usage: TenantHold | Unread | None = UNREAD,
) -> str | None:
    """Why a queued (PENDING or SUSPENDED) job cannot run now whatever the plan says, or None:
    wider than all the READY nodes together (:func:`shockwave.rounds.engine.unfit_reason`), or its
    gang would put its tenant (or one above it) over ``max_gpus``
    (:data:`shockwave.domain.tenancy.AT_LIMIT`, the round engine's rule). None too while no node is
    READY (nothing can run then, and the prediction says there is no plan yet). ``ready``,
    ``usage``: :func:`ready_gpus` and :func:`tenant_usage` when the caller already read them."""
    if row.state not in (JobState.PENDING.value, JobState.SUSPENDED.value):
        return None
    ready = ready or ready_gpus(session)
    if ready is None:
        return None
    unfit = unfit_for(row.gpus, ready)
    if unfit is not None:
        return unfit
    if isinstance(usage, Unread):
        usage = tenant_usage(session)
    return AT_LIMIT if at_limit(usage, row) else None


@dataclasses.dataclass(frozen=True, slots=True)
class TenantHold:
    """The GPUs the live leases hold per tenant (and every tenant above it) against the
    configured ``max_gpus`` (``usage``), and the jobs holding those leases (``holders``)."""

    usage: TenantUsage
    holders: frozenset[str]


def tenant_usage(session: Session) -> TenantHold | None:
    """What :func:`at_limit` checks against; None when no tenant has ``max_gpus``."""
    limits = tenants.core_tenants(session)
    if not any(t.max_gpus is not None for t in limits.values()):
        return None
    usage = TenantUsage(limits)
    rows = session.exec(
        select(JobRow.id, JobRow.tenant, LeaseRow.gpus)
        .join(LeaseRow, col(LeaseRow.job_id) == col(JobRow.id))
        .where(col(LeaseRow.state).in_(LIVE_LEASES))
    ).all()
    for _, tenant, gpus in rows:
        usage.add(tenant, len(gpus))
    return TenantHold(usage, frozenset(job_id for job_id, _, _ in rows))


def at_limit(hold: TenantHold | None, row: JobRow) -> bool:
    """Whether a queued job that holds no lease would put its tenant (or one above it) over
    ``max_gpus`` with its gang (``hold``: :func:`tenant_usage`), the round engine's rule."""
    if hold is None or row.state not in (JobState.PENDING.value, JobState.SUSPENDED.value):
        return False
    return row.id not in hold.holders and not hold.usage.fits(row.tenant, row.gpus)


def active_job_rows(session: Session, *, observed_only: bool = False) -> list[JobRow]:
    """Admitted, unfinished jobs in arrival order (ties by id). ``observed_only``: only their
    :data:`OBSERVED_COLUMNS` are loaded (the others load on first access, one row at a time)."""
    query = (
        select(JobRow)
        .where(col(JobRow.state).in_(ACTIVE))
        .order_by(col(JobRow.created_at), col(JobRow.id))
    )
    if observed_only:
        query = query.options(
            load_only(*(cast("QueryableAttribute[Any]", c) for c in OBSERVED_COLUMNS))
        )
    return list(session.exec(query).all())


def decode_policy_state(cluster: ClusterRow) -> object | None:
    """The policy's stored memory; None (a fresh start) when there is none or it is unreadable,
    which costs the policy its history but never blocks planning."""
    if cluster.policy_state is None:
        return None
    try:
        state: object = state_codec.decode(cluster.policy_state)
        return state
    except (state_codec.StateCodecError, TypeError, KeyError) as error:
        log.warning("cluster %s: discarding unreadable policy state: %s", cluster.id, error)
        return None


def _running(row: JobRow) -> bool:
    return row.state == JobState.RUNNING.value


def _held_gpus(
    session: Session, layout: GpuLayout, round_index: int, job_ids: Sequence[str]
) -> Mapping[str, tuple[int, ...]]:
    """The GPUs the live leases of ``round_index`` hold, for the jobs in ``job_ids``: all of
    that round's live leases are read (at most one per leased GPU) rather than naming every
    running job in the query."""
    if not job_ids or round_index < 0:
        return {}
    wanted = set(job_ids)
    leases = session.exec(
        select(LeaseRow.job_id, LeaseRow.node_id, LeaseRow.gpus).where(
            LeaseRow.round_index == round_index, col(LeaseRow.state).in_(LIVE_LEASES)
        )
    ).all()
    held: dict[str, tuple[int, ...]] = {}
    for job_id, node_id, gpus in leases:
        if job_id in wanted:
            held[job_id] = held.get(job_id, ()) + layout.global_gpus(node_id, gpus)
    return held


def _active_job(row: JobRow, gpus: tuple[int, ...]) -> ActiveJob:
    return events.active_job(row, tuple(sorted(gpus)))
