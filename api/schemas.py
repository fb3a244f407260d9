"""Request and response bodies (pydantic). Numbers are bounded so that nothing a client sends
can overflow a database column; the core's model then checks what makes a job possible."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from shockwave.lifecycle import JobState

BigInt = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-1e15, le=1e15)]
Name = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/ -]*$")
]
Tenant = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class JobCreate(BaseModel):
    """A job submission (SPEC section 3.1). ``throughput``: samples per second of the whole
    gang at each batch size, if known. ``tenant``: only an admin may set it; a user's jobs
    belong to the user's tenant."""

    model_config = ConfigDict(extra="forbid")

    name: Name = "job"
    tenant: Tenant | None = None
    gpus: BigInt
    epochs: BigInt
    samples_per_epoch: BigInt
    initial_batch_size: BigInt
    mode: Literal["static", "accordion", "gns", "custom"] = "static"
    batch_sizes: Annotated[list[BigInt], Field(max_length=64)] = []
    throughput: Annotated[dict[BigInt, Finite], Field(max_length=64)] = {}
    budget: Finite = 1.0
    model: Annotated[str, Field(max_length=128)] = ""


class JobPublic(BaseModel):
    id: str
    tenant: str
    name: str
    state: JobState
    gpus: int
    epochs: int
    samples_per_epoch: int
    initial_batch_size: int
    mode: str
    batch_sizes: list[int]
    throughput: dict[str, float]
    budget: float
    model: str
    epochs_done: float
    batch_size: int
    attained_s: float
    created_at: datetime
    updated_at: datetime


class EventPublic(BaseModel):
    id: int
    job_id: str
    seq: int | None
    kind: str
    payload: dict[str, Any]
    reason: str
    created_at: datetime


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list; pass ``next_page_token`` back as ``page_token`` for the next one."""

    items: list[T]
    next_page_token: str | None = None
