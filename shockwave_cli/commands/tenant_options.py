"""The simulator's tenant options: who each job belongs to and the tenants' settings.

``--tenants a:5,b:1`` draws each job's tenant (``a`` with probability 5/6, ``b`` 1/6) with
``--tenant-seed``; ``--tenant-file`` reads it from a sidecar (JSON ``{"job_id": "tenant"}`` or
CSV with columns ``job_id,tenant``); ``--tenant-weights``, ``--tenant-guaranteed-gpus`` and
``--tenant-max-gpus`` set the tenants' settings (``NAME:VALUE`` comma-separated, tree paths such
as ``org/team`` allowed). docs/tenants.md.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from shockwave.domain.model import ValidationError
from shockwave.workloads.tenant_workload import (
    assign_tenants,
    parse_tenant_values,
    tenant_settings,
    with_tenants,
)
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import InputError

Tenants = Annotated[
    str | None,
    typer.Option(
        help="Assign each job a tenant by a seeded draw: NAME:SHARE comma-separated "
        "(a:5,b:1: a with probability 5/6, b 1/6; paths like org/team allowed; docs/tenants.md)."
    ),
]
TenantSeed = Annotated[int, typer.Option(help="Seed of the --tenants draw.")]
TenantFile = Annotated[
    Path | None,
    typer.Option(
        help='Instead of --tenants: each job\'s tenant from a sidecar file, JSON {"job_id": '
        '"tenant"} or CSV with columns job_id,tenant.'
    ),
]
TenantWeights = Annotated[
    str | None,
    typer.Option(help="Tenants' weights among their siblings, NAME:WEIGHT comma-separated (1)."),
]
TenantGuaranteed = Annotated[
    str | None,
    typer.Option(help="GPUs a tenant is guaranteed when it has demand, NAME:GPUS (none)."),
]
TenantMaxGpus = Annotated[
    str | None,
    typer.Option(help="The most GPUs a tenant may hold, borrowing included, NAME:GPUS (none)."),
]


def apply_tenant_options(
    workload: Workload,
    tenants: str | None,
    seed: int,
    tenant_file: Path | None,
    weights: str | None,
    guaranteed: str | None,
    max_gpus: str | None,
) -> Workload:
    """``workload`` with its jobs' tenants and the tenants' settings from the options."""
    try:
        if tenants is not None and tenant_file is not None:
            raise InputError("give either --tenants or --tenant-file, not both")
        if tenants is not None:
            workload = assign_tenants(workload, parse_tenant_values(tenants, "--tenants"), seed)
        elif tenant_file is not None:
            workload = with_tenants(workload, _read_sidecar(tenant_file))
        settings = tenant_settings(
            parse_tenant_values(weights, "--tenant-weights") if weights else {},
            parse_tenant_values(guaranteed, "--tenant-guaranteed-gpus", allow_zero=True)
            if guaranteed
            else {},
            parse_tenant_values(max_gpus, "--tenant-max-gpus", allow_zero=True) if max_gpus else {},
        )
    except ValidationError as error:
        raise InputError(str(error)) from None
    return replace(workload, tenants=settings) if settings else workload


def _read_sidecar(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"--tenant-file: cannot read {path}: {error.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"--tenant-file: {path} is not JSON: {error}") from None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise InputError(f'--tenant-file: {path} must map job ids to tenants {{"0": "a"}}')
        return dict(data)
    rows = list(csv.DictReader(text.splitlines()))
    if rows and not {"job_id", "tenant"} <= set(rows[0]):
        raise InputError(f"--tenant-file: {path} needs the columns job_id,tenant")
    return {row["job_id"]: row["tenant"] for row in rows}
