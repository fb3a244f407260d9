"""Tenants for a simulated workload: who each job belongs to, and the tenants' settings.

A workload's jobs get their tenants from a map (job id -> tenant path: a trace's sidecar file)
or by a seeded rule (:func:`assign_tenants`: each job draws tenant ``t`` with probability
``share_t / sum(shares)``, in workload order, from ``random.Random(seed)``), and the tenants'
settings from ``NAME:VALUE`` lists (:func:`parse_tenant_values`, :func:`tenant_settings`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping

from shockwave.domain.model import ValidationError, check_tenant_path
from shockwave.domain.tenancy import Tenant
from shockwave.workloads.workload import Workload


def parse_tenant_values(text: str, option: str, allow_zero: bool = False) -> dict[str, float]:
    """``"a:5,b:1"`` -> ``{"a": 5.0, "b": 1.0}`` (tree paths such as ``org/team:2`` allowed);
    values must be positive (or 0 with ``allow_zero``); a bad entry raises
    :class:`ValidationError` naming ``option``."""
    values: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, raw = part.rpartition(":")
        if not sep or not name:
            raise ValidationError(option, f"{part!r} is not NAME:VALUE (for example a:5,b:1)")
        try:
            check_tenant_path(name)
        except ValidationError as error:
            raise ValidationError(option, error.message) from None
        try:
            value = float(raw)
        except ValueError:
            raise ValidationError(option, f"{part!r}: {raw!r} is not a number") from None
        if not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
            least = "a number >= 0" if allow_zero else "a positive number"
            raise ValidationError(option, f"{part!r}: the value must be {least}")
        if name in values:
            raise ValidationError(option, f"tenant {name!r} named twice")
        values[name] = value
    return values


def assign_tenants(workload: Workload, shares: Mapping[str, float], seed: int) -> Workload:
    """``workload`` with each job's tenant drawn by the seeded rule (module docstring)."""
    total = sum(shares.values())
    if not shares or total <= 0:
        raise ValidationError("tenants", "give at least one tenant with a positive share")
    names = list(shares)
    rng = random.Random(seed)
    drawn = {}
    for job in workload.jobs:
        pick = rng.random() * total
        chosen = names[-1]
        for name in names:
            pick -= shares[name]
            if pick < 0:
                chosen = name
                break
        drawn[job.spec.job_id] = chosen
    return with_tenants(workload, drawn)


def with_tenants(workload: Workload, tenant_of: Mapping[str, str]) -> Workload:
    """``workload`` with each job named in ``tenant_of`` (job id -> tenant path) moved to that
    tenant; an id that names no job of the workload is an error (a sidecar for another trace)."""
    ids = {job.spec.job_id for job in workload.jobs}
    unknown = sorted(set(tenant_of) - ids)
    if unknown:
        raise ValidationError("tenants", f"no job {unknown[0]!r} in workload {workload.name}")
    for path in tenant_of.values():
        check_tenant_path(path)
    jobs = tuple(
        dataclasses.replace(
            job, spec=dataclasses.replace(job.spec, tenant=tenant_of[job.spec.job_id])
        )
        if job.spec.job_id in tenant_of
        else job
        for job in workload.jobs
    )
    return dataclasses.replace(workload, jobs=jobs)


def tenant_settings(
    weights: Mapping[str, float],
    guaranteed: Mapping[str, float],
    max_gpus: Mapping[str, float],
) -> dict[str, Tenant]:
    """The tenants named in any of the three maps, with those settings (the rest default)."""
    settings: dict[str, Tenant] = {}
    for path in dict.fromkeys((*weights, *guaranteed, *max_gpus)):
        settings[path] = Tenant(
            path,
            weight=weights.get(path, 1.0),
            guaranteed_gpus=_whole(guaranteed, path, "guaranteed_gpus"),
            max_gpus=_whole(max_gpus, path, "max_gpus"),
        )
    return settings


def _whole(values: Mapping[str, float], path: str, name: str) -> int | None:
    if path not in values:
        return None
    value = values[path]
    if value != int(value):
        raise ValidationError(name, f"{path}:{value:g} is not a whole number of GPUs")
    return int(value)
