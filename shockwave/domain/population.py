"""The population prior: what finished jobs teach about the jobs still running (empirical Bayes).

The paper's predictor (section 5) starts every job from the same uninformed prior, Dir(E/K, ...,
E/K): it expects K regimes of equal length whatever the job. A scheduler that has watched jobs
finish knows better: which models really adapt under a mode, where their batch size changes, how
fast each batch size runs. This module keeps that knowledge as plain values:

- :class:`FinishedJob`: what a scheduler saw of a job that finished (declared shape, observed
  trajectory, measured epoch times); never anything it could not have observed.
- :class:`Template`: a finished job's trajectory, kept per group (adaptation mode, model, initial
  batch size), the empirical distribution the population predictor
  (:mod:`shockwave.prediction.population_predictor`) conditions on. Each regime carries its batch
  size and a
  *symbol* that places the size on the job's ladder (rung 0 = the initial size, :data:`TOP` = the
  largest), so a template can be replayed on a job of the same model with another initial size.
- rates: samples per second by (model, GPUs, batch size), averaged over the finished jobs that
  measured them, for the throughput model (:mod:`shockwave.prediction.throughput_model`); a job that
  names no model teaches no rate (its rates would mix with any other unnamed model's).
- size steps: log(rate at b / rate at a) by (model, GPUs, a, b), summed over the finished jobs
  that measured both sizes, so that the throughput model can carry a job's speed from one size
  to another by what one job's rates did, not by the ratio of different jobs' mean rates.
- declaration errors: how far the rates users declared were from what their jobs measured (the
  squared log ratio, summed over every batch size a finished job both declared and measured),
  so the throughput model learns how much to trust a declaration.

:class:`PopulationPrior` is immutable; :meth:`PopulationPrior.learn` returns the prior with one
more finished job. The simulator learns each job as it finishes in the run (no look-ahead), the
service when a job succeeds (stored as JSON: :meth:`PopulationPrior.as_json`). Each group keeps
its ``max_per_group`` most recent templates, so the prior follows drift and stays bounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shockwave.domain.model import AdaptationMode, JobSpec, Regime

TOP = 1_000_000
"""Symbol of a job's largest batch size, whatever its rung."""

GroupKey = tuple[AdaptationMode, str, int]
"""(adaptation mode, model, initial batch size)."""
RateKey = tuple[str, int, int]
"""(model, GPUs, batch size)."""
StepKey = tuple[str, int, int, int]
"""(model, GPUs, from batch size, to batch size)."""

DEFAULT_MAX_PER_GROUP = 256
"""Templates kept per group: enough for a stable estimate, bounded for storage."""


class PriorFormatError(ValueError):
    """A stored prior that cannot be read back."""


def ladder_of(spec: JobSpec) -> tuple[int, ...]:
    """Every batch size the job declares or starts at, ascending."""
    return tuple(sorted({spec.initial_batch_size, *spec.batch_sizes}))


def symbol_of(batch_size: int, initial: int, ladder: Sequence[int]) -> int:
    """Where ``batch_size`` sits on a job's ``ladder``: :data:`TOP` for its largest size, else
    rungs above (or, negative, below) its initial size."""
    sizes = sorted({*ladder, initial, batch_size})
    if batch_size == sizes[-1] and batch_size != initial:
        return TOP
    return sizes.index(batch_size) - sizes.index(initial)


