"""Jobs that differ from their declared figures, as a real cluster's do.

In the reference traces every job of a model, batch size and width runs at exactly the table's
throughput, and a model's regimes switch at near-fixed fractions of its epochs. Real jobs differ:
data loaders, sequence lengths, stragglers and co-located jobs move each job's speed, and a
gradient-driven rule switches where that job's own statistics say. ``--variation`` gives each job
of a simulated workload its own truth:

- ``throughput:S``: the job runs at its declared speed times a factor drawn from a log-normal of
  spread S (the factor's logarithm is normal with mean 0 and standard deviation S), the same
  factor at every batch size and on every GPU type. Its declared profile stays the table's
  (users declare the typical figure), so only what the job measures shows its own speed.
- ``trajectory:S``: each of the job's regimes lasts its length times its own log-normal factor of
  spread S, the lengths then rescaled to the job's epochs (whole epochs, each regime at least
  one): the regimes and batch sizes stay, their switch points move.

Draws come from (seed, job id) alone, so a job keeps its truth whatever else the workload holds
and runs of different policies compare job for job.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import numpy as np

from shockwave.domain.model import Regime
from shockwave.workloads.workload import SimJob, Workload

KINDS = ("throughput", "trajectory")
MAX_SPREAD = 2.0
"""The largest spread accepted: a factor of e^2 (7x) at one standard deviation is already far
past any cluster's spread of one model's speed."""


@dataclass(frozen=True, slots=True)
class Variation:
    """``throughput``: the log-normal spread of a job's speed around its declared profile;
    ``trajectory``: of each regime's length. 0: none (the workload as given)."""

    throughput: float = 0.0
    trajectory: float = 0.0

    def __post_init__(self) -> None:
        for kind in KINDS:
            spread = getattr(self, kind)
            if not (math.isfinite(spread) and 0 <= spread <= MAX_SPREAD):
                raise ValueError(f"{kind} spread must be in [0, {MAX_SPREAD:g}], got {spread!r}")

    @classmethod
    def parse(cls, text: str) -> Variation:
        """``throughput:S``, ``trajectory:S`` or both, comma-separated (``none`` or empty: no
        variation); ValueError naming the expected shape."""
        shape = "expected throughput:S and/or trajectory:S, comma-separated (e.g. throughput:0.3)"
        if text.strip().lower() in ("", "none"):
            return cls()
        spreads: dict[str, float] = {}
        for part in text.split(","):
            kind, sep, value = part.strip().lower().partition(":")
            if kind not in KINDS or not sep:
                raise ValueError(f"{shape}; got {part.strip()!r}")
            if kind in spreads:
                raise ValueError(f"{kind} is given twice in {text!r}")
            try:
                spreads[kind] = float(value)
            except ValueError:
                raise ValueError(f"{shape}; {kind} takes a number, got {value!r}") from None
        return cls(**spreads)

    def __str__(self) -> str:
        parts = [f"{kind}:{getattr(self, kind):g}" for kind in KINDS if getattr(self, kind)]
        return ",".join(parts) or "none"

    @property
    def none(self) -> bool:
        return not (self.throughput or self.trajectory)


def apply_variation(workload: Workload, variation: Variation, seed: int = 0) -> Workload:
    """``workload`` with each job's true speed and regime lengths varied as ``variation`` says;
    its declared specs unchanged. The workload itself when there is no variation."""
    if variation.none:
        return workload
    jobs = tuple(_varied(job, variation, seed) for job in workload.jobs)
    return Workload(jobs, name=workload.name)


def speed_factor(job_id: str, spread: float, seed: int) -> float:
    """The job's speed relative to its declared profile: e^N(0, spread), from (seed, job)."""
    if spread == 0:
        return 1.0
    return float(math.exp(_rng(seed, job_id, 0).normal(0.0, spread)))


def varied_lengths(
    lengths: tuple[int, ...], spread: float, rng: np.random.Generator
) -> tuple[int, ...]:
    """``lengths`` each times e^N(0, spread), rescaled to their sum in whole epochs, each at
    least 1 (largest remainders take the epochs rounding left over)."""
    total = sum(lengths)
    if len(lengths) < 2 or spread == 0 or total < len(lengths):
        return lengths
    raw = np.array(lengths, dtype=float) * np.exp(rng.normal(0.0, spread, len(lengths)))
    spare = total - len(lengths)
    shares = raw / raw.sum() * spare
    whole = np.floor(shares).astype(int)
    left = spare - int(whole.sum())
    for i in np.argsort(-(shares - whole), kind="stable")[:left]:
        whole[i] += 1
    return tuple(int(x) + 1 for x in whole)


def _varied(job: SimJob, variation: Variation, seed: int) -> SimJob:
    factor = speed_factor(job.spec.job_id, variation.throughput, seed)
    lengths = varied_lengths(
        tuple(r.epochs for r in job.trajectory),
        variation.trajectory,
        _rng(seed, job.spec.job_id, 1),
    )
    return replace(
        job,
        trajectory=tuple(
            Regime(r.batch_size, epochs) for r, epochs in zip(job.trajectory, lengths, strict=True)
        ),
        epoch_seconds={bs: s / factor for bs, s in job.epoch_seconds.items()},
        epoch_seconds_by_type={
            gpu_type: {bs: s / factor for bs, s in times.items()}
            for gpu_type, times in job.epoch_seconds_by_type.items()
        },
    )


def _rng(seed: int, job_id: str, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(job_id.encode()), stream])
