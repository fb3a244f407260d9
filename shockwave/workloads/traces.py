"""Reading and writing Gavel-format traces, trajectory files and throughput tables.

These are the formats the reference Shockwave data comes in (see the reference data README): a
trace has one job per line in 12 tab-separated fields, a trajectory file gives each job's true
batch-size regimes, a throughput table gives measured steps per second per (job type, GPUs).
Everything here is pure: callers open the files and hand over text or parsed JSON plus a
``source`` name that every error message starts with, so a bad line is reported as
``"<source> line 7: field 7 (scale_factor) ..."``.

:func:`build_workload` joins the three into a :class:`~shockwave.workloads.workload.Workload`;
:func:`format_trace` and :func:`format_trajectories` write a workload back, so that parsing the
output and building again gives an equal workload.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeGuard

from shockwave.domain.model import (
    AdaptationMode,
    JobSpec,
    Regime,
    ThroughputProfile,
    ValidationError,
    is_valid_width,
    width_rule,
)
from shockwave.workloads.workload import SimJob, Workload

SAMPLES_PER_EPOCH: Mapping[str, int] = MappingProxyType(
    {
        "ResNet-18": 50000,
        "ResNet-50": 100000,
        "Transformer": 10000,
        "LM": 59675,
        "Recommendation": 117907,
    }
)
"""Training samples in one epoch of each model's dataset (the trace format implies these)."""

DATASETS: Mapping[str, str] = MappingProxyType(
    {
        "ResNet-18": "CIFAR-10",
        "ResNet-50": "ImageNet",
        "Transformer": "Multi30k",
        "LM": "Wikitext-2",
        "Recommendation": "ML-20M",
    }
)

COMMANDS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {
        "ResNet-18": (
            "python3 main.py --data_dir=%s/cifar10 --batch_size {batch_size}",
            "image_classification/cifar10",
            "--num_steps",
        ),
        "ResNet-50": (
            "python3 main.py -j 4 -a resnet50 -b {batch_size} %s/imagenet/",
            "image_classification/imagenet",
            "--num_minibatches",
        ),
        "Transformer": (
            "python3 train.py -data %s/translation/multi30k.atok.low.pt -batch_size {batch_size}"
            " -proj_share_weight",
            "translation",
            "-step",
        ),
        "LM": (
            "python3 main.py --cuda --data %s/wikitext2 --batch_size {batch_size}",
            "language_modeling",
            "--steps",
        ),
        "Recommendation": (
            "python3 train.py --data_dir %s/ml-20m/pro_sg/ --batch_size {batch_size}",
            "recommendation",
            "-n",
        ),
    }
)
"""(command template, working directory, num-steps argument) per model, as Gavel traces have them.

Used to write a trace line for a job that did not come from a trace (a synthetic workload).
"""

TRACE_MODES: tuple[AdaptationMode, ...] = (
    AdaptationMode.STATIC,
    AdaptationMode.ACCORDION,
    AdaptationMode.GNS,
)
"""Adaptation modes a trace line may name."""

TRACE_FIELDS: tuple[str, ...] = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "mode",
    "priority_weight",
    "slo",
    "duration_s",
    "arrival_s",
)
"""Names of a trace line's 12 fields, in order (field ``i`` is ``TRACE_FIELDS[i - 1]``)."""

TRAJECTORY_FORMAT_NOTE = (
    "per-job batch-size trajectory; regimes = [[batch_size, epochs], ...] in order; "
    "epoch_seconds_at_bs = seconds per epoch on the job's requested GPUs at that batch size"
)

_JOB_TYPE = re.compile(r"^(?P<model>.+) \(batch size (?P<batch_size>[1-9][0-9]*)\)$")
_THROUGHPUT_KEY = re.compile(r"^\('(?P<job_type>[^']+)', (?P<scale_factor>[0-9]+)\)$")


class FormatError(ValidationError):
    """Reference-format input that cannot be read: ``"<source> <location>: <message>"``.

    ``source`` names the input (a file name), ``location`` the place in it (``"line 7"``,
    ``"job 3"``, ``"key '(...)'"``), ``field`` the offending field as in :class:`ValidationError`.
    """

    def __init__(self, source: str, location: str, message: str, *, field: str = "") -> None:
        super().__init__(field or location, message)
        self.source = source
        self.location = location
        self.args = (f"{source} {location}: {message}",)

    def __str__(self) -> str:
        return f"{self.source} {self.location}: {self.message}"


