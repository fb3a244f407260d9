"""Seeded synthetic workloads in the paper's job mix (Shockwave section 7, Gavel's generator).

Each job draws, in this order: an inter-arrival gap (exponential, so arrivals are Poisson), a
size class and a size in GPU-hours uniform within it, a width (GPUs), a model the throughput table
knows on that width, an initial batch size the table knows for that model and width, and an
adaptation mode. Its true trajectory follows simple rules, stated as fractions of its epochs:

- ``static``: one regime at the initial batch size.
- ``accordion``: a critical regime at the initial batch size for the first 10-30% of epochs, then
  the model's largest batch size; with probability 1/2 a second critical window of 10% of epochs,
  starting at 50-70%, goes back to the initial size.
- ``gns``: the batch size climbs the table's ladder one rung at a time (each rung doubles in the
  reference tables) up to the largest, switching at sorted uniform points in 10-90% of epochs;
  it never goes down.

A job whose initial batch size is already the largest keeps it throughout, whatever its mode.
Every epoch time comes from the throughput table; the number of epochs is chosen so that the
exclusive run time times the width is the drawn GPU-hours, to within one epoch per regime.

The result goes through :func:`~shockwave.workloads.traces.build_workload`, so
:func:`~shockwave.workloads.traces.format_trace` and
:func:`~shockwave.workloads.traces.format_trajectories` write it out and parse back to an equal
workload. Nothing here touches global random state: the same seed gives the same workload, and the
first ``n`` jobs do not depend on how many follow."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from shockwave.domain.model import VALID_WIDTHS, AdaptationMode, Regime, ValidationError
from shockwave.workloads.traces import (
    COMMANDS,
    DATASETS,
    SAMPLES_PER_EPOCH,
    TRACE_MODES,
    ThroughputTable,
    TraceJob,
    TrajectoryRecord,
    build_workload,
)
from shockwave.workloads.workload import Workload


@dataclass(frozen=True, slots=True)
class SizeClass:
    """Jobs of ``min_gpu_hours`` to ``max_gpu_hours`` of exclusive GPU time, drawn with
    ``probability``."""

    name: str
    min_gpu_hours: float
    max_gpu_hours: float
    probability: float

    def __post_init__(self) -> None:
        if not 0 < self.min_gpu_hours < self.max_gpu_hours:
            raise ValidationError(
                "size_classes",
                f"{self.name}: needs 0 < min < max GPU-hours, got "
                f"{self.min_gpu_hours}-{self.max_gpu_hours}",
            )

    def holds(self, gpu_hours: float) -> bool:
        return self.min_gpu_hours <= gpu_hours < self.max_gpu_hours


SIZE_CLASSES: tuple[SizeClass, ...] = (
    SizeClass("Small", 0.2, 8.0, 0.72),
    SizeClass("Medium", 8.0, 16.0, 0.20),
    SizeClass("Large", 16.0, 72.0, 0.05),
    SizeClass("XL", 72.0, 100.0, 0.03),
)
"""The paper's job sizes in GPU-hours and how often each occurs."""

WIDTH_MIX: Mapping[int, float] = MappingProxyType({1: 0.6, 2: 0.3, 4: 0.09, 8: 0.01})
"""Share of jobs asking for 1, 2, 4 and 8 GPUs (the reference traces' scale-factor mix)."""

MODE_MIX: Mapping[AdaptationMode, float] = MappingProxyType(
    {AdaptationMode.STATIC: 0.0, AdaptationMode.ACCORDION: 0.5, AdaptationMode.GNS: 0.5}
)
"""Share of each adaptation mode (the reference traces' mode mix)."""

ACCORDION_CRITICAL = (0.1, 0.3)
"""Range of the share of epochs in Accordion's first critical regime."""
ACCORDION_SECOND_WINDOW_PROBABILITY = 0.5
ACCORDION_SECOND_WINDOW_START = (0.5, 0.7)
ACCORDION_SECOND_WINDOW_LENGTH = 0.1
GNS_SWITCHES = (0.1, 0.9)
"""Range of the epoch shares at which a GNS job moves up one rung."""

K = TypeVar("K")

Shape = tuple[tuple[int, float], ...]
"""A trajectory before it has a length: (batch size, share of epochs) in order, shares sum to 1."""


