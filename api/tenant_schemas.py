"""Request and response bodies of the tenant and usage routes (``/v1/tenants``, ``/v1/usage``).

A tenant is named by its path in the tree (``org/team``); its settings are bounded here and
their rules between each other are checked by :mod:`store.tenants`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from api.schemas import Tenant
from store.tenants import MAX_GPUS, MAX_JOBS, MAX_WEIGHT

Weight = Annotated[
    float,
    Strict(),
    Field(
        allow_inf_nan=False,
        gt=0,
        le=MAX_WEIGHT,
        description="The tenant's share among its siblings (relative: 2 gets twice 1's).",
    ),
]
GpuLimit = Annotated[int, Strict(), Field(ge=0, le=MAX_GPUS)]
JobLimit = Annotated[int, Strict(), Field(ge=0, le=MAX_JOBS)]


class TenantCreate(BaseModel):
    """A tenant to configure: its ``path`` in the tree, its ``weight`` and its limits (null or
    absent: none). ``guaranteed_gpus``: GPUs it gets whenever it has demand for them;
    ``max_gpus``: the most its jobs hold together (it borrows idle GPUs up to that);
    ``max_jobs``: the most jobs queued and running in its subtree."""

    model_config = ConfigDict(extra="forbid")

    path: Tenant
    weight: Weight = 1.0
    guaranteed_gpus: GpuLimit | None = None
    max_gpus: GpuLimit | None = None
    max_jobs: JobLimit | None = None


class TenantUpdate(BaseModel):
    """The settings to change (those present); null clears a limit."""

    model_config = ConfigDict(extra="forbid")

    weight: Weight | None = None
    guaranteed_gpus: GpuLimit | None = None
    max_gpus: GpuLimit | None = None
    max_jobs: JobLimit | None = None


class TenantPublic(BaseModel):
    """A tenant's settings in the tree: ``parent`` (null at the top) and ``children`` (the
    listed tenants right below it). ``configured``: false for a tenant without settings of
    its own (weight 1, no limits). ``version``: how many times it was changed.
    ``active_jobs``: its subtree's jobs queued and running now; ``entitled_gpus``: its
    water-filled share of the READY GPUs now, given every tenant's demand (docs/tenants.md);
    ``held_gpus``: the GPUs its jobs hold now."""

    path: str
    parent: str | None
    children: list[str]
    weight: float
    guaranteed_gpus: int | None
    max_gpus: int | None
    max_jobs: int | None
    configured: bool
    version: int
    updated_at: datetime | None
    active_jobs: int
    entitled_gpus: float
    held_gpus: int


class TenantChangePublic(BaseModel):
    """One change to a tenant: its settings after the change, who made it (``token:<id>``;
    empty for a user reading its own tenant) and when."""

    version: int
    weight: float
    guaranteed_gpus: int | None
    max_gpus: int | None
    max_jobs: int | None
    changed_by: str
    changed_at: datetime


class TenantDetail(TenantPublic):
    """A tenant with its latest changes, newest first."""

    history: list[TenantChangePublic]


class TenantTree(BaseModel):
    """The tenants the caller sees (an admin: the whole tree; a user: its own tenant), by
    path, and the ``roots`` of the tree among them."""

    items: list[TenantPublic]
    roots: list[str]


class UsageRowPublic(BaseModel):
    """One group's figures over the window (docs/api.md, "Usage"): ``key`` is the tenant's
    path, the submitting caller (``token:<id>``) or the job id; ``label`` the user's token
    name or the job's name."""

    key: str
    tenant: str
    label: str
    gpu_hours: float
    jobs: int
    finished: int
    mean_wait_s: float | None
    max_wait_s: float | None
    mean_ftf: float | None
    max_ftf: float | None


class UsagePublic(BaseModel):
    """GPU-hours, jobs, waits and finish-time fairness in ``[since, until)`` by ``group_by``;
    ``total_gpu_hours``: the rows' sum."""

    since: datetime
    until: datetime
    group_by: Literal["tenant", "user", "job"]
    tenant: str | None
    rows: list[UsageRowPublic]
    total_gpu_hours: float
