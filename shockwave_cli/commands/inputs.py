"""Reading the simulator's inputs from files and turning every problem into one line.

The core is pure, so this module owns the file I/O: it reads the reference formats (trace,
trajectory JSON, throughput JSON), hands text and parsed JSON to :mod:`shockwave.workloads.traces`,
and resolves policy names against the registry. Anything wrong with the user's input becomes an
:class:`InputError` whose message names the file, line or option at fault; the command turns it
into a red line and exit code 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from shockwave.domain.model import AdaptationMode, Cluster, ValidationError
from shockwave.market.heterogeneity import parse_typed_gpus, parse_typed_nodes, typed_workload
from shockwave.policies import BASELINES
from shockwave.policies.policy import (
    Policy,
    UnknownPolicyError,
    get_policy,
    make_params,
    policy_names,
)
from shockwave.workloads.traces import (
    TRACE_MODES,
    ThroughputTable,
    build_workload,
    parse_throughputs,
    parse_trace,
    parse_trajectories,
)
from shockwave.workloads.workload import Workload


class InputError(Exception):
    """Input the user can fix; ``str(error)`` is the whole one-line message."""


def read_text(path: Path, what: str) -> str:
    """The file's text; ``what`` ("trace", ...) names the role of the file in the message."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} file {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{what} file {path} is a directory") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{what} file {path} cannot be read: {error}") from None


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The file's top-level JSON object; a syntax error is reported with its line and column."""
    text = read_text(path, what)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path} line {error.lineno} column {error.colno}: invalid JSON ({error.msg})"
        ) from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: a {what} file must hold a JSON object at the top level")
    return obj


def load_throughputs(path: Path) -> ThroughputTable:
    """The measured throughput table (reference format) in ``path``."""
    obj = read_json_object(path, "throughputs")
    try:
        return parse_throughputs(obj, str(path))
    except ValidationError as error:
        raise InputError(_located(error, path)) from None


def load_typed_workload(workload: Workload, path: Path, cluster: Cluster) -> Workload:
    """``workload`` with each job's throughput on every GPU type of a typed ``cluster``, read
    from the throughput file ``path`` (the file's default type stays the reference)."""
    if not cluster.is_typed:
        return workload
    obj = read_json_object(path, "throughputs")
    try:
        reference = parse_throughputs(obj, str(path)).gpu_type
        tables = {t: parse_throughputs(obj, str(path), gpu_type=t) for t in cluster.gpu_types}
    except ValidationError as error:
        raise InputError(f"--gpus: {_located(error, path)}") from None
    # Every (model, width) the workload has, so a gang wider than the table's widths gets the
    # type's scaled rates (ThroughputTable's scaling model) rather than the reference speed.
    wanted = {(job.spec.model, job.spec.gpus) for job in workload.jobs}
    profiles = {
        t: {
            (m, sf): table.profile(m, sf)
            for m, sf in sorted(
                wanted | {(m, sf) for m in table.models for sf in table.scale_factors(m)}
            )
            if table.batch_sizes(m, sf)
        }
        for t, table in tables.items()
    }
    return typed_workload(workload, profiles, reference)


def load_workload(trace: Path, trajectories: Path, throughputs: ThroughputTable) -> Workload:
    """The workload of a Gavel trace and its trajectory file, named after the trace file."""
    text = read_text(trace, "trace")
    trajectory_obj = read_json_object(trajectories, "trajectories")
    try:
        trace_jobs = parse_trace(text, str(trace))
    except ValidationError as error:
        raise InputError(_located(error, trace)) from None
    try:
        parsed_trajectories = parse_trajectories(trajectory_obj, str(trajectories))
    except ValidationError as error:
        raise InputError(_located(error, trajectories)) from None
    try:
        return build_workload(trace_jobs, parsed_trajectories, throughputs, trace.stem)
    except ValidationError as error:
        raise InputError(_located(error, trace)) from None


def resolve_policies(spec: str) -> list[Policy]:
    """Policies named by ``spec``: ``"all"`` or comma-separated names, duplicates dropped.

    ``"all"`` is the paper's baselines in table order, then every other registered policy.
    """
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise InputError("--policy: name at least one policy (or 'all')")
    if names == ["all"]:
        names = [*BASELINES, *(n for n in policy_names() if n not in BASELINES)]
    chosen: list[Policy] = []
    for name in dict.fromkeys(names):
        try:
            chosen.append(get_policy(name))
        except UnknownPolicyError as error:
            raise InputError(f"--policy: {error}") from None
    return chosen


def policy_params(policy: Policy, seed: int | None) -> Any:
    """The policy's default params, with ``seed`` passed through where the params take one."""
    params_type = policy.Params
    takes_seed = is_dataclass(params_type) and any(f.name == "seed" for f in fields(params_type))
    return make_params(policy, {"seed": seed} if takes_seed and seed is not None else None)


def parse_mode_mix(text: str) -> dict[AdaptationMode, float]:
    """``--mode-mix``: shares of static, accordion and gns jobs, e.g. ``"0.5,0.25,0.25"``.

    Three finite shares >= 0 that sum to 1, in the trace's mode order; anything else is an
    :class:`InputError` that shows the expected shape.
    """
    order = ",".join(m.value for m in TRACE_MODES)
    expected = f"expected {len(TRACE_MODES)} shares {order} summing to 1, e.g. 0.5,0.25,0.25"
    cells = [cell.strip() for cell in text.split(",")]
    if len(cells) != len(TRACE_MODES):
        raise InputError(f"--mode-mix: {expected}; got {text!r}")
    try:
        shares = [float(cell) for cell in cells]
    except ValueError:
        raise InputError(f"--mode-mix: {expected}; got {text!r}") from None
    if not all(math.isfinite(share) and share >= 0 for share in shares):
        raise InputError(f"--mode-mix: shares must be finite and >= 0; got {text!r}")
    if not math.isclose(sum(shares), 1.0, abs_tol=1e-9):
        raise InputError(f"--mode-mix: shares must sum to 1, got {sum(shares):g} from {text!r}")
    return dict(zip(TRACE_MODES, shares, strict=True))


def _located(error: ValidationError, path: Path) -> str:
    """The error's message, prefixed with the file unless it already names it."""
    message = str(error)
    return message if str(path) in message else f"{path}: {message}"


def parse_cluster(gpus: int | str | None, gpus_per_node: int, nodes: str | None) -> Cluster:
    """The cluster of ``--gpus N [--gpus-per-node K]`` or of ``--nodes 2x8,3x4`` (exactly one);
    typed: ``--gpus v100:12,k80:8`` or ``--nodes 2x8:v100,3x4:k80``."""
    if (gpus is None) == (nodes is None):
        raise InputError("give the cluster as --gpus N [--gpus-per-node K] or as --nodes 2x8,3x4")
    try:
        if nodes is not None:
            return parse_typed_nodes(nodes) if ":" in nodes else Cluster.parse(nodes)
        assert gpus is not None
        if isinstance(gpus, str) and ":" in gpus:
            return parse_typed_gpus(gpus, gpus_per_node)
        if isinstance(gpus, str) and not gpus.strip().isdigit():
            raise ValidationError("gpus", f"{gpus!r} is neither a GPU count nor TYPE:COUNT,...")
        return Cluster.of_gpus(int(gpus), gpus_per_node)
    except ValidationError as error:
        field = "nodes" if nodes is not None else error.field.replace("_", "-")
        raise InputError(f"--{field}: {error.message}") from None