class _BrokenRule(ValidationError):
    """A trace job's field breaks ``rule``; the parser reports it with the raw text instead."""

    def __init__(self, field: str, rule: str, value: object) -> None:
        super().__init__(field, f"{rule}, got {value!r}")
        self.rule = rule


class TraceFormatError(FormatError):
    """A malformed trace line; ``line_number`` counts from 1, blank lines included."""

    def __init__(self, source: str, line_number: int, message: str, *, field: str = "") -> None:
        super().__init__(source, f"line {line_number}", message, field=field)
        self.line_number = line_number


# --------------------------------------------------------------------------------------- trace


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One line of a Gavel trace, typed and checked.

    ``total_steps`` counts iterations at the initial batch size; ``scale_factor`` is the gang size
    in GPUs; ``slo`` is -1 for none; ``duration_s`` is the trace generator's target run time
    (informational); ``arrival_s`` is seconds from the trace start.
    """

    job_type: str
    command: str
    working_directory: str
    num_steps_arg: str
    needs_data_dir: bool
    total_steps: int
    scale_factor: int
    mode: AdaptationMode
    priority_weight: float
    slo: float
    duration_s: float
    arrival_s: float

    def __post_init__(self) -> None:
        for name in ("priority_weight", "slo", "duration_s", "arrival_s"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.mode in TRACE_MODES:
            object.__setattr__(self, "mode", AdaptationMode(self.mode))
        match = _JOB_TYPE.match(self.job_type)
        if match is None:
            raise _BrokenRule(
                "job_type", "must look like '<model> (batch size <n>)'", self.job_type
            )
        if match["model"] not in SAMPLES_PER_EPOCH:
            known = ", ".join(SAMPLES_PER_EPOCH)
            raise _BrokenRule(
                "job_type", f"must name a model of known size ({known})", self.job_type
            )
        if self.total_steps <= 0:
            raise _BrokenRule("total_steps", "must be positive", self.total_steps)
        if not is_valid_width(self.scale_factor):
            raise _BrokenRule("scale_factor", f"must be {width_rule()}", self.scale_factor)
        if self.mode not in TRACE_MODES:
            allowed = ", ".join(m.value for m in TRACE_MODES)
            raise _BrokenRule("mode", f"must be one of {allowed}", str(self.mode))
        if not (math.isfinite(self.priority_weight) and self.priority_weight > 0):
            raise _BrokenRule("priority_weight", "must be positive", self.priority_weight)
        if not math.isfinite(self.slo):
            raise _BrokenRule("slo", "must be finite", self.slo)
        for name, value in (("duration_s", self.duration_s), ("arrival_s", self.arrival_s)):
            if not (math.isfinite(value) and value >= 0):
                raise _BrokenRule(name, "must be >= 0", value)

    @property
    def model(self) -> str:
        """``"ResNet-18"`` for job type ``"ResNet-18 (batch size 32)"``."""
        return self.job_type.rsplit(" (batch size ", 1)[0]

    @property
    def initial_batch_size(self) -> int:
        """``32`` for job type ``"ResNet-18 (batch size 32)"``."""
        return int(self.job_type.rsplit(" (batch size ", 1)[1].rstrip(")"))

    @property
    def samples_per_epoch(self) -> int:
        return SAMPLES_PER_EPOCH[self.model]

    @property
    def num_epochs(self) -> int:
        """Whole epochs the job trains: total steps over iterations per epoch, rounded up."""
        iterations_per_epoch = math.ceil(self.samples_per_epoch / self.initial_batch_size)
        return math.ceil(self.total_steps / iterations_per_epoch)

    def fields(self) -> dict[str, str]:
        """The 12 fields as a trace line writes them, keyed by :data:`TRACE_FIELDS` names."""
        return {
            "job_type": self.job_type,
            "command": self.command,
            "working_directory": self.working_directory,
            "num_steps_arg": self.num_steps_arg,
            "needs_data_dir": "1" if self.needs_data_dir else "0",
            "total_steps": str(self.total_steps),
            "scale_factor": str(self.scale_factor),
            "mode": self.mode.value,
            "priority_weight": _format_number(self.priority_weight),
            "slo": _format_slo(self.slo),
            "duration_s": _format_number(self.duration_s),
            "arrival_s": _format_number(self.arrival_s),
        }

    def line(self) -> str:
        return "\t".join(self.fields().values())


def parse_trace(text: str, source: str) -> list[TraceJob]:
    """Jobs of a Gavel trace in line order; blank lines are skipped.

    Raises :class:`TraceFormatError` naming ``source``, the line and the field at fault.
    """
    jobs: list[TraceJob] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            jobs.append(_parse_trace_line(line, source, line_number))
    return jobs


def _parse_trace_line(line: str, source: str, line_number: int) -> TraceJob:
    cells = line.split("\t")
    if len(cells) != len(TRACE_FIELDS):
        raise TraceFormatError(
            source,
            line_number,
            f"expected {len(TRACE_FIELDS)} tab-separated fields, got {len(cells)}",
            field="line",
        )

    def cell(name: str) -> str:
        return cells[TRACE_FIELDS.index(name)]

    def fail(name: str, message: str) -> TraceFormatError:
        index = TRACE_FIELDS.index(name) + 1
        return TraceFormatError(
            source, line_number, f"field {index} ({name}) {message}", field=name
        )

    def integer(name: str) -> int:
        try:
            return int(cell(name))
        except ValueError:
            raise fail(name, f"must be a whole number, got {cell(name)!r}") from None

    def number(name: str) -> float:
        try:
            value = float(cell(name))
        except ValueError:
            raise fail(name, f"must be a number, got {cell(name)!r}") from None
        if not math.isfinite(value):
            raise fail(name, f"must be a finite number, got {cell(name)!r}")
        return value

    if cell("needs_data_dir") not in ("0", "1"):
        raise fail("needs_data_dir", f"must be 0 or 1, got {cell('needs_data_dir')!r}")
    mode = {m.value: m for m in TRACE_MODES}.get(cell("mode"))
    if mode is None:
        allowed = ", ".join(m.value for m in TRACE_MODES)
        raise fail("mode", f"must be one of {allowed}, got {cell('mode')!r}")
    try:
        return TraceJob(
            job_type=cell("job_type"),
            command=cell("command"),
            working_directory=cell("working_directory"),
            num_steps_arg=cell("num_steps_arg"),
            needs_data_dir=cell("needs_data_dir") == "1",
            total_steps=integer("total_steps"),
            scale_factor=integer("scale_factor"),
            mode=mode,
            priority_weight=number("priority_weight"),
            slo=number("slo"),
            duration_s=number("duration_s"),
            arrival_s=number("arrival_s"),
        )
    except _BrokenRule as error:
        raise fail(error.field, f"{error.rule}, got {cell(error.field)!r}") from None


def _format_number(value: float) -> str:
    """Whole numbers without a decimal point (as traces write them), others exactly."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _format_slo(value: float) -> str:
    text = f"{value:.6f}"
    return text if float(text) == value else repr(value)


