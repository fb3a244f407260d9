"""Small builders for core tests: a job, a workload, a cluster in one line each."""

from __future__ import annotations

from collections.abc import Sequence

from shockwave.model import AdaptationMode, Cluster, JobSpec, Regime, ThroughputProfile
from shockwave.workload import SimJob, Workload

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


def workload(*jobs: SimJob) -> Workload:
    return Workload(tuple(jobs), name="test")


def cluster(gpus: int, per_node: int | None = None) -> Cluster:
    return Cluster.of_gpus(gpus, per_node or gpus)