def generate_workload(
    num_jobs: int,
    *,
    seed: int | np.random.Generator,
    throughputs: ThroughputTable,
    mean_interarrival_s: float = 100.0,
    mode_mix: Mapping[AdaptationMode, float] = MODE_MIX,
    width_mix: Mapping[int, float] = WIDTH_MIX,
    size_classes: Sequence[SizeClass] = SIZE_CLASSES,
    models: Sequence[str] = tuple(SAMPLES_PER_EPOCH),
    name: str | None = None,
) -> Workload:
    """``num_jobs`` jobs with Poisson arrivals from t = 0, in arrival order, ids ``"0"``, ``"1"``...

    ``seed`` is an int or a numpy Generator (which is advanced). Arrivals are rounded to whole
    seconds, as traces write them. Raises :class:`ValidationError` for a mix whose shares are
    negative or do not sum to 1, or a width on which none of ``models`` has throughputs.
    """
    if num_jobs < 0:
        raise ValidationError("num_jobs", f"must be >= 0, got {num_jobs}")
    if not (math.isfinite(mean_interarrival_s) and mean_interarrival_s >= 0):
        raise ValidationError("mean_interarrival_s", f"must be >= 0, got {mean_interarrival_s}")
    _check_mix("mode_mix", mode_mix, TRACE_MODES)
    _check_mix("width_mix", width_mix, VALID_WIDTHS)
    _check_mix("size_classes", {c.name: c.probability for c in size_classes}, None)
    models_on = _models_by_width(throughputs, models, width_mix)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    trace: list[TraceJob] = []
    trajectories: list[TrajectoryRecord] = []
    clock_s = 0.0
    for index in range(num_jobs):
        if index:
            clock_s += float(rng.exponential(mean_interarrival_s))
        line, record = _draw_job(
            rng,
            index,
            float(round(clock_s)),
            throughputs,
            mode_mix,
            width_mix,
            size_classes,
            models_on,
        )
        trace.append(line)
        trajectories.append(record)
    if name is None:
        name = f"synthetic-{num_jobs}jobs" + (f"-seed{seed}" if isinstance(seed, int) else "")
    return build_workload(trace, trajectories, throughputs, name)


def size_class_of(gpu_hours: float, size_classes: Sequence[SizeClass] = SIZE_CLASSES) -> str:
    """Name of the class holding ``gpu_hours`` (the last class includes its upper bound)."""
    for size_class in size_classes:
        if size_class.holds(gpu_hours):
            return size_class.name
    last = size_classes[-1]
    if gpu_hours == last.max_gpu_hours:
        return last.name
    raise ValueError(f"{gpu_hours} GPU-hours is in no size class")


def _draw_job(
    rng: np.random.Generator,
    index: int,
    arrival_s: float,
    throughputs: ThroughputTable,
    mode_mix: Mapping[AdaptationMode, float],
    width_mix: Mapping[int, float],
    size_classes: Sequence[SizeClass],
    models_on: Mapping[int, tuple[str, ...]],
) -> tuple[TraceJob, TrajectoryRecord]:
    size_class = size_classes[pick(rng, [c.probability for c in size_classes])]
    gpu_hours = float(rng.uniform(size_class.min_gpu_hours, size_class.max_gpu_hours))
    widths = list(width_mix)
    width = widths[pick(rng, [width_mix[w] for w in widths])]
    model = models_on[width][int(rng.integers(len(models_on[width])))]
    ladder = throughputs.batch_sizes(model, width)
    initial = ladder[int(rng.integers(len(ladder)))]
    modes = list(mode_mix)
    mode = modes[pick(rng, [mode_mix[m] for m in modes])]
    shape = draw_shape(rng, mode, initial, ladder)
    return job_lines(
        index, arrival_s, width, model, mode, shape, gpu_hours * 3600.0 / width, throughputs
    )


def job_lines(
    index: int,
    arrival_s: float,
    width: int,
    model: str,
    mode: AdaptationMode,
    shape: Shape,
    target_s: float,
    throughputs: ThroughputTable,
) -> tuple[TraceJob, TrajectoryRecord]:
    """The trace line and trajectory record of job ``index``: ``model`` on ``width`` GPUs
    following ``shape`` (its first batch size is the initial one), with as many epochs as make
    its exclusive run time ``target_s`` (at least one; to within one epoch per regime)."""
    initial = shape[0][0]
    samples = SAMPLES_PER_EPOCH[model]
    epoch_seconds = {bs: _epoch_seconds(throughputs, model, bs, width) for bs, _ in shape}
    mean_epoch_s = sum(share * epoch_seconds[bs] for bs, share in shape)
    epochs = max(1, round(target_s / mean_epoch_s))
    regimes = _regimes(shape, epochs)

    command, working_directory, num_steps_arg = COMMANDS[model]
    line = TraceJob(
        job_type=f"{model} (batch size {initial})",
        command=command.format(batch_size=initial),
        working_directory=working_directory,
        num_steps_arg=num_steps_arg,
        needs_data_dir=True,
        total_steps=epochs * math.ceil(samples / initial),
        scale_factor=width,
        mode=mode,
        priority_weight=1.0,
        slo=-1.0,
        duration_s=float(round(target_s)),
        arrival_s=arrival_s,
    )
    record = TrajectoryRecord(
        job=index,
        model=model,
        num_epochs=epochs,
        samples_per_epoch=samples,
        scale_factor=width,
        regimes=regimes,
        epoch_seconds_at_bs={r.batch_size: epoch_seconds[r.batch_size] for r in regimes},
        dataset=DATASETS[model],
        trace_duration_s=line.duration_s,
    )
    return line, record