# ---------------------------------------------------------------------------------- throughputs


@dataclass(frozen=True, slots=True)
class ThroughputTable:
    """Steps per second of a whole gang running alone, by ``(model, batch_size, gpus)``.

    Only the isolated rate (a table entry's ``"null"``) is kept: the simulator never co-locates
    jobs. A configuration measured at 0 steps/s (it did not fit or was not run) is absent, so
    :meth:`batch_sizes` lists only sizes a job can really use.

    Beyond the table's widest gang for a model (``W``, 8 GPUs in the reference tables) the
    rates come from a scaling model, so that a 16-, 32- or 64-GPU gang of a production trace
    has a throughput: on a valid width ``g > W`` a model runs the batch sizes it runs on ``W``
    at ``rate(W) * (g / W) ** e``, where ``e`` (:meth:`scaling_exponent`) is the model's
    data-parallel scaling exponent fitted to the table itself: the least-squares slope of log
    samples/s against log GPUs over every batch size the table has on two or more widths,
    clipped to [0, 1] (the reference TACC table gives 0.48 for LM, 0.82 for ResNet-18, 0.85 for
    Transformer and 0.97 for ResNet-50; 1 would be linear scaling). A model measured on one
    width only (Recommendation) has no slope and so no rate beyond it. :attr:`rates` holds the
    measured rates only.
    """

    rates: Mapping[tuple[str, int, int], float]
    gpu_type: str = "v100"
    _exponents: Mapping[str, float] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _widest: Mapping[str, int] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        for (model, batch_size, gpus), rate in self.rates.items():
            if not (math.isfinite(rate) and rate > 0):
                raise ValidationError(
                    f"rates[{model}, {batch_size}, {gpus}]", f"must be positive, got {rate!r}"
                )
        object.__setattr__(self, "rates", MappingProxyType(dict(sorted(self.rates.items()))))
        widest: dict[str, int] = {}
        for model, _, gpus in self.rates:
            widest[model] = max(widest.get(model, 0), gpus)
        object.__setattr__(self, "_widest", MappingProxyType(widest))
        object.__setattr__(self, "_exponents", MappingProxyType(_scaling_exponents(self.rates)))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({model for model, _, _ in self.rates}))

    def scale_factors(self, model: str) -> tuple[int, ...]:
        """GPU counts the table has a measured rate for, for ``model``, ascending."""
        return tuple(sorted({gpus for m, _, gpus in self.rates if m == model}))

    def scaling_exponent(self, model: str) -> float | None:
        """The model's fitted exponent ``e`` (class docstring); None when it has no slope."""
        return self._exponents.get(model)

    def _beyond(self, model: str, scale_factor: int) -> tuple[int, float] | None:
        """``(W, factor)``: rates on ``scale_factor`` GPUs are those on the model's widest
        measured width ``W`` times ``factor``; None when the scaling model does not apply."""
        widest = self._widest.get(model)
        exponent = self._exponents.get(model)
        if widest is None or exponent is None or scale_factor <= widest:
            return None
        if not is_valid_width(scale_factor):
            return None
        return widest, (scale_factor / widest) ** exponent

    def batch_sizes(self, model: str, scale_factor: int) -> tuple[int, ...]:
        """Batch sizes with a rate for ``model`` on ``scale_factor`` GPUs, ascending."""
        beyond = self._beyond(model, scale_factor)
        width = scale_factor if beyond is None else beyond[0]
        return tuple(bs for m, bs, gpus in self.rates if m == model and gpus == width)

    def steps_per_second(self, model: str, batch_size: int, scale_factor: int) -> float | None:
        beyond = self._beyond(model, scale_factor)
        if beyond is None:
            return self.rates.get((model, batch_size, scale_factor))
        widest, factor = beyond
        rate = self.rates.get((model, batch_size, widest))
        return None if rate is None else rate * factor

    def epoch_seconds(
        self, model: str, batch_size: int, scale_factor: int, samples_per_epoch: int
    ) -> float | None:
        """Seconds per epoch alone: (samples / batch size) / steps per second; None if unknown."""
        rate = self.steps_per_second(model, batch_size, scale_factor)
        return None if rate is None else samples_per_epoch / batch_size / rate

    def profile(self, model: str, scale_factor: int) -> ThroughputProfile:
        """Samples per second (steps/s x batch size) at every batch size the table knows."""
        rates: dict[int, float] = {}
        for bs in self.batch_sizes(model, scale_factor):
            rate = self.steps_per_second(model, bs, scale_factor)
            if rate is not None:
                rates[bs] = rate * bs
        return ThroughputProfile(rates)


