"""The ``shockwave`` command line: listing policies, generating and simulating, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from shockwave.cli.main import INPUT_ERROR_EXIT, app
from shockwave.policies import BASELINES

runner = CliRunner()

PROMISED_KEYS = {
    "policy",
    "makespan_s",
    "avg_jct_s",
    "utilization",
    "worst_ftf",
    "unfair_fraction",
    "worst_ftf_contention",
    "unfair_fraction_contention",
    "jobs_completed",
    "decision_seconds",
}
JOBS = 12
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def throughputs(reference_dir: Path) -> Path:
    return reference_dir / "throughputs" / "tacc_throughputs.json"


@pytest.fixture
def generated(tmp_path: Path, throughputs: Path) -> tuple[Path, Path]:
    """A 12-job synthetic workload written by ``shockwave generate``: (trace, trajectories)."""
    trace, trajectories = tmp_path / "small.trace", tmp_path / "small.trajectories.json"
    result = invoke(
        "generate",
        *("--jobs", str(JOBS), "--seed", "11", "--throughputs", str(throughputs)),
        *("--out-trace", str(trace), "--out-trajectories", str(trajectories)),
    )
    assert result.exit_code == 0, result.output
    return trace, trajectories


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def simulate_args(
    trace: Path, trajectories: Path, throughputs: Path, out: Path, policy: str
) -> list[str]:
    return [
        "simulate",
        *("--trace", str(trace), "--trajectories", str(trajectories)),
        *("--throughputs", str(throughputs), "--gpus", "8", "--gpus-per-node", "4"),
        *("--policy", policy, "--out", str(out)),
    ]


def assert_input_error(result: Result, *fragments: str) -> None:
    """Exit code 2, one error line naming every fragment, no traceback."""
    assert result.exit_code == INPUT_ERROR_EXIT, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_policies_lists_every_baseline() -> None:
    result = invoke("policies")

    assert result.exit_code == 0, result.output
    for name in ("gavel", "mst", "themis", "allox", "gandiva_fair", "ossp", "fifo"):
        assert name in result.output
    assert set(BASELINES) <= set(result.output.split())


def test_generate_writes_the_reference_formats(generated: tuple[Path, Path]) -> None:
    trace, trajectories = generated

    lines = trace.read_text().splitlines()
    assert len(lines) == JOBS
    assert all(len(line.split("\t")) == 12 for line in lines)
    jobs = json.loads(trajectories.read_text())["jobs"]
    assert [job["job"] for job in jobs] == list(range(JOBS))


def test_generate_is_reproducible_with_the_same_seed(
    generated: tuple[Path, Path], tmp_path: Path, throughputs: Path
) -> None:
    again = tmp_path / "again"
    result = invoke(
        "generate",
        *("--jobs", str(JOBS), "--seed", "11", "--throughputs", str(throughputs)),
        *("--out-trace", str(again / "t"), "--out-trajectories", str(again / "j.json")),
    )

    assert result.exit_code == 0, result.output
    assert (again / "t").read_text() == generated[0].read_text()
    assert (again / "j.json").read_text() == generated[1].read_text()


def test_simulate_writes_metrics_csvs_and_plots(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"

    result = invoke(*simulate_args(*generated, throughputs, out, "gavel,fifo"))

    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["policy"] for m in metrics] == ["gavel", "fifo"]
    for m in metrics:
        assert set(m) >= PROMISED_KEYS
        assert set(m["decision_seconds"]) == {"median", "p99", "max"}
        assert m["jobs_completed"] == JOBS
        assert m["makespan_s"] > 0
        assert 0 < m["utilization"] <= 1
    for name in ("gavel-gantt.png", "fifo-gantt.png", "ftf-cdf.png", "utilization.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name
    with (out / "jobs-gavel.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == JOBS
    assert list(rows[0]) == [
        "job_id",
        "arrival",
        "finish",
        "jct",
        "t_exclusive",
        "ftf",
        "ftf_contention",
    ]
    for row in rows:
        assert float(row["jct"]) == pytest.approx(float(row["finish"]) - float(row["arrival"]))
    assert "gandiva_fair" not in result.output
    assert "lower bound" in result.output


def test_simulate_generates_a_workload_without_a_trace(throughputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke(
        "simulate",
        *("--generate", "6", "--seed", "3", "--throughputs", str(throughputs)),
        *("--gpus", "8", "--policy", "fifo", "--out", str(out)),
    )

    assert result.exit_code == 0, result.output
    (metrics,) = json.loads((out / "metrics.json").read_text())
    assert metrics["jobs_completed"] == 6


def test_malformed_trace_line_names_file_line_and_field(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    trace, trajectories = generated
    lines = trace.read_text().splitlines()
    fields = lines[2].split("\t")
    fields[6] = "three"
    lines[2] = "\t".join(fields)
    trace.write_text("\n".join(lines) + "\n")

    result = invoke(*simulate_args(trace, trajectories, throughputs, tmp_path / "o", "fifo"))

    assert_input_error(result, str(trace), "line 3", "scale_factor")
    assert not (tmp_path / "o" / "metrics.json").exists()


@pytest.mark.parametrize(
    ("policy", "fragment"),
    [("nosuch", "'nosuch'"), ("gavel,bogus_policy", "'bogus_policy'"), (",", "--policy")],
)
def test_unknown_policy_is_named(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path, policy: str, fragment: str
) -> None:
    result = invoke(*simulate_args(*generated, throughputs, tmp_path / "o", policy))

    assert_input_error(result, fragment)


def test_missing_file_is_named(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.trace"

    result = invoke(*simulate_args(missing, generated[1], throughputs, tmp_path / "o", "fifo"))

    assert_input_error(result, str(missing), "does not exist")


def test_invalid_json_is_named_with_its_line(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"jobs": [\n  {"job": 0,,}\n]}\n')

    result = invoke(*simulate_args(generated[0], broken, throughputs, tmp_path / "o", "fifo"))

    assert_input_error(result, str(broken), "line 2", "invalid JSON")


def test_cluster_that_does_not_divide_into_nodes_is_rejected(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    args = simulate_args(*generated, throughputs, tmp_path / "o", "fifo")
    args[args.index("--gpus") + 1] = "6"

    result = invoke(*args)

    assert_input_error(result, "--gpus", "6 GPUs")
