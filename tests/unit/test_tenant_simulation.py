"""Tenants in the simulator: assignment, limits held in every round, the tenant metrics, flags."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from shockwave.domain.model import AdaptationMode, Cluster, JobSpec, Regime, ValidationError
from shockwave.domain.population import EMPTY_PRIOR, FinishedJob, PopulationPrior
from shockwave.domain.snapshot import Snapshot
from shockwave.domain.tenancy import Tenant
from shockwave.policies.policy import Decision, get_policy, make_params
from shockwave.policies.shockwave_market.shockwave import Shockwave, ShockwaveParams
from shockwave.simulation.metrics import jain_index, summarize
from shockwave.simulation.simulator import SimResult, simulate
from shockwave.simulation.tenant_ledger import TenantLedger
from shockwave.workloads.tenant_workload import (
    assign_tenants,
    parse_tenant_values,
    tenant_settings,
    with_tenants,
)
from shockwave.workloads.workload import Workload
from shockwave_cli.main import INPUT_ERROR_EXIT, app
from tests.builders import adaptive_job, sim_job, snapshot

runner = CliRunner()


def _workload(jobs: int, epochs: int = 40, arrival_step: float = 0.0) -> Workload:
    return Workload(
        tuple(sim_job(f"j{i}", [(32, epochs, 30.0)], arrival=i * arrival_step) for i in range(jobs))
    )


def _held_per_round(result: SimResult, tenant_of: dict[str, str], tenant: str) -> list[int]:
    """The most GPUs ``tenant`` held at once in each round: at its boundary, and just before
    its end (the jobs placed then or started by fills that have not finished)."""
    finish = {j.job_id: j.finish_s for j in result.jobs}
    held = []
    for r in result.rounds:
        start = sum(len(g) for j, g in r.assignment.items() if tenant_of[j] == tenant)
        late = {
            j: g
            for j, g in {**r.assignment, **r.fills}.items()
            if (done := finish[j]) is None or done > r.end_s - 1e-6
        }
        end = sum(len(g) for j, g in late.items() if tenant_of[j] == tenant)
        held.append(max(start, end))
    return held


def test_seeded_assignment_is_reproducible_and_follows_the_shares() -> None:
    workload = _workload(600)
    first = assign_tenants(workload, {"org/a": 5, "b": 1}, seed=0)
    again = assign_tenants(workload, {"org/a": 5, "b": 1}, seed=0)
    other = assign_tenants(workload, {"org/a": 5, "b": 1}, seed=1)
    tenants = [j.spec.tenant for j in first.jobs]
    assert tenants == [j.spec.tenant for j in again.jobs]
    assert tenants != [j.spec.tenant for j in other.jobs]
    counts = Counter(tenants)
    assert set(counts) == {"org/a", "b"}
    assert 0.78 < counts["org/a"] / 600 < 0.89


def test_tenant_values_and_sidecars_are_checked() -> None:
    assert parse_tenant_values("a:5,org/b:1.5", "--tenants") == {"a": 5.0, "org/b": 1.5}
    for bad in ("a", "a:x", "a:-1", "a:0", "bad name:1", "a:1,a:2"):
        with pytest.raises(ValidationError) as error:
            parse_tenant_values(bad, "--tenants")
        assert error.value.field == "--tenants"
    assert parse_tenant_values("a:0", "--tenant-max-gpus", allow_zero=True) == {"a": 0.0}
    with pytest.raises(ValidationError, match="no job 'zz'"):
        with_tenants(_workload(2), {"zz": "a"})
    with pytest.raises(ValidationError):
        tenant_settings({}, {}, {"a": 2.5})


def test_max_gpus_holds_in_every_round_even_with_idle_gpus() -> None:
    workload = with_tenants(_workload(10), {f"j{i}": "a" if i < 8 else "b" for i in range(10)})
    workload = dataclasses.replace(workload, tenants={"a": Tenant("a", max_gpus=3)})
    tenant_of = {j.spec.job_id: j.spec.tenant for j in workload.jobs}
    for name in ("fifo", "shockwave", "gavel"):
        policy = get_policy(name)
        result = simulate(workload, Cluster.uniform(2, 4), policy, make_params(policy))
        assert result.completed == 10, name
        held = _held_per_round(result, tenant_of, "a")
        assert max(held) == 3, (name, held)


def test_a_guaranteed_tenant_gets_its_gpus_at_the_next_boundary() -> None:
    # fifo ignores tenants: eight long jobs of a fill the cluster; b's job arrives mid-round
    jobs = [sim_job(f"a{i}", [(32, 100, 30.0)]) for i in range(8)]
    jobs.append(sim_job("b0", [(32, 10, 30.0)], gpus=4, arrival=130.0))
    workload = Workload(tuple(jobs))
    tenant_of = {j.spec.job_id: j.spec.job_id[0] for j in workload.jobs}
    workload = with_tenants(workload, tenant_of)
    fifo = get_policy("fifo")
    plain = simulate(workload, Cluster.uniform(2, 4), fifo, make_params(fifo))
    assert _held_per_round(plain, tenant_of, "b")[2] == 0  # without a guarantee, b waits
    guaranteed = dataclasses.replace(workload, tenants={"b": Tenant("b", guaranteed_gpus=4)})
    result = simulate(guaranteed, Cluster.uniform(2, 4), fifo, make_params(fifo))
    boundary = next(r for r in result.rounds if r.start_s >= 130.0)
    assert boundary.start_s == 240.0
    assert "b0" in boundary.assignment and len(boundary.assignment["b0"]) == 4


def test_tenant_metrics_count_entitled_and_received_by_hour() -> None:
    workload = with_tenants(_workload(12, epochs=200), {f"j{i}": "ab"[i % 2] for i in range(12)})
    shockwave = get_policy("shockwave")
    result = simulate(workload, Cluster.uniform(1, 4), shockwave, make_params(shockwave))
    run = summarize(result)
    assert set(run.tenants) == {"a", "b"}
    for figures in run.tenants.values():
        assert figures.jobs == 6
        assert figures.hours >= 1
        assert figures.entitled_gpu_s > 0
        assert figures.worst_hour_ratio >= 0.9
    record = run.as_dict()
    assert record["worst_tenant_ratio"] == run.worst_tenant_ratio >= 0.9
    assert set(run.tenants["a"].as_dict()) >= {
        "entitled_gpu_s",
        "received_gpu_s",
        "worst_hour_ratio",
    }
    assert "tenants" in record
    assert 0.99 <= run.tenant_jain <= 1.0
    # never more than the cluster's GPU-time is entitled; nearly all of it while jobs wait
    total = sum(f.entitled_gpu_s for f in run.tenants.values())
    assert 0.9 * 4 * result.makespan_s <= total <= 4 * result.makespan_s + 1e-6
    received = sum(f.received_gpu_s for f in run.tenants.values())
    assert received == pytest.approx(total, rel=0.05)


def test_ledger_splits_at_finishes_and_hours() -> None:
    ledger = TenantLedger({}, capacity=4, hour_s=100.0)
    ledger.boundary(0.0, {"x": ("a", 4), "y": ("b", 4)})
    ledger.finish("y", 50.0)
    ledger.hold("a", 0.0, 150.0, 2)
    ledger.advance(150.0)
    hours = ledger.hours()
    # a: 2 GPUs for 50 s, then all 4 for 100 s; b: 2 GPUs for 50 s
    assert hours["a"] == ((0, 2 * 50 + 4 * 50, 200.0), (1, 4 * 50, 100.0))
    assert hours["b"] == ((0, 100.0, 0.0),)


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)


def test_one_tenant_changes_no_figure() -> None:
    workload = _workload(8, arrival_step=45.0)
    named = with_tenants(workload, {j.spec.job_id: "only" for j in workload.jobs})
    for name in ("shockwave", "gavel", "gandiva_fair"):
        policy = get_policy(name)
        base = summarize(simulate(workload, Cluster.uniform(1, 4), policy, make_params(policy)))
        one = summarize(simulate(named, Cluster.uniform(1, 4), policy, make_params(policy)))
        assert (one.makespan_s, one.avg_jct_s, one.ftf) == (
            base.makespan_s,
            base.avg_jct_s,
            base.ftf,
        )


@pytest.fixture
def throughputs(reference_dir: Path) -> Path:
    return reference_dir / "throughputs" / "tacc_throughputs.json"


def test_simulate_flags_write_tenant_figures(throughputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "simulate",
            *("--generate", "10", "--seed", "3", "--throughputs", str(throughputs)),
            *("--gpus", "8", "--policy", "shockwave,gavel", "--out", str(out)),
            *("--tenants", "org/a:5,b:1", "--tenant-seed", "2"),
            *("--tenant-weights", "org:3,b:1", "--tenant-max-gpus", "b:4", "--report"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Tenants" in result.output
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h2>Tenants</h2>" in page and "org/a" in page
    records = json.loads((out / "metrics.json").read_text())
    for record in records:
        assert set(record["tenants"]) <= {"org/a", "b"}
        assert 0 <= record["worst_tenant_ratio"] <= record["tenants"]["org/a"]["worst_hour_ratio"]
        assert len(record["ftf_tenant"]) == 10


def test_simulate_reads_a_tenant_sidecar_and_names_bad_flags(
    throughputs: Path, tmp_path: Path
) -> None:
    base = [
        "simulate",
        *("--generate", "4", "--seed", "3", "--throughputs", str(throughputs)),
        *("--gpus", "8", "--policy", "fifo", "--out", str(tmp_path / "out")),
    ]
    sidecar = tmp_path / "tenants.csv"
    sidecar.write_text("job_id,tenant\n0,a\n1,b\n", encoding="utf-8")
    result = runner.invoke(app, [*base, "--tenant-file", str(sidecar)])
    assert result.exit_code == 0, result.output
    (record,) = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert {"a", "b"} <= set(record["tenants"])
    bad = runner.invoke(app, [*base, "--tenants", "a:five"])
    assert bad.exit_code == INPUT_ERROR_EXIT and "--tenants" in bad.output
    both = runner.invoke(app, [*base, "--tenants", "a:1", "--tenant-file", str(sidecar)])
    assert both.exit_code == INPUT_ERROR_EXIT and "not both" in both.output


class _Recording:
    """A policy that records every snapshot and decides as ``inner`` does."""

    name: ClassVar[str] = "recording"
    Params: ClassVar[type[Any]] = type(None)

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[Snapshot] = []

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        self.seen.append(snapshot)
        decision: Decision = self.inner.decide(snapshot, params)
        return decision


def test_each_tenants_jobs_learn_apart_as_in_the_service() -> None:
    # Jobs of two tenants finish one after another on one GPU: every snapshot groups the jobs
    # by tenant, and each tenant's prior has learnt from its own finished jobs only.
    base = _workload(4, epochs=4, arrival_step=10.0)
    workload = with_tenants(base, {"j0": "a", "j1": "b", "j2": "a", "j3": "b"})
    fifo = get_policy("fifo")
    apart = _Recording(fifo)
    simulate(workload, Cluster.of_gpus(1, 1), apart, make_params(fifo))
    assert all(
        dict(s.prior_groups) == {j.job_id: j.spec.tenant for j in s.jobs} for s in apart.seen
    )
    last = apart.seen[-1]
    assert {t: p.learnt for t, p in last.priors.items()} == {"a": 2, "b": 1}
    assert last.population.learnt == 3  # the shared prior, as a single tenant's jobs use
    together = _Recording(fifo)
    simulate(base, Cluster.of_gpus(1, 1), together, make_params(fifo))
    assert all(not s.prior_groups and not s.priors for s in together.seen)


def _lm_finished(regimes: list[tuple[int, int]]) -> FinishedJob:
    spec = JobSpec(
        job_id="done",
        gpus=1,
        epochs=sum(e for _, e in regimes),
        samples_per_epoch=1000,
        initial_batch_size=regimes[0][0],
        mode=AdaptationMode.GNS,
        batch_sizes=_LM_LADDER,
        model="LM",
    )
    return FinishedJob(spec, tuple(Regime(bs, e) for bs, e in regimes))


def _learnt(*jobs: FinishedJob) -> PopulationPrior:
    prior = EMPTY_PRIOR
    for job in jobs:
        prior = prior.learn(job)
    return prior


_LM_LADDER = (5, 10, 20, 40, 80)


def _predicted_sizes(
    priors: dict[str, PopulationPrior],
    population: PopulationPrior,
    beside: bool = True,
    grouped: bool = True,
) -> list[tuple[int, float]]:
    """The regimes the Shockwave policy predicts for a fresh 65-epoch LM GNS job of tenant
    ``b``, the snapshot grouping jobs by tenant (``grouped``; else every job learns from
    ``population``); ``beside``: a job of tenant ``a`` is active too (else ``b`` is the only
    tenant with jobs)."""
    fresh = adaptive_job(
        "mine",
        mode=AdaptationMode.GNS,
        model="LM",
        initial=5,
        batch_sizes=_LM_LADDER,
        epochs=65,
        profile={bs: 10.0 / bs for bs in _LM_LADDER},
    )
    mine_spec = dataclasses.replace(fresh.spec, tenant="b")
    mine = dataclasses.replace(fresh, spec=mine_spec)
    theirs = dataclasses.replace(fresh, spec=dataclasses.replace(mine_spec, job_id="x", tenant="a"))
    jobs = [mine, theirs] if beside else [mine]
    snap = dataclasses.replace(
        snapshot(jobs),
        population=population,
        prior_groups={j.job_id: j.spec.tenant for j in jobs} if grouped else {},
        priors=priors,
    )
    look = Shockwave().outlook(snap, mine, ShockwaveParams(), {}, {})
    return [(r.batch_size, round(r.epochs, 6)) for r in look.prediction.regimes]


def test_a_tenant_with_few_finished_jobs_plans_from_the_neutral_prior() -> None:
    # Tenant b has one finished LM job (short, never grew): its fresh LM job is predicted by the
    # paper's rule, not by that one job; whatever tenant a's jobs taught (static LM jobs, or
    # jobs that climbed the ladder) changes nothing of it.
    b_prior = _learnt(_lm_finished([(5, 21)]))
    static_a = _learnt(*(_lm_finished([(5, 65)]) for _ in range(30)))
    climbing_a = _learnt(*(_lm_finished([(5, 5), (10, 60)]) for _ in range(30)))
    paper = [(bs, 13.0) for bs in _LM_LADDER]

    for a_prior in (static_a, climbing_a, EMPTY_PRIOR):
        for population in (static_a, EMPTY_PRIOR):
            assert _predicted_sizes({"a": a_prior, "b": b_prior}, population) == paper


def test_a_lone_tenants_prior_plans_as_the_single_prior_does() -> None:
    # With no other tenant's job active, a tenant's prior is the cluster's: the same one
    # finished job, as the tenant's prior or as the snapshot's single prior, gives the same
    # prediction (its one static job and the static guess outvote the paper's rule); beside
    # another tenant, the tenant leans on the paper's rule.
    prior = _learnt(_lm_finished([(5, 21)]))

    lone = _predicted_sizes({"b": prior}, EMPTY_PRIOR, beside=False)
    assert lone == [(5, 65.0)]
    assert _predicted_sizes({}, prior, beside=False, grouped=False) == lone
    assert _predicted_sizes({"b": prior, "a": EMPTY_PRIOR}, EMPTY_PRIOR) != lone
