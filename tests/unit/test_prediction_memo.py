"""The policy's prediction memo reuses a prediction only when a fresh one would be the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shockwave.domain.model import Cluster
from shockwave.domain.population import EMPTY_PRIOR, PopulationPrior
from shockwave.domain.snapshot import ActiveJob, JobProgress
from shockwave.policies.shockwave_market import shockwave as policy_module
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams
from shockwave.prediction.population_predictor import PopulationParams
from shockwave.prediction.throughput_model import RecordingModel, ThroughputModel, answers_alike
from shockwave.simulation.simulator import SimResult, simulate
from shockwave.workloads.tenant_workload import assign_tenants
from shockwave.workloads.workload import SimJob
from shockwave_cli.commands.inputs import load_throughputs, load_workload

Predicted = policy_module._Predicted
Computed = policy_module._Computed

N120 = "120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic"


def _run(reference_dir: Path, tenants: bool) -> SimResult:
    workload = load_workload(
        reference_dir / "traces" / f"{N120}.trace",
        reference_dir / "trajectories" / f"{N120}.tacc.trajectories.json",
        load_throughputs(reference_dir / "throughputs" / "tacc_throughputs.json"),
    )
    if tenants:
        # each tenant learns apart, its knobs moving with its own finished jobs
        workload = assign_tenants(workload, {"a": 5, "b": 1}, seed=0)
    # half the reference cluster: many jobs wait while others finish and measure
    return simulate(workload, Cluster.of_gpus(16, 4), Shockwave(), ShockwaveParams())


@pytest.mark.parametrize("tenants", [False, True])
def test_a_memoized_run_decides_exactly_as_an_unmemoized_one(
    reference_dir: Path, monkeypatch: pytest.MonkeyPatch, tenants: bool
) -> None:
    memo = policy_module._PREDICTIONS
    memo.clear()
    asked, computed = [0], [0]
    real_get = memo.get

    def counting_get(
        job: ActiveJob,
        params: ShockwaveParams,
        population: PopulationParams,
        prior: PopulationPrior,
        rates: ThroughputModel,
        speed: float,
        compute: Callable[[ThroughputModel], Computed],
    ) -> Predicted:
        asked[0] += 1

        def counted(model: ThroughputModel) -> Computed:
            computed[0] += 1
            return compute(model)

        return real_get(job, params, population, prior, rates, speed, counted)

    monkeypatch.setattr(memo, "get", counting_get)
    memoized = _run(reference_dir, tenants)
    # the memo did its work: most predictions were reused, also across new priors and models
    assert computed[0] < asked[0] / 2

    def never_reuse(
        job: object,
        params: object,
        population: object,
        prior: object,
        rates: ThroughputModel,
        speed: float,
        compute: Callable[[ThroughputModel], Computed],
    ) -> Predicted:
        return compute(RecordingModel(rates))[0]

    monkeypatch.setattr(memo, "get", never_reuse)
    fresh = _run(reference_dir, tenants)
    assert [(r.start_s, r.end_s, dict(r.assignment), dict(r.fills)) for r in memoized.rounds] == [
        (r.start_s, r.end_s, dict(r.assignment), dict(r.fills)) for r in fresh.rounds
    ]
    assert memoized.jobs == fresh.jobs


def _waiting(sim: SimJob, measured: dict[int, float]) -> ActiveJob:
    """``sim`` as a job that has not run, with ``measured`` epoch times."""
    progress = JobProgress(
        batch_size=sim.spec.initial_batch_size,
        epochs_done=0.0,
        observed_regimes=(),
        measured_epoch_seconds=measured,
    )
    return ActiveJob(spec=sim.spec, progress=progress)


def test_answers_alike_tells_models_that_differ_for_the_job(reference_dir: Path) -> None:
    workload = load_workload(
        reference_dir / "traces" / f"{N120}.trace",
        reference_dir / "trajectories" / f"{N120}.tacc.trajectories.json",
        load_throughputs(reference_dir / "throughputs" / "tacc_throughputs.json"),
    )
    first, other = (
        workload.jobs[0],
        next(j for j in workload.jobs if j.spec.model != workload.jobs[0].spec.model),
    )

    job = _waiting(first, {})
    empty = ThroughputModel.build(EMPTY_PRIOR, [job])
    recording = RecordingModel(empty)
    asked = recording.epoch_time(job, first.spec.initial_batch_size)
    assert asked == empty.epoch_time(job, first.spec.initial_batch_size)
    assert recording.reads
    # another model's measurement: a new model object that answers this job alike
    bs = other.spec.initial_batch_size
    unrelated = ThroughputModel.build(EMPTY_PRIOR, [job, _waiting(other, {bs: 123.0})])
    assert unrelated is not empty
    assert answers_alike(unrelated, job, recording.reads)
    # a job of its own model and width measured: its estimate changes, so the answer differs
    peer = _waiting(first, {first.spec.initial_batch_size: 1.5})
    related = ThroughputModel.build(EMPTY_PRIOR, [job, peer])
    assert not answers_alike(related, job, recording.reads)
