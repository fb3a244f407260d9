"""Jobs of unknown speed in the Shockwave policy: while jobs of one shape are known to run at
different speeds, a job that has measured nothing runs a round at once to measure its own
(docs/policy.md, "Jobs of unknown speed are measured first")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shockwave.domain.snapshot import ActiveJob
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams
from tests.builders import adaptive_job, snapshot

NOW = 1200.0


def _running(job_id: str, seconds: float, gpu: int) -> ActiveJob:
    job = adaptive_job(job_id, model="ResNet-18", epochs=1000, measured={32: seconds})
    return replace(job, progress=replace(job.progress, gpus=(gpu,), epochs_done=10.0))


@pytest.mark.parametrize(("second", "measured_first"), [(4.0, True), (1.0, False)])
def test_a_job_of_unknown_speed_runs_a_round_when_speeds_differ(
    second: float, measured_first: bool
) -> None:
    # Two long jobs of one shape hold both GPUs; a third of the same shape arrives and has
    # measured nothing. When the two measured 1 s and 4 s an epoch, the newcomer's estimate
    # (their mean rate) could be far off, so it takes round 0; when they measured the same,
    # its estimate is as good as theirs and the running jobs keep their GPUs.
    running = [_running("a", 1.0, 0), _running("b", second, 1)]
    new = adaptive_job("new", model="ResNet-18", epochs=1000)
    new = replace(new, spec=replace(new.spec, arrival_s=NOW - 10.0))
    snap = snapshot([*running, new], gpus=2, now=NOW)

    decision = Shockwave().decide(snap, ShockwaveParams())
    outlook = Shockwave().outlook(snap, new, ShockwaveParams(), {}, {})

    assert outlook.probe is measured_first
    assert ("new" in decision.jobs) is measured_first
    assert len(decision.jobs) == 2
