"""Gangs wider than a node: the width rule, placement across nodes, and every policy running
16- and 32-GPU jobs to completion in a small simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shockwave.domain.model import VALID_WIDTHS, Cluster, JobSpec, ValidationError, is_valid_width
from shockwave.market.heterogeneity import parse_typed_gpus
from shockwave.policies.policy import get_policy, make_params, policy_names
from shockwave.rounds.placement import place, place_into
from shockwave.simulation.simulator import simulate
from shockwave.workloads.trace_import import ImportOptions, import_job_log
from shockwave.workloads.traces import ThroughputTable, parse_throughputs
from shockwave.workloads.workload import Workload
from shockwave_cli.commands.inputs import load_typed_workload


@pytest.fixture(scope="module")
def table(reference_dir: Path) -> ThroughputTable:
    path = reference_dir / "throughputs" / "tacc_throughputs.json"
    return parse_throughputs(json.loads(path.read_text()), str(path))


def nodes_of(cluster: Cluster, gpus: tuple[int, ...]) -> set[int]:
    return {cluster.node_of(g) for g in gpus}


def test_the_width_rule() -> None:
    assert VALID_WIDTHS[:8] == (1, 2, 4, 8, 16, 32, 64, 128) and VALID_WIDTHS[-1] == 1024
    assert all(is_valid_width(w) for w in (1, 16, 32, 64, 1024))
    assert not any(is_valid_width(w) for w in (0, 3, 12, 48, 2048, True, 16.0, "16"))
    spec = JobSpec(job_id="w", gpus=64, epochs=1, samples_per_epoch=10, initial_batch_size=2)
    assert spec.gpus == 64
    with pytest.raises(ValidationError, match="gpus: must be a power of two from 1 to 1024"):
        JobSpec(job_id="w", gpus=24, epochs=1, samples_per_epoch=10, initial_batch_size=2)


def test_a_wide_gang_takes_whole_free_nodes() -> None:
    cluster = Cluster.of_gpus(64, 8)
    placed = place(cluster, [("small", 2), ("wide", 32), ("mid", 16)], {})
    assert not placed.unplaced
    assert len(nodes_of(cluster, placed.assignment["wide"])) == 4
    assert len(nodes_of(cluster, placed.assignment["mid"])) == 2
    assert len(nodes_of(cluster, placed.assignment["small"])) == 1
    every = [g for gpus in placed.assignment.values() for g in gpus]
    assert len(every) == len(set(every)) == 50


def test_a_wide_gang_spans_the_fewest_nodes_when_none_is_whole() -> None:
    cluster = Cluster.of_gpus(32, 8)
    # Nodes 0 and 1 are half busy, nodes 2 and 3 have one GPU busy each.
    busy = [0, 1, 2, 3, 8, 9, 10, 11, 16, 24]
    placed = place_into(cluster, [("wide", 16)], busy)
    gpus = placed.assignment["wide"]
    assert len(gpus) == 16 and not set(gpus) & set(busy)
    spanned = nodes_of(cluster, gpus)
    assert len(spanned) == 3 and {2, 3} <= spanned  # 7 + 7 + 2 GPUs: three nodes, not four
    refused = place_into(cluster, [("huge", 32)], busy)
    assert refused.unplaced == {"huge": "needs 32 GPUs, 22 free"}
    assert place(cluster, [("too-wide", 64)], {}).unplaced == {
        "too-wide": "needs 64 GPUs, cluster has 32"
    }


def test_a_renewed_wide_lease_keeps_its_gpus() -> None:
    cluster = Cluster.of_gpus(32, 8)
    first = place(cluster, [("wide", 16)], {})
    again = place(cluster, [("one", 1), ("wide", 16)], dict(first.assignment))
    assert again.assignment["wide"] == first.assignment["wide"] and not again.moved


def wide_workload(table: ThroughputTable) -> Workload:
    log = (
        "arrival_s,duration_s,num_gpus\n"
        "0,1800,1\n0,2400,16\n60,1200,2\n120,3000,32\n300,900,4\n400,1500,8\n500,1200,16\n"
    )
    return import_job_log(log, "wide.csv", table, ImportOptions(seed=1)).workload


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_runs_16_and_32_gpu_gangs(table: ThroughputTable, name: str) -> None:
    workload = wide_workload(table)
    cluster = Cluster.of_gpus(32, 8)
    policy = get_policy(name)
    result = simulate(workload, cluster, policy, make_params(policy))

    assert result.completed == len(workload.jobs), name
    widths = {job.spec.job_id: job.spec.gpus for job in workload.jobs}
    ran = set()
    for record in result.rounds:
        for job_id, gpus in (*record.assignment.items(), *record.fills.items()):
            assert len(gpus) == widths[job_id], (name, job_id)
            assert len(nodes_of(cluster, gpus)) >= widths[job_id] // 8, (name, job_id)
            ran.add(job_id)
    assert {j for j, w in widths.items() if w >= 16} <= ran


def test_a_wide_gang_on_a_typed_cluster_gets_each_types_scaled_rates(
    table: ThroughputTable, reference_dir: Path
) -> None:
    path = reference_dir / "throughputs" / "tacc_throughputs.json"
    cluster = parse_typed_gpus("v100:32,p100:32", 8)
    typed = load_typed_workload(wide_workload(table), path, cluster)
    p100 = parse_throughputs(json.loads(path.read_text()), str(path), gpu_type="p100")
    for job in typed.jobs:
        if job.spec.gpus < 16:
            continue
        declared = job.spec.type_throughput["p100"]
        assert declared == p100.profile(job.spec.model, job.spec.gpus)
        assert declared.samples_per_second  # scaled from the p100 table's 8-GPU rates
