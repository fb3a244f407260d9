"""A production job log (one job per CSV row) as a simulator workload: the import rule.

A cluster's job log says when each job arrived, how many GPUs it held and how long it ran; the
simulator also needs a model, a batch-size trajectory and a number of epochs. Columns are found
by name in the header (case-insensitive, first match wins):

- arrival: ``submission_time``, ``arrival_s``, ``arrival``, ``submit_time`` or ``timestamp``:
  seconds (any real number) or an ISO 8601 date-time (``2021-03-04T09:30:00Z``; without a zone
  it is UTC);
- run time: ``duration``, ``duration_s`` or ``run_time``: seconds, above 0;
- GPUs: ``num_gpu``, ``num_gpus`` or ``gpus``: a whole number;
- optional ``model`` (one of :data:`~shockwave.workloads.traces.SAMPLES_PER_EPOCH`), ``batch_size``
  (one the throughput table knows for the model on the job's width), ``mode`` (``static``,
  ``accordion``, ``gns``), ``tenant``; an empty cell counts as absent. ``job_id`` (or ``id``) is
  kept for the report.

What the log lacks is assigned by the **default rule**, seeded per row: job ``k`` of the log
(its data line number ``k``) draws from ``numpy.random.default_rng([seed, k])``, so a row gets
the same assignment whatever window or other rows are imported with it. In order:

1. Size class: the job's real GPU-hours (run time x GPUs) name a class of
   :data:`~shockwave.workloads.generator.SIZE_CLASSES` (below the smallest: Small; above the
   largest: XL).
2. Model, unless given: uniform among :data:`MODELS_BY_SIZE_CLASS` of that class that the
   table can run on the job's width (within the table, or beyond it by the table's scaling
   model, :class:`~shockwave.workloads.traces.ThroughputTable`) and whose fastest epoch on that
   width is no longer than the real run time (so one epoch fits); when none is that fast, every
   model of the class that runs on the width; when the class has none on the width, every model that
   does.
3. Initial batch size, unless given: uniform among the table's batch sizes for the model and
   width whose epoch fits in the real run time (all of them when none does).
4. Mode, unless given: drawn from :data:`~shockwave.workloads.generator.MODE_MIX` (half Accordion,
   half GNS); its trajectory shape drawn by the generator's rule
   (:func:`~shockwave.workloads.generator.draw_shape`).
5. Epochs: as many as make the job's exclusive run time on its own width its real run time (at
   least one), as the generator does for a drawn size.

Rows are kept in arrival order (log order among equal arrivals). A row outside the time window
``[since, until)`` (arrival times as in the log), wider than ``max_gpus``, or on a width no model
of the table runs on, is dropped and reported with its line and reason; with ``rebase`` the first
kept arrival becomes time 0.

A row whose GPU count is not a gang size (3, 6, 12, 24 GPUs: data-parallel gangs here are powers
of two) is kept, **reshaped** to the nearest gang size by ratio within ``max_gpus``
(:func:`~shockwave.domain.model.nearest_width`: 3 -> 4, 5 -> 4, 6 -> 8, 12 -> 16) with its run
time scaled by logged GPUs / gang size, so that it asks the cluster for the GPU-seconds the log
says it used (6 GPUs for 4 h become 8 GPUs for 3 h); the report lists each such row. Only a
row wider than ``max_gpus`` is dropped for its width.

A row that cannot be read (a missing or malformed cell, an unknown model, a batch size the table
lacks) is a :class:`LogFormatError` naming every such line, unless ``skip_bad_rows`` drops them
into the report instead.

Pure: the caller reads the CSV file and hands over its text.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType

import numpy as np

from shockwave.domain.model import AdaptationMode, ValidationError, is_valid_width, nearest_width
from shockwave.workloads.generator import (
    MODE_MIX,
    SIZE_CLASSES,
    draw_shape,
    job_lines,
    pick,
    size_class_of,
)
from shockwave.workloads.traces import (
    SAMPLES_PER_EPOCH,
    TRACE_MODES,
    FormatError,
    ThroughputTable,
    TraceJob,
    TrajectoryRecord,
    build_workload,
)
from shockwave.workloads.workload import Workload

ARRIVAL_COLUMNS = ("submission_time", "arrival_s", "arrival", "submit_time", "timestamp")
DURATION_COLUMNS = ("duration", "duration_s", "run_time")
GPU_COLUMNS = ("num_gpu", "num_gpus", "gpus")
ID_COLUMNS = ("job_id", "id")

MODELS_BY_SIZE_CLASS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "Small": ("ResNet-18", "ResNet-50", "Transformer", "LM", "Recommendation"),
        "Medium": ("ResNet-18", "ResNet-50", "Transformer", "LM"),
        "Large": ("ResNet-18", "ResNet-50", "Transformer", "LM"),
        "XL": ("ResNet-18", "ResNet-50", "Transformer", "LM"),
    }
)
"""Models a job of each size class may be given: the reference traces' mix (Recommendation, a
one-GPU model in the reference tables, appears only among Small jobs there)."""

_MODELS = tuple(SAMPLES_PER_EPOCH)

MAX_BAD_ROWS_SHOWN = 20
"""A :class:`LogFormatError` names at most this many bad lines (and counts the rest)."""


class LogFormatError(FormatError):
    """Rows of a job log that cannot be read: ``bad`` lists ``(line, message)`` for each."""

    def __init__(self, source: str, bad: Sequence[tuple[int, str]]) -> None:
        shown = "; ".join(f"line {line}: {message}" for line, message in bad[:MAX_BAD_ROWS_SHOWN])
        more = len(bad) - MAX_BAD_ROWS_SHOWN
        suffix = f"; and {more} more bad rows" if more > 0 else ""
        location = f"line {bad[0][0]}" if len(bad) == 1 else f"{len(bad)} bad rows"
        message = bad[0][1] if len(bad) == 1 else shown + suffix
        super().__init__(source, location, message, field="rows")
        self.bad = tuple(bad)


@dataclass(frozen=True, slots=True)
class LogJob:
    """One readable row: ``line`` is its line in the file (the header is line 1)."""

    line: int
    job_id: str
    arrival_s: float
    duration_s: float
    gpus: int
    model: str | None = None
    batch_size: int | None = None
    mode: AdaptationMode | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Dropped:
    """A row left out of the workload and why (``reason`` is a short, countable phrase)."""

    line: int
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Reshaped:
    """A row kept on another gang size than its log's: ``logged_gpus`` for ``duration_s``
    seconds became ``gpus`` for ``duration_s * logged_gpus / gpus``."""

    line: int
    job_id: str
    logged_gpus: int
    gpus: int


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """The window ``[since, until)`` in the log's own time (seconds; None: open), whether to
    rebase the first kept arrival to 0, the widest gang kept (None: any gang size), whether
    unreadable rows are dropped rather than fatal, and the seed of the default rule."""

    seed: int = 0
    since: float | None = None
    until: float | None = None
    rebase: bool = True
    max_gpus: int | None = None
    skip_bad_rows: bool = False


@dataclass(frozen=True, slots=True)
class ImportResult:
    """The imported workload (job ``i`` is the row ``kept[i]``, as imported: a reshaped row with
    its gang size and run time; its trace line ``trace[i]`` and trajectory ``trajectories[i]``),
    every dropped row in line order, the data rows read, the seconds subtracted from the log's
    times (``offset_s``), and the rows reshaped to a gang size, in line order."""

    workload: Workload
    kept: tuple[LogJob, ...]
    dropped: tuple[Dropped, ...]
    rows: int
    offset_s: float
    trace: tuple[TraceJob, ...]
    trajectories: tuple[TrajectoryRecord, ...]
    reshaped: tuple[Reshaped, ...] = ()

    def dropped_by_reason(self) -> dict[str, int]:
        return dict(Counter(d.reason for d in self.dropped).most_common())


def parse_time(text: str) -> float:
    """Seconds from a cell: a real number, or an ISO 8601 date-time as POSIX seconds (UTC when
    it names no zone). Raises ValueError on anything else."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number of seconds, got {text!r}")
        return value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"must be seconds or an ISO 8601 date-time (2021-03-04T09:30:00Z), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_job_log(text: str, source: str) -> tuple[list[LogJob], list[tuple[int, str]], int]:
    """The readable rows of a CSV job log, the unreadable ones as ``(line, message)``, and the
    number of data rows. Raises :class:`FormatError` when the header lacks a required column."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise FormatError(
            source, "line 1", "is empty: needs a header row", field="header"
        ) from None
    names = [name.strip().lower() for name in header]

    def column(candidates: Sequence[str], required: bool) -> int | None:
        for candidate in candidates:
            if candidate in names:
                return names.index(candidate)
        if required:
            raise FormatError(
                source,
                "line 1",
                f"the header has no {' / '.join(candidates)} column (has {', '.join(names)})",
                field="header",
            )
        return None

    arrival = column(ARRIVAL_COLUMNS, True)
    duration = column(DURATION_COLUMNS, True)
    gpus = column(GPU_COLUMNS, True)
    job_id = column(ID_COLUMNS, False)
    optional = {name: column((name,), False) for name in ("model", "batch_size", "mode", "tenant")}
    jobs: list[LogJob] = []
    bad: list[tuple[int, str]] = []
    rows = 0
    try:
        for cells in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            rows += 1
            try:
                jobs.append(_row(cells, line, arrival, duration, gpus, job_id, optional))
            except ValueError as error:
                bad.append((line, str(error)))
    except csv.Error as error:  # a NUL byte, an unterminated quote, an oversized field
        raise FormatError(
            source, f"line {reader.line_num}", f"is not CSV: {error}", field="rows"
        ) from None
    return jobs, bad, rows


def _row(
    cells: Sequence[str],
    line: int,
    arrival: int | None,
    duration: int | None,
    gpus: int | None,
    job_id: int | None,
    optional: Mapping[str, int | None],
) -> LogJob:
    def cell(index: int | None) -> str:
        if index is None or index >= len(cells):
            return ""
        return cells[index].strip()

    def required(index: int | None, name: str) -> str:
        value = cell(index)
        if not value:
            raise ValueError(f"{name} is missing")
        return value

    arrival_text = required(arrival, "arrival")
    try:
        arrival_s = parse_time(arrival_text)
    except ValueError as error:
        raise ValueError(f"arrival {error}") from None
    run = required(duration, "duration")
    try:
        duration_s = float(run)
    except ValueError:
        raise ValueError(f"duration must be seconds, got {run!r}") from None
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration must be a number of seconds above 0, got {run!r}")
    width_text = required(gpus, "GPU count")
    try:
        width = int(width_text)
    except ValueError:
        raise ValueError(f"GPU count must be a whole number, got {width_text!r}") from None
    if width <= 0:
        raise ValueError(f"GPU count must be at least 1, got {width}")
    model = cell(optional["model"]) or None
    if model is not None and model not in SAMPLES_PER_EPOCH:
        raise ValueError(f"model {model!r} is not one of {', '.join(SAMPLES_PER_EPOCH)}")
    batch_text = cell(optional["batch_size"])
    batch_size = None
    if batch_text:
        if not batch_text.isdigit() or int(batch_text) <= 0:
            raise ValueError(f"batch_size must be a whole number above 0, got {batch_text!r}")
        batch_size = int(batch_text)
    mode_text = cell(optional["mode"])
    mode = None
    if mode_text:
        modes = {m.value: m for m in TRACE_MODES}
        mode = modes.get(mode_text.lower())
        if mode is None:
            raise ValueError(f"mode must be one of {', '.join(modes)}, got {mode_text!r}")
    return LogJob(
        line=line,
        job_id=cell(job_id) or f"line-{line}",
        arrival_s=arrival_s,
        duration_s=duration_s,
        gpus=width,
        model=model,
        batch_size=batch_size,
        mode=mode,
        tenant=cell(optional["tenant"]) or None,
    )


def import_job_log(
    text: str, source: str, throughputs: ThroughputTable, options: ImportOptions
) -> ImportResult:
    """The workload of the CSV job log ``text`` by the module's rule.

    Raises :class:`LogFormatError` naming every unreadable row (unless
    ``options.skip_bad_rows``), :class:`FormatError` for a header without a required column,
    and :class:`ValidationError` when nothing is left to import.
    """
    jobs, bad, rows = parse_job_log(text, source)
    dropped = [Dropped(line, "", f"unreadable: {message}") for line, message in bad]
    if bad and not options.skip_bad_rows:
        raise LogFormatError(source, bad)
    kept: list[LogJob] = []
    reshaped: list[Reshaped] = []
    for logged in jobs:
        job = _as_gang(logged, options)
        reason = _drop_reason(job, throughputs, options)
        if reason is not None:
            dropped.append(Dropped(job.line, job.job_id, reason))
            continue
        kept.append(job)
        if job.gpus != logged.gpus:
            reshaped.append(Reshaped(job.line, job.job_id, logged.gpus, job.gpus))
    problems = {job.line: _given_fields_problem(job, throughputs) for job in kept}
    unusable = [(line, message) for line, message in problems.items() if message is not None]
    if unusable and not options.skip_bad_rows:
        raise LogFormatError(source, unusable)
    dropped += [
        Dropped(job.line, job.job_id, f"unreadable: {problems[job.line]}")
        for job in kept
        if problems[job.line] is not None
    ]
    kept = sorted(
        (job for job in kept if problems[job.line] is None), key=lambda j: (j.arrival_s, j.line)
    )
    imported = {job.line for job in kept}
    if not kept:
        raise ValidationError("rows", f"{source}: no job left to import ({rows} rows read)")
    offset = kept[0].arrival_s if options.rebase else 0.0
    trace: list[TraceJob] = []
    records: list[TrajectoryRecord] = []
    for index, job in enumerate(kept):
        line, record = assign(index, job, job.arrival_s - offset, throughputs, options.seed)
        trace.append(line)
        records.append(record)
    workload = build_workload(trace, records, throughputs, source)
    return ImportResult(
        workload=workload,
        kept=tuple(kept),
        dropped=tuple(sorted(dropped, key=lambda d: d.line)),
        rows=rows,
        offset_s=offset,
        trace=tuple(trace),
        trajectories=tuple(records),
        reshaped=tuple(r for r in reshaped if r.line in imported),
    )


def _as_gang(job: LogJob, options: ImportOptions) -> LogJob:
    """The row on the nearest gang size with the same GPU-seconds (module docstring); the row
    itself when its width is a gang size or wider than ``options.max_gpus`` (dropped then)."""
    if is_valid_width(job.gpus):
        return job
    if options.max_gpus is not None and job.gpus > options.max_gpus:
        return job
    gpus = nearest_width(job.gpus, options.max_gpus)
    return replace(job, gpus=gpus, duration_s=job.duration_s * job.gpus / gpus)


def _drop_reason(job: LogJob, throughputs: ThroughputTable, options: ImportOptions) -> str | None:
    if options.since is not None and job.arrival_s < options.since:
        return "before --since"
    if options.until is not None and job.arrival_s >= options.until:
        return "at or after --until"
    if options.max_gpus is not None and job.gpus > options.max_gpus:
        return f"wider than the cluster ({job.gpus} GPUs > {options.max_gpus})"
    if not _models_on(throughputs, job.gpus, _MODELS):
        return f"no model of the throughput table runs on {job.gpus} GPUs"
    return None


def _given_fields_problem(job: LogJob, throughputs: ThroughputTable) -> str | None:
    """Why the row's own model or batch size cannot be used on its width; None when fine."""
    if job.model is not None and not throughputs.batch_sizes(job.model, job.gpus):
        return f"the throughput table has no rate for {job.model} on {job.gpus} GPUs"
    if job.batch_size is not None:
        models = (job.model,) if job.model else _models_on(throughputs, job.gpus, _MODELS)
        if not any(job.batch_size in throughputs.batch_sizes(m, job.gpus) for m in models):
            return (
                f"the throughput table has no batch size {job.batch_size} for "
                f"{job.model or 'any model'} on {job.gpus} GPUs"
            )
    return None