def size_of(symbol: int, initial: int, ladder: Sequence[int]) -> int:
    """The batch size ``symbol`` stands for on a job's ``ladder`` (clipped to its ends)."""
    sizes = sorted({*ladder, initial})
    if symbol == TOP:
        return sizes[-1]
    index = min(max(sizes.index(initial) + symbol, 0), len(sizes) - 1)
    return sizes[index]


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A job that finished, as its scheduler saw it.

    ``regimes``: its whole observed trajectory (its scaling events cut it; the epochs sum to the
    job's). ``measured_epoch_seconds``: seconds per epoch it measured at each batch size.
    """

    spec: JobSpec
    regimes: tuple[Regime, ...]
    measured_epoch_seconds: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "measured_epoch_seconds", MappingProxyType(dict(self.measured_epoch_seconds))
        )

    @property
    def group(self) -> GroupKey:
        return (self.spec.mode, self.spec.model, self.spec.initial_batch_size)

    @property
    def adaptable(self) -> bool:
        """Whether the job could have changed batch size: a dynamic mode and room to grow."""
        spec = self.spec
        return spec.mode is not AdaptationMode.STATIC and (
            spec.mode is AdaptationMode.CUSTOM or spec.initial_batch_size < spec.max_batch_size
        )

    def template(self) -> Template | None:
        """The trajectory as a template; None when it teaches nothing about adaptation (the job
        could not adapt) or does not describe the whole job."""
        regimes = [r for r in self.regimes if r.epochs > 0]
        if not self.adaptable or not regimes or sum(r.epochs for r in regimes) != self.spec.epochs:
            return None
        initial, ladder = self.spec.initial_batch_size, ladder_of(self.spec)
        return Template(
            epochs=self.spec.epochs,
            batch_sizes=tuple(r.batch_size for r in regimes),
            symbols=tuple(symbol_of(r.batch_size, initial, ladder) for r in regimes),
            lengths=tuple(r.epochs for r in regimes),
        )


@dataclass(frozen=True, slots=True)
class Template:
    """A finished job's trajectory: ``lengths[i]`` epochs at ``batch_sizes[i]`` (``symbols[i]``
    on its ladder); ``epochs`` is their sum."""

    epochs: int
    batch_sizes: tuple[int, ...]
    symbols: tuple[int, ...]
    lengths: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RateStat:
    """``jobs`` finished jobs measured ``samples_per_second`` on average at one (model, GPUs,
    batch size)."""

    jobs: int
    samples_per_second: float

    def add(self, rate: float) -> RateStat:
        jobs = self.jobs + 1
        return RateStat(jobs, self.samples_per_second + (rate - self.samples_per_second) / jobs)


@dataclass(frozen=True, slots=True)
class StepStat:
    """``jobs`` jobs measured both sizes of a step; their log(rate at to / rate at from) sum to
    ``log_ratio_sum``."""

    jobs: int
    log_ratio_sum: float

    def add(self, log_ratio: float) -> StepStat:
        return StepStat(self.jobs + 1, self.log_ratio_sum + log_ratio)


def size_steps(spec: JobSpec, measured: Mapping[int, float]) -> list[tuple[StepKey, float]]:
    """(key, log(rate at b / rate at a)) for every ordered pair of distinct batch sizes a, b
    the job measured (``measured``: seconds per epoch), in the order of ``measured``; none for
    a job that names no model (its steps would mix with any other unnamed model's)."""
    if not spec.model:
        return []
    seconds = {bs: x for bs, x in measured.items() if x > 0 and math.isfinite(x)}
    return [
        ((spec.model, spec.gpus, a, b), math.log(seconds[a] / seconds[b]))
        for a in seconds
        for b in seconds
        if a != b
    ]


@dataclass(frozen=True, slots=True)
class DeclarationErrors:
    """``count`` (declared, measured) pairs whose squared log ratios sum to ``sum_sq``."""

    count: int = 0
    sum_sq: float = 0.0

    def add(self, pairs: Sequence[tuple[float, float]]) -> DeclarationErrors:
        """With each (declared rate, measured rate) of ``pairs`` added."""
        errors = [math.log(d / m) ** 2 for d, m in pairs if d > 0 and m > 0]
        return DeclarationErrors(self.count + len(errors), self.sum_sq + sum(errors))


def declaration_pairs(spec: JobSpec, measured: Mapping[int, float]) -> list[tuple[float, float]]:
    """(declared, measured) samples/s at every batch size ``spec`` declares and the job has
    measured (``measured``: seconds per epoch)."""
    declared = spec.throughput.samples_per_second
    return [
        (declared[bs], spec.samples_per_epoch / seconds)
        for bs, seconds in measured.items()
        if bs in declared and seconds > 0 and math.isfinite(seconds)
    ]


@dataclass(frozen=True, slots=True)
class PopulationPrior:
    """Templates by group, measured rates, declaration errors and size steps
    (:func:`size_steps`), learnt from ``learnt`` finished jobs."""

    templates: Mapping[GroupKey, tuple[Template, ...]] = field(default_factory=dict)
    rates: Mapping[RateKey, RateStat] = field(default_factory=dict)
    learnt: int = 0
    max_per_group: int = DEFAULT_MAX_PER_GROUP
    declarations: DeclarationErrors = field(default_factory=DeclarationErrors)
    steps: Mapping[StepKey, StepStat] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", MappingProxyType(dict(self.templates)))
        object.__setattr__(self, "rates", MappingProxyType(dict(self.rates)))
        object.__setattr__(self, "steps", MappingProxyType(dict(self.steps)))
        if self.max_per_group <= 0:
            raise ValueError(f"max_per_group must be > 0, got {self.max_per_group}")

    def learn(self, job: FinishedJob) -> PopulationPrior:
        """This prior with ``job`` learnt: its template (when it is whole), its rates and how
        far its declared rates were from them."""
        templates = dict(self.templates)
        template = job.template()
        if template is not None:
            kept = (*templates.get(job.group, ()), template)
            templates[job.group] = kept[-self.max_per_group :]
        rates = dict(self.rates)
        for batch_size, seconds in job.measured_epoch_seconds.items():
            if seconds > 0 and math.isfinite(seconds) and job.spec.model:
                key = (job.spec.model, job.spec.gpus, batch_size)
                rate = job.spec.samples_per_epoch / seconds
                rates[key] = rates.get(key, RateStat(0, 0.0)).add(rate)
        declarations = self.declarations.add(
            declaration_pairs(job.spec, job.measured_epoch_seconds)
        )
        steps = dict(self.steps)
        for step, log_ratio in size_steps(job.spec, job.measured_epoch_seconds):
            steps[step] = steps.get(step, StepStat(0, 0.0)).add(log_ratio)
        return PopulationPrior(
            templates, rates, self.learnt + 1, self.max_per_group, declarations, steps
        )

    def group(self, key: GroupKey) -> tuple[Template, ...]:
        return self.templates.get(key, ())

    def as_json(self) -> dict[str, Any]:
        """JSON-ready: ``{learnt, max_per_group, groups: [{mode, model, initial_batch_size,
        templates: [{epochs, batch_sizes, symbols, lengths}]}], rates: [{model, gpus,
        batch_size, jobs, samples_per_second}], declarations: {count, sum_sq}, steps: [{model,
        gpus, from_batch_size, to_batch_size, jobs, log_ratio_sum}]}``."""
        return {
            "learnt": self.learnt,
            "max_per_group": self.max_per_group,
            "declarations": {
                "count": self.declarations.count,
                "sum_sq": self.declarations.sum_sq,
            },
            "groups": [
                {
                    "mode": mode.value,
                    "model": model,
                    "initial_batch_size": initial,
                    "templates": [
                        {
                            "epochs": t.epochs,
                            "batch_sizes": list(t.batch_sizes),
                            "symbols": list(t.symbols),
                            "lengths": list(t.lengths),
                        }
                        for t in templates
                    ],
                }
                for (mode, model, initial), templates in self.templates.items()
            ],
            "rates": [
                {
                    "model": model,
                    "gpus": gpus,
                    "batch_size": batch_size,
                    "jobs": stat.jobs,
                    "samples_per_second": stat.samples_per_second,
                }
                for (model, gpus, batch_size), stat in self.rates.items()
            ],
            "steps": [
                {
                    "model": model,
                    "gpus": gpus,
                    "from_batch_size": a,
                    "to_batch_size": b,
                    "jobs": stat.jobs,
                    "log_ratio_sum": stat.log_ratio_sum,
                }
                for (model, gpus, a, b), stat in self.steps.items()
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PopulationPrior:
        """The prior :meth:`as_json` wrote; :class:`PriorFormatError` when it is malformed. A
        prior stored without ``steps`` reads back with none."""
        try:
            templates = {
                (AdaptationMode(g["mode"]), str(g["model"]), int(g["initial_batch_size"])): tuple(
                    Template(
                        epochs=int(t["epochs"]),
                        batch_sizes=tuple(int(b) for b in t["batch_sizes"]),
                        symbols=tuple(int(s) for s in t["symbols"]),
                        lengths=tuple(int(n) for n in t["lengths"]),
                    )
                    for t in g["templates"]
                )
                for g in data["groups"]
            }
            rates = {
                (str(r["model"]), int(r["gpus"]), int(r["batch_size"])): RateStat(
                    int(r["jobs"]), float(r["samples_per_second"])
                )
                for r in data["rates"]
            }
            declared = data["declarations"]
            declarations = DeclarationErrors(int(declared["count"]), float(declared["sum_sq"]))
            steps = {
                (
                    str(r["model"]),
                    int(r["gpus"]),
                    int(r["from_batch_size"]),
                    int(r["to_batch_size"]),
                ): StepStat(int(r["jobs"]), float(r["log_ratio_sum"]))
                for r in data.get("steps", ())
            }
            return cls(
                templates,
                rates,
                int(data["learnt"]),
                int(data["max_per_group"]),
                declarations,
                steps,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise PriorFormatError(f"unreadable population prior: {error!r}") from error


EMPTY_PRIOR = PopulationPrior()
"""The prior before any job has finished: every prediction falls back to the paper's rule."""
