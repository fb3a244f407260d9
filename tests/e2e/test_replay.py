"""``shockwave replay`` end to end: a few short jobs of a generated workload go through the real
embedded service (``shockwave up`` in its own process) on mixed node sizes, trained by the
simulated agents at 480x, and the replay's figures match the simulator's on the same workload.

The full parity check (120 jobs, both modes) is ``bench/replay_parity.py`` (minutes), with its
results in docs/results.md.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
from pathlib import Path

from bench.deployment import ROOT
from shockwave.domain.model import Cluster
from shockwave.policies.policy import get_policy, make_params
from shockwave.simulation.metrics import summarize
from shockwave.simulation.simulator import SimSettings, simulate
from shockwave.workloads.generator import generate_workload
from shockwave.workloads.traces import format_trace, format_trajectories
from shockwave_cli.commands.inputs import load_throughputs, load_workload
from shockwave_cli.runtime.supervision import shockwave_argv

REFERENCE = ROOT.parent / "shared" / "data" / "reference"
THROUGHPUTS = REFERENCE / "throughputs" / "tacc_throughputs.json"
NODES = "1x2,2x1"
TIME_SCALE = 480.0


def short_workload(tmp_path: Path) -> tuple[Path, Path]:
    """Four jobs of at most 2 GPUs and about an hour of exclusive time at most, from the
    generator, written in the reference formats."""
    table = load_throughputs(THROUGHPUTS)
    pool = generate_workload(40, seed=11, throughputs=table, mean_interarrival_s=200.0)
    jobs = [j for j in pool.jobs if j.spec.gpus <= 2 and j.t_exclusive_s < 4000][:4]
    assert len(jobs) == 4
    workload = dataclasses.replace(pool, jobs=tuple(jobs), name="short")
    trace, trajectories = tmp_path / "short.trace", tmp_path / "short.json"
    trace.write_text(format_trace(workload), encoding="utf-8")
    trajectories.write_text(json.dumps(format_trajectories(workload)), encoding="utf-8")
    return trace, trajectories


def test_a_replay_through_the_embedded_service_matches_the_simulator(tmp_path: Path) -> None:
    trace, trajectories = short_workload(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *shockwave_argv(),
            "replay",
            "--trace",
            str(trace),
            "--trajectories",
            str(trajectories),
            "--throughputs",
            str(THROUGHPUTS),
            "--nodes",
            NODES,
            "--round-seconds",
            "120",
            "--time-scale",
            f"{TIME_SCALE:g}",
            "--policy",
            "shockwave",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = json.loads((out / "metrics.json").read_text())
    replayed = record["replay"]
    assert record["jobs_completed"] == record["jobs_total"] == 4
    assert replayed["job_states"] == {"SUCCEEDED": 4}
    assert replayed["events"]["lost"] == 0 and replayed["events"]["duplicated"] == 0
    assert replayed["events"]["accepted"] > 0
    assert replayed["plan_sources"]["plan"] > 0
    # round-start leases (none here: four jobs on an idle cluster start mid-round) are also
    # timed from the boundary they were for; every start is one or the other
    lags = replayed["lease_lags_s"]
    assert lags["start_after_due"]["n"] <= lags["start_boundary"]["n"]
    assert lags["start_boundary"]["n"] + lags["start_fill"]["n"] == lags["start"]["n"] > 0
    assert replayed["restore_rule"] == "simulator"
    for name in ("jobs-shockwave.csv", "shockwave-gantt.png", "ftf-cdf.png", "utilization.png"):
        assert (out / name).is_file(), name

    workload = load_workload(trace, trajectories, load_throughputs(THROUGHPUTS))
    policy = get_policy("shockwave")
    simulated = summarize(
        simulate(workload, Cluster.parse(NODES), policy, make_params(policy), SimSettings())
    )
    assert abs(record["makespan_s"] / simulated.makespan_s - 1) < 0.1
    assert abs(record["avg_jct_s"] / simulated.avg_jct_s - 1) < 0.1


def test_a_replay_runs_each_job_in_its_tenant_with_the_tenants_settings(tmp_path: Path) -> None:
    """``--tenants`` and ``--tenant-max-gpus`` through the service: each job is submitted by a
    user of its drawn tenant and tenant ``a``'s limit is set through /v1/tenants before any
    arrives; every job still finishes, and metrics.json accounts for every tenant."""
    trace, trajectories = short_workload(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *shockwave_argv(),
            *("replay", "--trace", str(trace), "--trajectories", str(trajectories)),
            *("--throughputs", str(THROUGHPUTS), "--nodes", NODES, "--round-seconds", "120"),
            *("--time-scale", f"{TIME_SCALE:g}", "--policy", "shockwave", "--out", str(out)),
            *("--tenants", "a:1,b:1", "--tenant-max-gpus", "a:2"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = json.loads((out / "metrics.json").read_text())
    assert record["replay"]["job_states"] == {"SUCCEEDED": 4}
    database = sqlite3.connect(out / "logs" / "replay.db")
    try:
        tenants = {row[0] for row in database.execute("SELECT tenant FROM jobs")}
        limits = list(database.execute("SELECT path, max_gpus, version FROM tenants"))
        users = dict(database.execute("SELECT tenant, last_used_at FROM tokens WHERE role='user'"))
    finally:
        database.close()
    assert tenants == {"a", "b"}
    assert limits == [("a", 2, 1)]
    assert set(users) == {"a", "b"} and all(users.values())  # each tenant's user submitted
    ledger = record["tenants"]
    assert set(ledger) == {"a", "b"}
    for name, figures in ledger.items():
        assert figures["jobs"] >= 1, name
        assert figures["received_gpu_s"] > 0 and figures["entitled_gpu_s"] > 0, name
    assert 0 < record["worst_tenant_ratio"] <= 1