def _models_on(throughputs: ThroughputTable, width: int, models: Sequence[str]) -> tuple[str, ...]:
    return tuple(m for m in models if throughputs.batch_sizes(m, width))


def _epoch_s(throughputs: ThroughputTable, model: str, batch_size: int, width: int) -> float:
    seconds = throughputs.epoch_seconds(model, batch_size, width, SAMPLES_PER_EPOCH[model])
    return math.inf if seconds is None else seconds


def assign(
    index: int, job: LogJob, arrival_s: float, throughputs: ThroughputTable, seed: int
) -> tuple[TraceJob, TrajectoryRecord]:
    """Job ``index``'s trace line and trajectory by the default rule (module docstring), drawing
    from ``default_rng([seed, job.line])``; ``arrival_s`` is its (rebased) arrival."""
    rng = np.random.default_rng([seed, job.line])
    width = job.gpus
    gpu_hours = job.duration_s * width / 3600.0
    lowest, highest = SIZE_CLASSES[0].min_gpu_hours, SIZE_CLASSES[-1].max_gpu_hours
    size_class = size_class_of(min(max(gpu_hours, lowest), highest))
    model = job.model
    if model is None:
        runnable = _models_on(throughputs, width, _MODELS)
        of_class = [m for m in MODELS_BY_SIZE_CLASS[size_class] if m in runnable]
        pool = of_class or list(runnable)
        fitting = [
            m
            for m in pool
            if min(_epoch_s(throughputs, m, bs, width) for bs in throughputs.batch_sizes(m, width))
            <= job.duration_s
        ]
        pool = fitting or pool
        model = pool[int(rng.integers(len(pool)))]
    ladder = throughputs.batch_sizes(model, width)
    initial = job.batch_size
    if initial is None:
        fits = [bs for bs in ladder if _epoch_s(throughputs, model, bs, width) <= job.duration_s]
        sizes = fits or list(ladder)
        initial = sizes[int(rng.integers(len(sizes)))]
    mode = job.mode
    if mode is None:
        modes = list(MODE_MIX)
        mode = modes[pick(rng, [MODE_MIX[m] for m in modes])]
    shape = draw_shape(rng, mode, initial, ladder)
    line, record = job_lines(
        index, float(arrival_s), width, model, mode, shape, job.duration_s, throughputs
    )
    return line, record


WEEK_S = 7 * 86400.0


def busiest_window(jobs: Sequence[LogJob], length_s: float = WEEK_S) -> tuple[float, float]:
    """``(since, until)``: the window of ``length_s`` seconds, starting at a job's arrival, in
    which the jobs that arrive ask for the most GPU-seconds (run time x GPUs); the earliest such
    window on ties. Raises ValueError for no jobs."""
    if not jobs:
        raise ValueError("no jobs")
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.line))
    best_start, best_demand, demand, end = ordered[0].arrival_s, -1.0, 0.0, 0
    for job in ordered:
        while end < len(ordered) and ordered[end].arrival_s < job.arrival_s + length_s:
            demand += ordered[end].duration_s * ordered[end].gpus
            end += 1
        if demand > best_demand:
            best_start, best_demand = job.arrival_s, demand
        demand -= job.duration_s * job.gpus
    return best_start, best_start + length_s


def mean_demand_gpus(jobs: Sequence[LogJob], length_s: float) -> float:
    """The GPUs the jobs ask for on average over ``length_s`` seconds: their GPU-seconds (run
    time x GPUs) over the window's length."""
    return sum(j.duration_s * j.gpus for j in jobs) / length_s
