"""What the users of a simulated workload declare about throughput.

Reference traces hand every job its exact throughput at every batch size: the declared profile
is the truth. A real user knows at best an estimate, often nothing. ``--throughput-knowledge``
picks one of:

- ``declared``: the profile as given (exact in the reference traces);
- ``noisy:P``: each declared rate multiplied by 1 + e, e uniform in [-P, P], drawn per job and
  batch size from the seed (0 <= P < 1);
- ``none``: nothing declared; the policy sees only measured epoch times and the throughput
  model's estimates (:mod:`shockwave.prediction.throughput_model`).

Only the job's spec changes: its true epoch times (what the simulator runs) stay as they are.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import numpy as np

from shockwave.domain.model import ThroughputProfile
from shockwave.workloads.workload import SimJob, Workload

KINDS = ("declared", "noisy", "none")


@dataclass(frozen=True, slots=True)
class ThroughputKnowledge:
    """``kind``: declared, noisy or none; ``spread``: P for noisy (0 otherwise)."""

    kind: str = "declared"
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"throughput knowledge must be one of {', '.join(KINDS)}")
        if not (math.isfinite(self.spread) and 0 <= self.spread < 1):
            raise ValueError(f"the noise spread P must be in [0, 1), got {self.spread!r}")
        if self.kind != "noisy" and self.spread:
            raise ValueError(f"{self.kind} knowledge takes no spread")

    @classmethod
    def parse(cls, text: str) -> ThroughputKnowledge:
        """``declared``, ``none`` or ``noisy:P``; ValueError naming the expected shapes."""
        kind, _, spread = text.strip().lower().partition(":")
        shapes = "expected declared, noisy:P (0 <= P < 1, e.g. noisy:0.3) or none"
        if kind == "noisy":
            try:
                return cls("noisy", float(spread))
            except ValueError:
                raise ValueError(f"{shapes}; got {text!r}") from None
        if kind in ("declared", "none") and not spread:
            return cls(kind)
        raise ValueError(f"{shapes}; got {text!r}")

    def __str__(self) -> str:
        return f"noisy:{self.spread:g}" if self.kind == "noisy" else self.kind

    @property
    def declared(self) -> bool:
        """Whether the users declare the exact truth (nothing for the policy to estimate)."""
        return self.kind == "declared"


def apply_knowledge(workload: Workload, knowledge: ThroughputKnowledge, seed: int = 0) -> Workload:
    """``workload`` with each job's declared profile as ``knowledge`` says (same jobs, same
    truth); noise is fixed per (seed, job, batch size), so runs compare job for job."""
    if knowledge.declared:
        return workload
    jobs = tuple(_with_knowledge(job, knowledge, seed) for job in workload.jobs)
    return Workload(jobs, name=workload.name)


def _with_knowledge(job: SimJob, knowledge: ThroughputKnowledge, seed: int) -> SimJob:
    if knowledge.kind == "none":
        profile = ThroughputProfile()
    else:
        profile = ThroughputProfile(
            {
                bs: rate * _noise(seed, job.spec.job_id, bs, knowledge.spread)
                for bs, rate in job.spec.throughput.samples_per_second.items()
            }
        )
    return replace(job, spec=replace(job.spec, throughput=profile))


def _noise(seed: int, job_id: str, batch_size: int, spread: float) -> float:
    """1 + e, e uniform in [-spread, spread], from (seed, job, batch size) alone."""
    rng = np.random.default_rng([seed, zlib.crc32(job_id.encode()), batch_size])
    return 1.0 + float(rng.uniform(-spread, spread))