def _scaling_exponents(rates: Mapping[tuple[str, int, int], float]) -> dict[str, float]:
    """Per model, the slope of log samples/s on log GPUs, pooled over the batch sizes measured
    on two or more widths (each batch size its own intercept), clipped to [0, 1]."""
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for (model, batch_size, gpus), rate in rates.items():
        series.setdefault((model, batch_size), []).append(
            (math.log(gpus), math.log(rate * batch_size))
        )
    moments: dict[str, list[float]] = {}
    for (model, _), points in series.items():
        if len({x for x, _ in points}) < 2:
            continue
        mean_x = sum(x for x, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        sums = moments.setdefault(model, [0.0, 0.0])
        sums[0] += sum((x - mean_x) * (y - mean_y) for x, y in points)
        sums[1] += sum((x - mean_x) ** 2 for x, _ in points)
    return {
        model: min(1.0, max(0.0, cov / var)) for model, (cov, var) in moments.items() if var > 0
    }


def parse_throughputs(
    obj: Mapping[str, object], source: str, gpu_type: str = "v100"
) -> ThroughputTable:
    """The ``gpu_type`` part of a Gavel throughput file (already parsed from JSON).

    Keys look like ``"('ResNet-18 (batch size 32)', 1)"``; job types without a batch size (A3C,
    CycleGAN) are skipped, as are entries whose isolated rate is 0.
    """
    by_key = obj.get(gpu_type)
    if not isinstance(by_key, Mapping):
        known = ", ".join(map(str, obj))
        raise FormatError(source, f"GPU type {gpu_type!r}", f"not in the file (has {known})")
    rates: dict[tuple[str, int, int], float] = {}
    for key, entry in by_key.items():
        location = f"{gpu_type} key {key!r}"
        key_match = _THROUGHPUT_KEY.match(str(key))
        if key_match is None:
            raise FormatError(source, location, "must look like \"('<job type>', <GPUs>)\"")
        job_type = _JOB_TYPE.match(key_match["job_type"])
        if job_type is None:
            continue
        rate = entry.get("null") if isinstance(entry, Mapping) else None
        if not (_is_number(rate) and 0 <= rate < math.inf):
            raise FormatError(source, location, f"needs a rate >= 0 under 'null', got {rate!r}")
        if rate > 0:
            model, batch_size = job_type["model"], int(job_type["batch_size"])
            rates[(model, batch_size, int(key_match["scale_factor"]))] = float(rate)
    return ThroughputTable(rates, gpu_type=gpu_type)


# --------------------------------------------------------------------------------- trajectories


@dataclass(frozen=True, slots=True)
class TrajectoryRecord:
    """One job of a trajectory file: its true regimes and epoch times, in trace order.

    ``epoch_seconds_at_bs`` maps batch size to seconds per epoch on the job's GPUs, alone.
    """

    job: int
    model: str
    num_epochs: int
    samples_per_epoch: int
    scale_factor: int
    regimes: tuple[Regime, ...]
    epoch_seconds_at_bs: dict[int, float]
    dataset: str = ""
    trace_duration_s: float | None = None


def parse_trajectories(obj: Mapping[str, object], source: str) -> list[TrajectoryRecord]:
    """Records of a trajectory file ``{"format": ..., "jobs": [...]}`` (already parsed JSON).

    Raises :class:`FormatError` naming ``source`` and the job (its position in the list).
    """
    jobs = obj.get("jobs")
    if not isinstance(jobs, list):
        raise FormatError(source, "top level", "needs a 'jobs' list", field="jobs")
    return [_parse_trajectory(entry, source, index) for index, entry in enumerate(jobs)]


def _parse_trajectory(entry: object, source: str, index: int) -> TrajectoryRecord:
    location = f"job {index}"
    if not isinstance(entry, Mapping):
        raise FormatError(source, location, "must be an object")

    def fail(name: str, message: str) -> FormatError:
        return FormatError(source, location, f"{name} {message}", field=name)

    def integer(name: str) -> int:
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(name, f"must be a whole number >= 0, got {value!r}")
        return value

    model = entry.get("model")
    if not isinstance(model, str) or not model:
        raise fail("model", f"must be a non-empty string, got {model!r}")
    raw_regimes = entry.get("regimes")
    if not isinstance(raw_regimes, list) or not raw_regimes:
        raise fail(
            "regimes", f"must be a non-empty list of [batch_size, epochs], got {raw_regimes!r}"
        )
    regimes = []
    for i, pair in enumerate(raw_regimes):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise fail(f"regimes[{i}]", f"must be [batch_size, epochs], got {pair!r}")
        try:
            regimes.append(Regime(batch_size=pair[0], epochs=pair[1]))
        except ValidationError as error:
            raise fail(f"regimes[{i}].{error.field}", error.message) from None
    raw_seconds = entry.get("epoch_seconds_at_bs")
    if not isinstance(raw_seconds, Mapping):
        raise fail("epoch_seconds_at_bs", f"must be an object, got {raw_seconds!r}")
    seconds: dict[int, float] = {}
    for key, value in raw_seconds.items():
        if not (str(key).isdigit() and int(key) > 0):
            raise fail("epoch_seconds_at_bs", f"has a key that is no batch size: {key!r}")
        if not (_is_number(value) and 0 < value < math.inf):
            raise fail(f"epoch_seconds_at_bs[{key}]", f"must be positive, got {value!r}")
        seconds[int(key)] = float(value)
    record = TrajectoryRecord(
        job=integer("job"),
        model=model,
        num_epochs=integer("num_epochs"),
        samples_per_epoch=integer("samples_per_epoch"),
        scale_factor=integer("scale_factor"),
        regimes=tuple(regimes),
        epoch_seconds_at_bs=seconds,
        dataset=str(entry.get("dataset", DATASETS.get(model, ""))),
        trace_duration_s=_optional_number(entry.get("trace_duration_s")),
    )
    total = sum(r.epochs for r in record.regimes)
    if total != record.num_epochs:
        raise fail("regimes", f"sum to {total} epochs but num_epochs is {record.num_epochs}")
    missing = sorted({r.batch_size for r in record.regimes} - set(seconds))
    if missing:
        raise fail("epoch_seconds_at_bs", f"lacks the regimes' batch sizes {missing}")
    return record


def _optional_number(value: object) -> float | None:
    return float(value) if _is_number(value) and math.isfinite(value) else None


def _is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number (``true`` and ``false`` are not numbers here)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------ workload


def build_workload(
    trace: Sequence[TraceJob],
    trajectories: Sequence[TrajectoryRecord],
    throughputs: ThroughputTable,
    name: str,
) -> Workload:
    """Join a trace, its trajectories and a throughput table into a simulator workload.

    Job ``i`` of the trace gets id ``str(i)``; its spec declares every batch size the table knows
    for its model and GPUs (the ladder Accordion and GNS move along). Raises
    :class:`FormatError` naming ``name`` and the job when the trace and the trajectory disagree,
    when the table lacks a batch size the job uses, or when arrivals go back in time.
    """
    if len(trace) != len(trajectories):
        raise FormatError(
            name,
            "jobs",
            f"the trace has {len(trace)} jobs but the trajectories have {len(trajectories)}",
            field="jobs",
        )
    jobs: list[SimJob] = []
    for index, (line, record) in enumerate(zip(trace, trajectories, strict=True)):
        if jobs and line.arrival_s < jobs[-1].spec.arrival_s:
            raise FormatError(
                name,
                f"job {index}",
                f"arrives at {line.arrival_s} s, before job {index - 1} "
                f"({jobs[-1].spec.arrival_s} s)",
                field="arrival_s",
            )
        jobs.append(_build_job(index, line, record, throughputs, name))
    return Workload(tuple(jobs), name=name)


def _build_job(
    index: int, line: TraceJob, record: TrajectoryRecord, throughputs: ThroughputTable, name: str
) -> SimJob:
    location = f"job {index}"
    agreement = (
        ("job", index, record.job),
        ("model", line.model, record.model),
        ("scale_factor", line.scale_factor, record.scale_factor),
        ("num_epochs", line.num_epochs, record.num_epochs),
        ("samples_per_epoch", line.samples_per_epoch, record.samples_per_epoch),
        ("initial_batch_size", line.initial_batch_size, record.regimes[0].batch_size),
    )
    for field_name, in_trace, in_trajectory in agreement:
        if in_trace != in_trajectory:
            raise FormatError(
                name,
                location,
                f"trace and trajectory disagree on {field_name}: "
                f"trace {in_trace!r}, trajectory {in_trajectory!r}",
                field=field_name,
            )
    ladder = throughputs.batch_sizes(line.model, line.scale_factor)
    missing = sorted({r.batch_size for r in record.regimes} - set(ladder))
    if missing:
        raise FormatError(
            name,
            location,
            f"the {throughputs.gpu_type} throughput table has no rate for {line.model} "
            f"at batch sizes {missing} on {line.scale_factor} GPUs",
            field="throughput",
        )
    try:
        spec = JobSpec(
            job_id=str(index),
            gpus=line.scale_factor,
            epochs=line.num_epochs,
            samples_per_epoch=line.samples_per_epoch,
            initial_batch_size=line.initial_batch_size,
            mode=line.mode,
            batch_sizes=ladder,
            throughput=throughputs.profile(line.model, line.scale_factor),
            arrival_s=line.arrival_s,
            budget=line.priority_weight,
            model=line.model,
        )
        return SimJob(
            spec=spec,
            trajectory=record.regimes,
            epoch_seconds=record.epoch_seconds_at_bs,
            trace_fields=line.fields(),
        )
    except ValidationError as error:
        raise FormatError(name, location, error.message, field=error.field) from None


def trace_job_of(job: SimJob) -> TraceJob:
    """The trace line of a workload job: its spec, plus its kept trace fields where they agree.

    A job that came from a trace gets its line back unchanged; a synthetic job gets Gavel's
    command for its model and its exclusive run time as the duration field.
    """
    spec = job.spec
    if SAMPLES_PER_EPOCH.get(spec.model) != spec.samples_per_epoch:
        raise ValidationError(
            "model",
            f"{spec.model!r} with {spec.samples_per_epoch} samples per epoch has no trace form",
        )
    batch_size = spec.initial_batch_size
    job_type = f"{spec.model} (batch size {batch_size})"
    kept = job.trace_fields if job.trace_fields.get("job_type") == job_type else {}
    command, working_directory, num_steps_arg = COMMANDS[spec.model]
    iterations_per_epoch = math.ceil(spec.samples_per_epoch / batch_size)
    total_steps = spec.epochs * iterations_per_epoch
    kept_steps = kept.get("total_steps", "")
    if kept_steps.isdigit() and math.ceil(int(kept_steps) / iterations_per_epoch) == spec.epochs:
        total_steps = int(kept_steps)
    return TraceJob(
        job_type=job_type,
        command=kept.get("command", command.format(batch_size=batch_size)),
        working_directory=kept.get("working_directory", working_directory),
        num_steps_arg=kept.get("num_steps_arg", num_steps_arg),
        needs_data_dir=kept.get("needs_data_dir", "1") == "1",
        total_steps=total_steps,
        scale_factor=spec.gpus,
        mode=spec.mode,
        priority_weight=float(spec.budget),
        slo=float(kept.get("slo", "-1")),
        duration_s=float(kept.get("duration_s", round(job.t_exclusive_s))),
        arrival_s=float(spec.arrival_s),
    )


def format_trace(workload: Workload) -> str:
    """The workload as Gavel trace text, one line per job in workload order."""
    return "".join(trace_job_of(job).line() + "\n" for job in workload.jobs)


def format_trajectories(workload: Workload) -> dict[str, object]:
    """The workload's trajectories in the trajectory-file shape (ready for ``json.dumps``).

    Jobs are numbered by position, which is the id :func:`build_workload` gives them back.
    """
    jobs: list[dict[str, object]] = []
    for index, job in enumerate(workload.jobs):
        spec = job.spec
        duration = trace_job_of(job).duration_s
        jobs.append(
            {
                "job": index,
                "model": spec.model,
                "dataset": DATASETS.get(spec.model, ""),
                "num_epochs": spec.epochs,
                "samples_per_epoch": spec.samples_per_epoch,
                "scale_factor": spec.gpus,
                "trace_duration_s": int(duration) if duration.is_integer() else duration,
                "regimes": [[r.batch_size, r.epochs] for r in job.trajectory],
                "epoch_seconds_at_bs": {
                    str(bs): seconds for bs, seconds in sorted(job.epoch_seconds.items())
                },
            }
        )
    return {"format": TRAJECTORY_FORMAT_NOTE, "jobs": jobs}
