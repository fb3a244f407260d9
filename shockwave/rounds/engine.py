"""The round engine: from what is known at an instant, the leases to issue, extend and revoke.

One pure rule, called by the simulator and by the service's round driver alike, so what a
trace gets in simulation is what the service does with it. A shell gathers the inputs, calls
the engine, and applies the :class:`Change` values it returns (the service writes lease rows;
the simulator runs stretches of training).

Inputs (all values, no I/O):

- ``jobs``: the active jobs as :class:`Waiting` ``(job_id, gpus)`` pairs, **in arrival order**.
- ``plans``: the plans on hand, as :class:`Plan` (its base round, its columns of job ids, the
  cluster state version it was computed at, and ``usable_from``: when it came back, i.e. the
  time of the state it reflects plus its solve time). A plan is usable at ``now`` once
  ``usable_from <= now``.
- ``leases``: the live leases, job id -> global GPU indices (on ``cluster``'s numbering).
  A job holding GPUs off the inventory is given as holding nothing.
- ``cluster``: the node inventory (:class:`~shockwave.domain.model.Cluster`; nodes may differ in
  size).
- ``state_version``: the cluster's current state version (bumped by arrivals, finishes,
  batch-size changes, nodes coming and going), to tell a fresh plan from a previous one.

Two entry points:

:func:`boundary` (round ``r`` starts at ``now``) chooses the round's jobs and places them:

1. The column for ``r`` of the usable plan with the highest state version that covers ``r``
   (ties: the one that came back last): source ``plan`` when that version is the current one,
   ``previous_plan`` otherwise; no plan covers ``r``: the last column of the latest usable
   plan (:func:`latest_plan`, ``previous_plan``); no usable plan at all: source ``greedy``
   (first in, first out with backfill: arrival order, a narrower later job takes what a
   blocked wide one cannot). A
   fresh plan's first column is kept as the policy decided it; a later column or a previous
   plan's column is filled up with waiting jobs, those holding a lease first, then arrival
   order (the policy filled only its first column, and a stale column names jobs that have
   gone; a running job not named is the filler the last fresh decision chose).
2. Jobs wider than the whole inventory cannot run: they are left out and listed in
   ``unfit`` with the reason, and never hold up anyone else.
3. Placement (:func:`shockwave.rounds.placement.place`): a continuing job keeps its GPUs where it
   can, new gangs go best fit on nodes of any size, so no GPU idles because a node is larger than
   another. With ``conserve`` (the simulator's default and the service), GPUs the column
   leaves free then go to waiting jobs that fit, as :func:`fill` gives them.
4. The changes: ``extend`` for a job placed on exactly the GPUs it holds, ``revoke`` then
   ``issue`` for a job placed elsewhere, ``issue`` for a job placed anew, ``revoke`` for every
   other live lease; ``suspend`` for a job the shell reports still running with no lease since
   before round ``r - 1`` (``unconfirmed``: its revoked attempt never confirmed a checkpoint).

:func:`fill` (mid-round, work conservation): GPUs no live lease holds go at once to waiting jobs
that fit them, in the order of ``prefer`` (the jobs the plan wants next), then arrival order,
each with an ``issue`` lease to the next boundary; no running job is moved. A shell calls it
when a GPU frees up (a job finished, failed or was cancelled), when a node joins and when a job
arrives.

Every change carries a ``reason`` in words, for logs, the rounds table and ``GET /v1/jobs``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from shockwave.domain.model import Cluster
from shockwave.domain.tenancy import Tenant, has_limits, limit_column, within_caps
from shockwave.domain.waiting import short_of_gpus
from shockwave.rounds.placement import place, place_into

SOURCES = ("plan", "previous_plan", "greedy")
"""Where a boundary's jobs came from; a fill's source is ``fill``."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """An active job as the engine sees it: its id, gang width and tenant's path."""

    job_id: str
    gpus: int
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's plan as it came back from a solve.

    ``rounds[t]``: job ids of round ``base_round + t``, highest priority first.
    ``state_version``: the cluster state it was computed for. ``usable_from``: when it became
    available (computed-at time plus solve time). ``plan_id``: the shell's handle (a row id).
    ``types``: on a typed cluster, the GPU type the policy planned each job on (placement keeps
    the gang there when it has room; :mod:`shockwave.rounds.typed_placement`).
    """

    base_round: int
    rounds: tuple[tuple[str, ...], ...]
    state_version: int
    usable_from: float
    plan_id: object = None
    types: Mapping[str, str] = field(default_factory=dict)

    def covers(self, r: int) -> bool:
        return self.base_round <= r < self.base_round + len(self.rounds)


class ChangeKind(StrEnum):
    ISSUE = "issue"
    EXTEND = "extend"
    REVOKE = "revoke"
    SUSPEND = "suspend"


@dataclass(frozen=True, slots=True)
class Change:
    """One change to apply: ``gpus`` is the new lease's global GPUs (issue), the kept ones
    (extend), the released ones (revoke), or () (suspend)."""

    kind: ChangeKind
    job_id: str
    gpus: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class RoundChanges:
    """What the engine decided at one instant.

    ``source``: ``plan``, ``previous_plan``, ``greedy`` or ``fill``. ``plan``: the plan used
    (None for greedy and fills). ``assignment``: job id -> GPUs of every job that holds a lease
    after the changes are applied and that the engine placed now (priority order). ``changes``:
    revokes first, then extends, issues and suspends. ``unfit``: job id -> why it can never run
    on this inventory. ``waiting``: job id -> why an active job got no GPUs now.
    """

    source: str
    plan: Plan | None
    assignment: Mapping[str, tuple[int, ...]]
    changes: tuple[Change, ...]
    unfit: Mapping[str, str] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)

    def count(self, kind: ChangeKind) -> int:
        return sum(1 for c in self.changes if c.kind is kind)

    @property
    def issued(self) -> dict[str, tuple[int, ...]]:
        return {c.job_id: c.gpus for c in self.changes if c.kind is ChangeKind.ISSUE}


def unfit_reason(width: int, cluster: Cluster) -> str | None:
    """Why a gang of ``width`` GPUs cannot run on ``cluster`` (the READY nodes), or None when
    it can: the capacity rule of "why am I waiting"
    (:func:`shockwave.domain.waiting.short_of_gpus`), so the round's reason and the job's
    answer are one text."""
    return unfit_for(width, _ready_gpus(cluster))


def _ready_gpus(cluster: Cluster) -> dict[str, int]:
    """The READY GPUs by type (``{"": n}`` for an untyped cluster)."""
    kinds = cluster.gpu_types or ("",)
    return {kind: cluster.gpus_of_type(kind) if kind else cluster.total_gpus for kind in kinds}


def unfit_for(width: int, ready: Mapping[str, int]) -> str | None:
    """:func:`unfit_reason` from the READY GPUs by type (``{"": n}`` for an untyped cluster),
    for a caller that counted them without building the cluster."""
    short = short_of_gpus(width, ready)
    return None if short is None else short.reason


def choose_plan(plans: Iterable[Plan], r: int, now: float) -> Plan | None:
    """The usable plan covering round ``r`` with the highest state version (then the latest)."""
    usable = [p for p in plans if p.covers(r) and p.usable_from <= now]
    return max(usable, key=lambda p: (p.state_version, p.usable_from), default=None)


def latest_plan(plans: Iterable[Plan], r: int, now: float) -> Plan | None:
    """Where no usable plan covers round ``r``: the usable plan made at the highest state
    version (then the latest) whose rounds all lie before ``r``, or None. Its last column
    is the policy's latest decision; a policy that plans one round at a time (Gavel) has
    only that one, and a boundary whose next plan is late repeats it (``previous_plan``,
    filled up) rather than going first in, first out, which preempted most of the running
    jobs for a round and put them back at the next."""
    past = [
        p for p in plans if p.rounds and p.base_round + len(p.rounds) <= r and p.usable_from <= now
    ]
    return max(past, key=lambda p: (p.state_version, p.usable_from), default=None)


def next_column(plan: Plan | None, r: int) -> tuple[str, ...]:
    """The jobs ``plan`` wants in round ``r + 1`` (a fill's preferred order; filled now, they
    keep their GPUs at the boundary), or () when it has no such column."""
    if plan is None or not plan.covers(r + 1):
        return ()
    return plan.rounds[r + 1 - plan.base_round]


def boundary(
    *,
    r: int,
    now: float,
    state_version: int,
    jobs: Sequence[Waiting],
    plans: Iterable[Plan],
    leases: Mapping[str, tuple[int, ...]],
    cluster: Cluster | None,
    unconfirmed: Iterable[str] = (),
    conserve: bool = False,
    settling: Collection[str] = frozenset(),
    tenants: Mapping[str, Tenant] | None = None,
) -> RoundChanges:
    """Round ``r``'s changes at ``now`` (module docstring, steps 1-4). ``cluster`` None: no
    ready node, so every live lease is revoked and nothing runs. ``conserve``: GPUs the
    round's column leaves free go to waiting jobs as a :func:`fill` would give them (the
    plan's next column first, then arrival order; a job holding a lease on free GPUs keeps
    them, and neither a job holding GPUs elsewhere nor one in ``settling`` starts anew).
    ``settling``: jobs whose revoked attempt has not confirmed its end yet (still
    checkpointing): a new attempt now would run the job in two places. ``tenants``: the
    configured tenants by path; where any has ``max_gpus`` or ``guaranteed_gpus``, the column
    is put within them before placement (:func:`shockwave.domain.tenancy.limit_column`: a tenant
    short of its guarantee gets its jobs first, none goes over its cap) and so are the jobs
    work conservation adds; a job kept out waits with the reason
    :data:`~shockwave.domain.tenancy.AT_LIMIT`."""
    width = {j.job_id: j.gpus for j in jobs}
    limits = tenants if tenants and has_limits(tenants) else None
    tenant_of = {j.job_id: j.tenant for j in jobs}
    capped: dict[str, str] = {}
    unfit = _unfit(jobs, cluster)
    fits = [j for j in jobs if j.job_id not in unfit]
    plan = choose_plan(plans, r, now) or latest_plan(plans, r, now)
    # the plan's column for r, or its last one where it ends before r (latest_plan)
    index = min(r - plan.base_round, len(plan.rounds) - 1) if plan is not None else 0
    if cluster is None:
        source, column = "greedy", []
    elif plan is None:
        source, column = "greedy", _greedy(fits, cluster.total_gpus)
    else:
        column = [j for j in dict.fromkeys(plan.rounds[index]) if j in width]
        column = [j for j in column if j not in unfit]
        fresh = plan.state_version == state_version and plan.covers(r)
        source = "plan" if fresh else "previous_plan"
        if r > plan.base_round or not fresh:
            column = _fill_column(column, fits, cluster.total_gpus, width, leases)
    if limits is not None and cluster is not None:
        column, capped = limit_column(
            column, [j.job_id for j in fits], width, tenant_of, limits, cluster.total_gpus
        )
    assignment: Mapping[str, tuple[int, ...]] = {}
    extra: dict[str, tuple[int, ...]] = {}
    if cluster is not None:
        types = plan.types if plan is not None else {}
        placed = place(cluster, [(j, width[j]) for j in column], leases, types)
        assignment = placed.assignment
        if conserve:
            busy = [g for gpus in assignment.values() for g in gpus]
            rest = [(j, width[j]) for j in next_column(plan, r) if j in width]
            rest += [(j.job_id, j.gpus) for j in fits]
            rest = [
                q for q in dict(rest).items() if q[0] not in assignment and q[0] not in settling
            ]
            if limits is not None:
                holding = {j: len(g) for j, g in assignment.items()}
                allowed, refused = within_caps(
                    [q[0] for q in rest], holding, width, tenant_of, limits
                )
                capped.update(refused)
                rest = [(j, width[j]) for j in allowed]
            extra = _conserve(cluster, rest, leases, busy, types)
            assignment = {**assignment, **extra}
    why = _why(source, plan, index)
    revokes: list[Change] = []
    kept: list[Change] = []
    for job_id, gpus in assignment.items():
        held = leases.get(job_id)
        if held is not None and set(held) == set(gpus):
            kept.append(Change(ChangeKind.EXTEND, job_id, tuple(gpus), f"keeps its GPUs ({why})"))
            continue
        if held:
            revokes.append(Change(ChangeKind.REVOKE, job_id, tuple(held), f"moved ({why})"))
        runs = "work conservation: GPUs the round left free" if job_id in extra else why
        kept.append(Change(ChangeKind.ISSUE, job_id, tuple(gpus), f"runs in round {r} ({runs})"))
    for job_id, held in leases.items():
        if job_id not in assignment:
            reason = (
                "no ready node"
                if cluster is None
                else f"not in round {r} ({why})"
                if job_id in width
                else "no longer active"
            )
            revokes.append(Change(ChangeKind.REVOKE, job_id, tuple(held), reason))
    for job_id in unconfirmed:
        if job_id not in assignment:
            kept.append(
                Change(
                    ChangeKind.SUSPEND,
                    job_id,
                    (),
                    f"preempted before round {r}; its attempt never confirmed a checkpoint",
                )
            )
    waiting = {
        j.job_id: f"waits: {capped[j.job_id]}"
        if j.job_id in capped
        else f"waits: not in round {r} ({why})"
        for j in fits
        if j.job_id not in assignment
    }
    return RoundChanges(
        source=source,
        plan=plan,
        assignment=MappingProxyType(dict(assignment)),
        changes=(*revokes, *kept),
        unfit=MappingProxyType(unfit),
        waiting=MappingProxyType(waiting),
    )


def fill(
    *,
    jobs: Sequence[Waiting],
    leases: Mapping[str, tuple[int, ...]],
    cluster: Cluster | None,
    prefer: Sequence[str] = (),
    busy: Iterable[int] = (),
    settling: Collection[str] = frozenset(),
    types: Mapping[str, str] | None = None,
    tenants: Mapping[str, Tenant] | None = None,
) -> RoundChanges:
    """Mid-round: start waiting jobs on the GPUs no lease holds (module docstring). ``types``:
    on a typed cluster, the GPU type each job is planned on (the plan's). ``busy``:
    GPUs that are not free although no live lease holds them (a revoked attempt still
    checkpointing). ``settling``: jobs whose revoked attempt has not confirmed its end yet;
    they wait for it (a new attempt now would run the job in two places). ``tenants``: as in
    :func:`boundary`, no job starts that would put its tenant over its ``max_gpus``."""
    if cluster is None:
        return RoundChanges("fill", None, MappingProxyType({}), ())
    unfit = _unfit(jobs, cluster)
    width = {j.job_id: j.gpus for j in jobs}
    taken = {g for gpus in leases.values() for g in gpus} | set(busy)
    if len(taken) >= cluster.total_gpus:
        return RoundChanges("fill", None, MappingProxyType({}), (), MappingProxyType(unfit))
    order = [j for j in dict.fromkeys((*prefer, *width)) if j in width]
    candidates = [
        (j, width[j]) for j in order if j not in leases and j not in unfit and j not in settling
    ]
    capped: dict[str, str] = {}
    if tenants and has_limits(tenants):
        tenant_of = {j.job_id: j.tenant for j in jobs}
        holding = {j: len(g) for j, g in leases.items()}
        allowed, capped = within_caps(
            [c[0] for c in candidates], holding, width, tenant_of, tenants
        )
        candidates = [(j, width[j]) for j in allowed]
    if not candidates:
        return RoundChanges(
            "fill",
            None,
            MappingProxyType({}),
            (),
            MappingProxyType(unfit),
            MappingProxyType({j: f"waits: {why}" for j, why in capped.items()}),
        )
    placed = place_into(cluster, candidates, taken, types)
    free = cluster.total_gpus - len(taken)
    changes = tuple(
        Change(ChangeKind.ISSUE, job_id, gpus, f"work conservation: {free} GPUs were free")
        for job_id, gpus in placed.assignment.items()
    )
    return RoundChanges(
        source="fill",
        plan=None,
        assignment=placed.assignment,
        changes=changes,
        unfit=MappingProxyType(unfit),
        waiting=MappingProxyType(
            {j: f"waits: {why}" for j, why in {**placed.unplaced, **capped}.items()}
        ),
    )


def _conserve(
    cluster: Cluster,
    jobs: Sequence[tuple[str, int]],
    leases: Mapping[str, tuple[int, ...]],
    busy: list[int],
    types: Mapping[str, str] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Give the GPUs ``busy`` leaves free to ``jobs`` (priority order): a job that holds a lease
    on GPUs still free keeps them; the others are placed as a fill places them."""
    taken = set(busy)
    kept: dict[str, tuple[int, ...]] = {}
    free = cluster.total_gpus - len(taken)
    for job_id, gpus in jobs:
        held = leases.get(job_id)
        same_type = (
            not types
            or not cluster.is_typed
            or job_id not in types
            or {cluster.type_of(g) for g in held or ()} == {types[job_id]}
        )
        if (
            held
            and same_type
            and len(held) == gpus
            and gpus <= free
            and not taken.intersection(held)
        ):
            kept[job_id] = tuple(held)
            taken.update(held)
            free -= gpus
    rest = [q for q in jobs if q[0] not in kept and q[0] not in leases]
    return {**kept, **place_into(cluster, rest, taken, types).assignment}


def _unfit(jobs: Sequence[Waiting], cluster: Cluster | None) -> dict[str, str]:
    """Job id -> why it cannot run on ``cluster`` (:func:`unfit_reason`), for the jobs that
    cannot; the rule is asked once per width."""
    if cluster is None:
        return {}
    ready = _ready_gpus(cluster)
    by_width: dict[int, str | None] = {}
    unfit: dict[str, str] = {}
    for job in jobs:
        if job.gpus not in by_width:
            by_width[job.gpus] = unfit_for(job.gpus, ready)
        why = by_width[job.gpus]
        if why is not None:
            unfit[job.job_id] = why
    return unfit


def _greedy(jobs: Sequence[Waiting], total_gpus: int) -> list[str]:
    """First in, first out with backfill over ``jobs`` (arrival order)."""
    chosen: list[str] = []
    free = total_gpus
    for job in jobs:
        if job.gpus <= free:
            chosen.append(job.job_id)
            free -= job.gpus
    return chosen


def _fill_column(
    column: list[str],
    jobs: Sequence[Waiting],
    total_gpus: int,
    width: Mapping[str, int],
    leases: Mapping[str, tuple[int, ...]],
) -> list[str]:
    """``column`` plus waiting jobs that fit in the GPUs it leaves: first the jobs that hold a
    lease now, then the others, each in arrival order.

    The running ones go first because a policy fills the GPUs its plan leaves free itself
    (Shockwave: the jobs with the most work left), but only in the column it decides; a
    later column or a previous plan's names the planned jobs alone. Filled in arrival order,
    such a column preempted the policy's own fillers (the long jobs of a trace) for a round,
    until the next fresh plan put them back: two restarts each time. A job running now is
    the filler the last fresh decision chose; keeping it costs no restart."""
    free = total_gpus - sum(width[j] for j in column)
    filled = list(column)
    named = set(column)
    running = [j for j in jobs if leases.get(j.job_id)]
    for job in (*running, *(j for j in jobs if not leases.get(j.job_id))):
        if job.job_id not in named and job.gpus <= free:
            filled.append(job.job_id)
            named.add(job.job_id)
            free -= job.gpus
    return filled


def _why(source: str, plan: Plan | None, index: int) -> str:
    """The reason a change of the round cites: the plan and its column ``index``."""
    if source == "greedy" or plan is None:
        return "no plan covers it: first in, first out"
    label = "plan" if source == "plan" else "previous plan"
    ident = f" {plan.plan_id}" if plan.plan_id is not None else ""
    return f"{label}{ident}, column {index}"
