"""Smoke test of bench/solver.py: its instances look as promised and one small run writes JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

PROMISED_KEYS = {
    "jobs",
    "gpus",
    "rounds",
    "seed",
    "build_seconds",
    "seconds_to_gap",
    "gap_at_limit",
    "gain_gap",
    "plain_gap",
    "status",
    "solver",
    "source",
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "solver.py"
    spec = importlib.util.spec_from_file_location("bench_solver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("source", ["random", "trace"])
def test_instance_is_a_mid_life_snapshot(bench, reference_dir: Path, source: str) -> None:
    throughputs, pool = bench.load_sources(reference_dir, [source])
    instance = bench.build_instance(source, 20, 8, 0, throughputs, pool)
    jobs = instance.snapshot.jobs
    assert len(jobs) == 20 and len({j.job_id for j in jobs}) == 20
    held = [g for j in jobs for g in j.progress.gpus]
    assert 0 < len(held) <= 8 and len(set(held)) == len(held)
    assert any(not j.running for j in jobs)
    assert all(j.progress.epochs_done > 0 for j in jobs if j.running)
    assert any(j.progress.observed_regimes for j in jobs)
    arrivals = [j.spec.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals) and max(arrivals) < instance.snapshot.now


def test_small_run_writes_every_promised_key(bench, reference_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "solver.json"
    argv = ["--jobs", "20", "--gpus", "8", "--rounds", "5", "--seeds", "1", "--source", "both"]
    argv += ["--reference", str(reference_dir), "--json", str(out)]
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text(encoding="utf-8"))
    assert [r["source"] for r in rows] == ["random", "trace"]
    for row in rows:
        assert set(row) >= PROMISED_KEYS
        assert (row["jobs"], row["gpus"], row["rounds"], row["seed"]) == (20, 8, 5, 0)
        assert row["build_seconds"] > 0 and row["multi_regime"] > 0
        assert row["status"] in ("optimal", "gap_limit", "time_limit", "greedy")
        assert 0 <= row["gain_gap"] == row["gap_at_limit"]
        if row["status"] == "optimal":
            assert row["seconds_to_gap"] is not None and row["gain_gap"] <= 1e-3
