"""A job submitted to an idle ``shockwave up`` with an agent starts within seconds, and a job
waiting behind busy GPUs starts within seconds of one freeing, with rounds of 120 s: both come
from work conservation between boundaries (the round engine's mid-round fill), not from the
next boundary. Real processes: the embedded service, a ``shockwave agent`` with two slots and
jobs that are real processes (``bench/submit_start.py`` measures the same thing)."""

from __future__ import annotations

from pathlib import Path

from bench.submit_start import embedded_cluster

START_WITHIN_S = 5.0


def test_a_job_starts_within_seconds_on_an_idle_cluster_and_when_a_gpu_frees(
    tmp_path: Path,
) -> None:
    with embedded_cluster(tmp_path, round_seconds=120.0) as cluster:
        idle = cluster.idle_start(timeout_s=30.0)
        assert idle.submit_to_start_s < START_WITHIN_S, idle
        busy = cluster.busy_start(timeout_s=30.0)
    assert busy.free_to_start_s is not None and busy.free_to_start_s < START_WITHIN_S, busy
