"""Accounting: GPU-hours, jobs, waits and finish-time fairness per tenant, user or job over a
window of time, as ``sacct``/``sreport`` give them.

- ``gpu_hours``: the GPUs each lease row held times the part of its span inside the window
  ``[since, until)``. A row's span runs from its ``began_at`` (``issued_at`` on rows from
  before it existed) to when it stopped holding its GPUs (:func:`store.snapshot.held_until`;
  a live lease counts up to ``now``). Every lease row of every job counts once, so the rows of
  a grouping sum to the GPU-hours the leases record in the window.
- ``jobs``: jobs submitted in the window; ``finished``: jobs that ended in it (succeeded,
  failed or cancelled: a job's last change is its end).
- ``mean_wait_s`` / ``max_wait_s``: over jobs submitted in the window that have started, the
  time from submission to their first lease.
- ``mean_ftf`` / ``max_ftf``: over jobs that succeeded in the window, finish-time fairness
  rho = JCT / (T_held x N): the job's time from submission to its end over the time it held
  GPUs (its run time when alone on its gang), times the contention it met (the mean, over its
  lifetime, of the GPUs requested by every job then queued or running per registered GPU, at
  least 1). Above 1: it finished later than under an equal share of the cluster.

A user sees its own tenant's rows only; an admin sees every tenant's (optionally one subtree).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sqlalchemy import ColumnElement, and_, or_
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import ACTIVE, JobState
from store.errors import InvalidInput, NotFound
from store.principals import Principal, Role
from store.snapshot import held_until, stints_of
from store.tables import JobRow, LeaseRow, NodeRow, TokenRow

MAX_WINDOW_DAYS = 366


class GroupBy(StrEnum):
    TENANT = "tenant"
    USER = "user"
    JOB = "job"


@dataclass
class UsageRow:
    """One group's figures over the window (see the module docstring). ``key``: the tenant's
    path, the submitting caller (``token:<id>``) or the job id; ``label``: the user's token
    name or the job's name (empty for a tenant)."""

    key: str
    tenant: str
    label: str = ""
    gpu_hours: float = 0.0
    jobs: int = 0
    finished: int = 0
    mean_wait_s: float | None = None
    max_wait_s: float | None = None
    mean_ftf: float | None = None
    max_ftf: float | None = None
    waits: list[float] = field(default_factory=list, repr=False)
    ftfs: list[float] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Turn the collected waits and FTFs into their mean and max."""
        if self.waits:
            self.mean_wait_s = sum(self.waits) / len(self.waits)
            self.max_wait_s = max(self.waits)
        if self.ftfs:
            self.mean_ftf = sum(self.ftfs) / len(self.ftfs)
            self.max_ftf = max(self.ftfs)


COLUMNS = (
    "key",
    "tenant",
    "label",
    "gpu_hours",
    "jobs",
    "finished",
    "mean_wait_s",
    "max_wait_s",
    "mean_ftf",
    "max_ftf",
)
"""The figures of a row, in the order CSV columns and tables show them."""


def usage(
    session: Session,
    principal: Principal,
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    group_by: GroupBy,
    tenant: str | None = None,
) -> list[UsageRow]:
    """The rows of ``group_by`` that used GPUs or had jobs in ``[since, until)``, by key.
    ``tenant``: only that tenant and those below it. :class:`InvalidInput` for an empty or
    too long window; :class:`NotFound` for a tenant the caller may not see."""
    if until <= since:
        raise InvalidInput("until must be after since", field="until")
    if (until - since).days > MAX_WINDOW_DAYS:
        raise InvalidInput(f"the window is at most {MAX_WINDOW_DAYS} days", field="since")
    scope = _scope(principal, tenant)
    rows: dict[str, UsageRow] = {}
    names = _user_names(session) if group_by is GroupBy.USER else {}

    def row_of(job: JobRow) -> UsageRow:
        key = {GroupBy.TENANT: job.tenant, GroupBy.USER: job.submitted_by, GroupBy.JOB: job.id}[
            group_by
        ]
        if key not in rows:
            label = {GroupBy.TENANT: "", GroupBy.USER: names.get(key, ""), GroupBy.JOB: job.name}
            rows[key] = UsageRow(key=key, tenant=job.tenant, label=label[group_by])
        return rows[key]

    jobs = _jobs_in_window(session, scope, since, until)
    for job_row, gpu_s in _gpu_seconds(session, scope, since, until, now):
        row_of(job_row).gpu_hours += gpu_s / 3600.0
    first_start = _first_starts(session, [j.id for j in jobs])
    ended = [j for j in jobs if _ended_in(j, since, until)]
    ftf = _ftfs(session, ended, now)
    for job in jobs:
        row = row_of(job)
        if since <= job.created_at < until:
            row.jobs += 1
            if job.id in first_start:
                row.waits.append(max(0.0, (first_start[job.id] - job.created_at).total_seconds()))
        if _ended_in(job, since, until):
            row.finished += 1
            if job.id in ftf:
                row.ftfs.append(ftf[job.id])
    for row in rows.values():
        row.close()
    return [rows[key] for key in sorted(rows)]


def _scope(principal: Principal, tenant: str | None) -> tuple[str, bool] | None:
    """The tenant subtree the caller reads, as (path, with descendants); None: all of them."""
    if principal.role is Role.USER and principal.tenant:
        if tenant is not None and tenant != principal.tenant:
            raise NotFound(f"no tenant {tenant}")
        return principal.tenant, False
    if principal.role is not Role.ADMIN:
        raise NotFound("no usage to show")
    return None if tenant is None else (tenant, True)


def _in_scope(scope: tuple[str, bool] | None) -> list[ColumnElement[bool]]:
    if scope is None:
        return []
    path, subtree = scope
    if not subtree:
        return [col(JobRow.tenant) == path]
    return [
        or_(
            col(JobRow.tenant) == path,
            col(JobRow.tenant).startswith(path + "/", autoescape=True),
        )
    ]


def _gpu_seconds(
    session: Session,
    scope: tuple[str, bool] | None,
    since: datetime,
    until: datetime,
    now: datetime,
) -> Iterable[tuple[JobRow, float]]:
    """Each lease row's GPU-seconds inside the window, with its job (rows that began before
    ``until`` and may have held GPUs after ``since``)."""
    query = (
        select(LeaseRow, JobRow)
        .join(JobRow, col(JobRow.id) == col(LeaseRow.job_id))
        .where(
            or_(col(LeaseRow.began_at) < until, col(LeaseRow.issued_at) < until),
            col(LeaseRow.ends_at) > since,
            *_in_scope(scope),
        )
    )
    for lease, job in session.exec(query).all():
        start = lease.began_at or lease.issued_at
        end = held_until(lease.state, lease.ends_at, lease.updated_at, now, live_to_end=False)
        overlap = (min(end, until) - max(start, since)).total_seconds()
        if overlap > 0:
            yield job, overlap * len(lease.gpus)


def _jobs_in_window(
    session: Session, scope: tuple[str, bool] | None, since: datetime, until: datetime
) -> list[JobRow]:
    """Jobs submitted in the window or that ended in it."""
    terminal = [s.value for s in JobState if s.terminal]
    query = select(JobRow).where(
        or_(
            and_(col(JobRow.created_at) >= since, col(JobRow.created_at) < until),
            and_(
                col(JobRow.state).in_(terminal),
                col(JobRow.updated_at) >= since,
                col(JobRow.updated_at) < until,
            ),
        ),
        *_in_scope(scope),
    )
    return list(session.exec(query).all())


def _ended_in(job: JobRow, since: datetime, until: datetime) -> bool:
    return JobState(job.state).terminal and since <= job.updated_at < until


def _first_starts(session: Session, job_ids: Sequence[str]) -> dict[str, datetime]:
    starts: dict[str, datetime] = {}
    for chunk in _chunks(job_ids):
        rows = session.execute(
            sa_select(col(LeaseRow.job_id), col(LeaseRow.began_at), col(LeaseRow.issued_at)).where(
                col(LeaseRow.job_id).in_(chunk)
            )
        ).all()
        for job_id, began, issued in rows:
            start = began or issued
            if job_id not in starts or start < starts[job_id]:
                starts[job_id] = start
    return starts


def _ftfs(session: Session, ended: Sequence[JobRow], now: datetime) -> dict[str, float]:
    """Finish-time fairness of each job of ``ended`` that succeeded and held GPUs."""
    done = [j for j in ended if j.state == JobState.SUCCEEDED.value]
    if not done:
        return {}
    gpus = sum(session.exec(select(NodeRow.gpus)).all()) or 1
    demand = _Demand(session, min(j.created_at for j in done), max(j.updated_at for j in done), now)
    held: dict[str, float] = {}
    for chunk in _chunks([j.id for j in done]):
        for job_id, stints in stints_of(session, chunk, now).items():
            held[job_id] = sum(s.end_s - s.began_s for s in stints)
    ftfs: dict[str, float] = {}
    for job in done:
        run_s = held.get(job.id, 0.0)
        jct_s = (job.updated_at - job.created_at).total_seconds()
        if run_s <= 0 or jct_s <= 0:
            continue
        contention = max(1.0, demand.mean(job.created_at, job.updated_at) / gpus)
        ftfs[job.id] = jct_s / (run_s * contention)
    return ftfs


class _Demand:
    """GPUs requested by the jobs queued or running over time (a step function), from the
    jobs whose lifetimes overlap ``[start, end]``."""

    def __init__(self, session: Session, start: datetime, end: datetime, now: datetime) -> None:
        active = [s.value for s in ACTIVE]
        jobs = session.exec(
            select(JobRow.created_at, JobRow.updated_at, JobRow.state, JobRow.gpus).where(
                col(JobRow.created_at) <= end,
                or_(col(JobRow.state).in_(active), col(JobRow.updated_at) >= start),
            )
        ).all()
        deltas: dict[float, float] = defaultdict(float)
        for created, updated, state, width in jobs:
            deltas[created.timestamp()] += width
            stop = now if state in active else updated
            deltas[stop.timestamp()] -= width
        self.times = sorted(deltas)
        self.levels: list[float] = []
        self.area: list[float] = []
        level = area = 0.0
        for i, t in enumerate(self.times):
            if i:
                area += level * (t - self.times[i - 1])
            level += deltas[t]
            self.levels.append(level)
            self.area.append(area)

    def integral(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return 0.0
        return self.area[i] + self.levels[i] * (t - self.times[i])

    def mean(self, start: datetime, end: datetime) -> float:
        a, b = start.timestamp(), end.timestamp()
        return (self.integral(b) - self.integral(a)) / (b - a) if b > a else 0.0


def _user_names(session: Session) -> dict[str, str]:
    """Each token's name by its caller key (``token:<id>``)."""
    rows = session.exec(select(TokenRow.id, TokenRow.name)).all()
    return {f"token:{token_id}": name for token_id, name in rows}


def _chunks(items: Sequence[str], size: int = 500) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