def draw_shape(
    rng: np.random.Generator, mode: AdaptationMode, initial: int, ladder: tuple[int, ...]
) -> Shape:
    """The mode's rule (module docstring) as (batch size, share of epochs) pairs, drawn from
    ``rng``; ``ladder`` is the batch sizes the job may use, ascending."""
    largest = ladder[-1]
    if mode is AdaptationMode.STATIC or initial == largest:
        return ((initial, 1.0),)
    if mode is AdaptationMode.ACCORDION:
        critical = float(rng.uniform(*ACCORDION_CRITICAL))
        if rng.random() >= ACCORDION_SECOND_WINDOW_PROBABILITY:
            return ((initial, critical), (largest, 1.0 - critical))
        start = float(rng.uniform(*ACCORDION_SECOND_WINDOW_START))
        end = start + ACCORDION_SECOND_WINDOW_LENGTH
        return (
            (initial, critical),
            (largest, start - critical),
            (initial, end - start),
            (largest, 1.0 - end),
        )
    rungs = [initial, *(bs for bs in ladder if bs > initial)]
    switches = [0.0, *sorted(float(x) for x in rng.uniform(*GNS_SWITCHES, len(rungs) - 1)), 1.0]
    return tuple((bs, switches[i + 1] - switches[i]) for i, bs in enumerate(rungs))


def _regimes(shape: Shape, epochs: int) -> tuple[Regime, ...]:
    """Whole-epoch regimes following ``shape``: each regime ends at its cumulative share of
    ``epochs`` (rounded, at least one epoch); regimes left without epochs are dropped."""
    regimes: list[Regime] = []
    start, cumulative = 0, 0.0
    for i, (batch_size, share) in enumerate(shape):
        cumulative += share
        end = (
            epochs
            if i == len(shape) - 1
            else min(max(round(cumulative * epochs), start + 1), epochs)
        )
        if end > start:
            regimes.append(Regime(batch_size, end - start))
            start = end
    return tuple(regimes)


def _epoch_seconds(throughputs: ThroughputTable, model: str, batch_size: int, width: int) -> float:
    seconds = throughputs.epoch_seconds(model, batch_size, width, SAMPLES_PER_EPOCH[model])
    if seconds is None:
        raise ValidationError("throughputs", f"no rate for {model} at {batch_size} on {width} GPUs")
    return seconds


def _models_by_width(
    throughputs: ThroughputTable, models: Sequence[str], width_mix: Mapping[int, float]
) -> dict[int, tuple[str, ...]]:
    """Models with a known dataset size and throughputs on each width that may be drawn."""
    unknown = [m for m in models if m not in SAMPLES_PER_EPOCH]
    if unknown:
        raise ValidationError("models", f"unknown dataset size for {unknown}")
    by_width = {w: tuple(m for m in models if throughputs.batch_sizes(m, w)) for w in width_mix}
    for width, share in width_mix.items():
        if share > 0 and not by_width[width]:
            raise ValidationError("width_mix", f"no model has throughputs on {width} GPUs")
    return by_width


def _check_mix(field: str, mix: Mapping[K, float], allowed: Sequence[K] | None) -> None:
    for key, share in mix.items():
        if allowed is not None and key not in allowed:
            raise ValidationError(field, f"{key!r} is not one of {list(allowed)}")
        if not (math.isfinite(share) and share >= 0):
            raise ValidationError(field, f"share of {key!r} must be >= 0, got {share}")
    if not math.isclose(sum(mix.values()), 1.0, abs_tol=1e-9):
        raise ValidationError(field, f"shares must sum to 1, got {sum(mix.values())}")


def pick(rng: np.random.Generator, shares: Sequence[float]) -> int:
    """Index drawn with probability proportional to ``shares``."""
    p = np.asarray(shares, dtype=float)
    return int(rng.choice(len(p), p=p / p.sum()))
