"""Small builders for core tests: a job, a workload, a cluster in one line each."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shockwave.domain.model import (
    AdaptationMode,
    Cluster,
    ElasticRange,
    JobSpec,
    Regime,
    ThroughputProfile,
)
from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.market.planner import PlanJob
from shockwave.workloads.workload import SimJob, Workload

SAMPLES = 1000


def sim_job(
    job_id: str,
    regimes: Sequence[tuple[int, int, float]],
    *,
    gpus: int = 1,
    arrival: float = 0.0,
    mode: AdaptationMode = AdaptationMode.STATIC,
) -> SimJob:
    """A job from (batch size, epochs, seconds per epoch) regimes; its profile knows every size."""
    epoch_seconds = {bs: seconds for bs, _, seconds in regimes}
    profile = ThroughputProfile({bs: SAMPLES / s for bs, s in epoch_seconds.items()})
    spec = JobSpec(
        job_id=job_id,
        gpus=gpus,
        epochs=sum(e for _, e, _ in regimes),
        samples_per_epoch=SAMPLES,
        initial_batch_size=regimes[0][0],
        mode=mode,
        batch_sizes=tuple(sorted(epoch_seconds)),
        throughput=profile,
        arrival_s=arrival,
    )
    return SimJob(
        spec=spec,
        trajectory=tuple(Regime(bs, e) for bs, e, _ in regimes),
        epoch_seconds=epoch_seconds,
    )


def elastic_sim_job(
    job_id: str,
    epochs: int,
    speedup: Mapping[int, Mapping[int, float]],
    arrival: float = 0.0,
) -> SimJob:
    """A one-GPU job of ``epochs`` 10 s epochs at batch size 32, elastic from 1 to 8 GPUs at
    ``speedup`` (count -> batch size -> throughput over one GPU's)."""
    job = sim_job(job_id, [(32, epochs, 10.0)], arrival=arrival)
    spec = dataclasses.replace(job.spec, elastic=ElasticRange(1, 8, speedup))
    return dataclasses.replace(job, spec=spec)


def workload(*jobs: SimJob) -> Workload:
    return Workload(tuple(jobs), name="test")


def cluster(gpus: int, per_node: int | None = None) -> Cluster:
    return Cluster.of_gpus(gpus, per_node or gpus)


BATCH = 10
"""Batch size of :func:`active_job`: with ``SAMPLES`` per epoch, one epoch is 100 steps."""


def active_job(
    job_id: str,
    *,
    gpus: int = 1,
    steps_per_second: float = 1.0,
    epochs: int = 10,
    epochs_done: float = 0.0,
    arrival: float = 0.0,
    executed_last_round: float = 0.0,
    budget: float = 1.0,
) -> ActiveJob:
    """An active static job of 100 steps per epoch running at ``steps_per_second`` (whole gang)."""
    spec = JobSpec(
        job_id=job_id,
        gpus=gpus,
        epochs=epochs,
        samples_per_epoch=SAMPLES,
        initial_batch_size=BATCH,
        throughput=ThroughputProfile({BATCH: steps_per_second * BATCH}),
        arrival_s=arrival,
        budget=budget,
    )
    progress = JobProgress(
        batch_size=BATCH,
        epochs_done=epochs_done,
        executed_last_round_s=executed_last_round,
        gpus=tuple(range(gpus)) if executed_last_round > 0 else (),
    )
    return ActiveJob(spec=spec, progress=progress)


def snapshot(
    jobs: Sequence[ActiveJob],
    *,
    gpus: int = 4,
    per_node: int | None = None,
    now: float = 0.0,
    state: object | None = None,
    round_seconds: float = 120.0,
) -> Snapshot:
    """The snapshot at ``now`` of ``jobs`` (in arrival order) on a cluster of ``gpus`` GPUs."""
    return Snapshot(
        now=now,
        round_index=int(now // round_seconds),
        round_seconds=round_seconds,
        cluster=cluster(gpus, per_node),
        jobs=tuple(jobs),
        policy_state=state,
    )


def adaptive_job(
    job_id: str = "j",
    *,
    mode: AdaptationMode = AdaptationMode.STATIC,
    initial: int = 32,
    batch_sizes: Sequence[int] = (),
    epochs: int = 100,
    epochs_done: float = 0.0,
    observed: Sequence[tuple[int, int]] = (),
    batch_size: int | None = None,
    profile: Mapping[int, float] | None = None,
    measured: Mapping[int, float] | None = None,
    gpus: int = 1,
    model: str = "",
) -> ActiveJob:
    """An active job with its adaptation ``mode`` and what has been observed of it.

    ``observed``: finished regimes as (batch size, epochs); ``batch_size``: the current one
    (default ``initial``); ``profile``/``measured``: seconds per epoch by batch size, declared
    (as a throughput profile) and measured.
    """
    spec = JobSpec(
        job_id=job_id,
        gpus=gpus,
        epochs=epochs,
        samples_per_epoch=SAMPLES,
        initial_batch_size=initial,
        mode=mode,
        batch_sizes=tuple(batch_sizes),
        throughput=ThroughputProfile({bs: SAMPLES / s for bs, s in (profile or {}).items()}),
        model=model,
    )
    progress = JobProgress(
        batch_size=initial if batch_size is None else batch_size,
        epochs_done=epochs_done,
        observed_regimes=tuple(Regime(bs, e) for bs, e in observed),
        measured_epoch_seconds=dict(measured or {}),
    )
    return ActiveJob(spec=spec, progress=progress)


def plan_job(
    job_id: str,
    utility: Sequence[float],
    *,
    gpus: int = 1,
    weight: float = 1.0,
    running: bool = False,
    round_seconds: float = 60.0,
) -> PlanJob:
    """A planner job whose run time left drops by ``round_seconds`` per scheduled round."""
    cap = len(utility) - 1
    return PlanJob(
        job_id=job_id,
        gpus=gpus,
        weight=weight,
        utility=tuple(utility),
        remaining=tuple(round_seconds * (cap - n) for n in range(cap + 1)),
        running=running,
    )
