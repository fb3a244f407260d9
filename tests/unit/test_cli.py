"""The ``shockwave`` command line: listing policies, generating and simulating, bad input."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from shockwave.domain.model import Cluster
from shockwave.policies import BASELINES
from shockwave.policies.shockwave_market.shockwave import ShockwaveParams
from shockwave.workloads.traces import TRACE_FIELDS
from shockwave_cli.main import INPUT_ERROR_EXIT, app

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


def test_simulate_report_writes_one_page_with_the_table_and_every_plot(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"

    result = invoke(*simulate_args(*generated, throughputs, out, "gavel,fifo"), "--report")

    assert result.exit_code == 0, result.output
    assert "report.html" in result.output
    page = (out / "report.html").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    for m in metrics:
        assert f"<td>{m['policy']}</td><td>{m['makespan_s']:,.0f}</td>" in page
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    plots = ["gantt.png", "utilization.png", "ftf-cdf.png", "gavel-gantt.png", "fifo-gantt.png"]
    assert images == plots
    assert "http" not in page, "the page loads nothing from anywhere"


def test_every_policys_gantt_shares_one_time_axis_and_marks_batch_size_changes(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    from shockwave.policies.policy import get_policy, make_params
    from shockwave.simulation.simulator import SimSettings, simulate
    from shockwave_cli.commands.inputs import load_throughputs, load_workload
    from shockwave_cli.reports.plots import moving_average, plot_gantts, time_weighted_mean

    work = load_workload(*generated, load_throughputs(throughputs))
    results = [
        simulate(
            work,
            Cluster.of_gpus(8, 4),
            get_policy(name),
            make_params(get_policy(name)),
            SimSettings(),
        )
        for name in ("fifo", "gavel")
    ]
    assert any(job.scalings for job in results[0].jobs), "the workload changes batch sizes"
    plot_gantts(results, tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").read_bytes().startswith(PNG_MAGIC)

    points = [(0.0, 1.0), (10.0, 0.0), (20.0, 0.5)]
    assert time_weighted_mean(points, 40.0) == pytest.approx((10 + 0 + 10) / 40)
    times, values = moving_average(points, 40.0, 10.0)
    assert times == [10.0, 20.0, 40.0] and values == pytest.approx([1.0, 0.0, 0.5])


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


def test_simulate_on_typed_gpus_aware_and_agnostic(throughputs: Path, tmp_path: Path) -> None:
    for agnostic in ((), ("--heterogeneity-agnostic",)):
        out = tmp_path / f"out{len(agnostic)}"
        result = invoke(
            "simulate",
            *("--generate", "6", "--seed", "3", "--throughputs", str(throughputs)),
            *("--gpus", "v100:4,k80:4", "--policy", "gavel", "--out", str(out), *agnostic),
        )
        assert result.exit_code == 0, result.output
        assert "v100 1x4 + k80 1x4" in result.output
        (metrics,) = json.loads((out / "metrics.json").read_text())
        assert metrics["jobs_completed"] == 6


@pytest.mark.parametrize(
    ("gpus", "fragment"),
    [("v100:6", "do not divide"), ("a100:8", "a100"), ("v100", "neither a GPU count")],
)
def test_simulate_refuses_a_bad_typed_cluster(
    throughputs: Path, tmp_path: Path, gpus: str, fragment: str
) -> None:
    result = invoke(
        "simulate",
        *("--generate", "4", "--seed", "3", "--throughputs", str(throughputs)),
        *("--gpus", gpus, "--policy", "fifo", "--out", str(tmp_path / "o")),
    )
    assert_input_error(result, fragment)


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


# --- the Shockwave policy's knobs -------------------------------------------------------------


def generated_simulate_args(throughputs: Path, out: Path, *extra: str) -> list[str]:
    """``simulate`` on 6 generated jobs (seed 3) on 8 GPUs, plus ``extra`` options."""
    return [
        "simulate",
        *("--generate", "6", "--seed", "3", "--throughputs", str(throughputs)),
        *("--gpus", "8", "--out", str(out)),
        *extra,
    ]


def metrics_of(out: Path, policy: str) -> dict[str, object]:
    rows = json.loads((out / "metrics.json").read_text())
    (row,) = [r for r in rows if r["policy"] == policy]
    assert isinstance(row, dict)
    return row


def test_shockwave_knobs_reach_the_policy_and_solver_stats_are_recorded(
    throughputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = generated_simulate_args(
        throughputs,
        out,
        *("--policy", "shockwave,fifo", "--window-rounds", "5", "--use-scip", "never"),
        *("--makespan-weight", "50", "--replan", "lazy", "--fairness-exponent", "2"),
        *("--predictor", "restatement", "--packing-order", "deadline"),
    )

    result = invoke(*args)

    assert result.exit_code == 0, result.output
    row = metrics_of(out, "shockwave")
    assert row["jobs_completed"] == 6
    params = row["params"]
    assert isinstance(params, dict)
    assert params["planner"]["rounds"] == 5
    assert params["planner"]["use_scip"] == "never"
    assert params["planner"]["makespan_weight"] == 50
    assert params["regime_predictor"] == "restatement"
    assert params["planner"]["time_limit_s"] == 15.0
    assert (params["replan"], params["fairness_exponent"]) == ("lazy", 2)
    assert (params["oracle"], params["prediction_error"]) == (False, 0.0)
    assert params["packing_order"] == "deadline"
    solver = row["solver"]
    assert isinstance(solver, dict)
    assert solver["solves"] >= 1
    assert solver["last_solve"]["solver"] == "greedy"
    fifo = metrics_of(out, "fifo")
    assert "solver" not in fifo
    assert fifo["params"] == {"backfill": False}


def test_shockwave_defaults_come_from_its_params(throughputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"

    result = invoke(*generated_simulate_args(throughputs, out, "--policy", "shockwave"))

    assert result.exit_code == 0, result.output
    params = metrics_of(out, "shockwave")["params"]
    assert params == asdict(replace(ShockwaveParams(), error_seed=3))


@pytest.mark.parametrize(
    ("extra", "field", "value"),
    [
        pytest.param(("--oracle",), "oracle", True, id="oracle"),
        pytest.param(("--prediction-error", "0.5"), "prediction_error", 0.5, id="error"),
    ],
)
def test_oracle_and_prediction_error_runs(
    throughputs: Path, tmp_path: Path, extra: tuple[str, ...], field: str, value: object
) -> None:
    out = tmp_path / "out"
    args = generated_simulate_args(
        throughputs, out, "--policy", "shockwave", "--use-scip", "never", *extra
    )

    result = invoke(*args)

    assert result.exit_code == 0, result.output
    row = metrics_of(out, "shockwave")
    assert row["jobs_completed"] == 6
    params = row["params"]
    assert isinstance(params, dict)
    assert params[field] == value
    assert params["error_seed"] == 3


def test_throughput_knowledge_applies_to_every_policy(throughputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--policy", "gavel,fifo", "--throughput-knowledge", "none"]

    result = invoke(*generated_simulate_args(throughputs, out, *args))

    assert result.exit_code == 0, result.output
    assert "throughputs none" in result.output
    records = json.loads((out / "metrics.json").read_text())
    assert [(r["jobs_completed"], r["throughput_knowledge"]) for r in records] == [(6, "none")] * 2


def test_variation_changes_the_truth_not_the_declaration(throughputs: Path, tmp_path: Path) -> None:
    runs = {}
    for name, extra in (("given", ()), ("varied", ("--variation", "throughput:0.5"))):
        out = tmp_path / name
        result = invoke(*generated_simulate_args(throughputs, out, "--policy", "fifo", *extra))
        assert result.exit_code == 0, result.output
        runs[name] = metrics_of(out, "fifo")
    assert "variation throughput:0.5" in result.output
    assert runs["varied"]["jobs_completed"] == 6
    assert runs["varied"]["makespan_s"] != runs["given"]["makespan_s"]


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        pytest.param(
            ("--throughput-knowledge", "noisy:2"), ("--throughput-knowledge", "noisy:P"), id="tk"
        ),
        pytest.param(("--variation", "speed:0.3"), ("--variation", "throughput:S"), id="var"),
        pytest.param(("--predictor", "psychic"), ("--predictor", "'psychic'"), id="predictor"),
        pytest.param(("--replan", "eager"), ("--replan", "'eager'"), id="replan"),
        pytest.param(("--packing-order", "fifo"), ("--packing-order", "'fifo'"), id="packing"),
        pytest.param(("--use-scip", "maybe"), ("--use-scip", "'maybe'"), id="use-scip"),
        pytest.param(("--window-rounds", "0"), ("--window-rounds", "> 0"), id="window"),
        pytest.param(("--replan-every", "-2"), ("--replan-every", "> 0"), id="replan-every"),
        pytest.param(("--prediction-error", "1.5"), ("--prediction-error",), id="error"),
        pytest.param(("--makespan-weight", "-1"), ("--makespan-weight", ">= 0"), id="lambda"),
        pytest.param(("--deadline-weight", "-1"), ("--deadline-weight", ">= 0"), id="mu"),
        pytest.param(("--solver-time-limit", "0"), ("--solver-time-limit", "> 0"), id="limit"),
        pytest.param(("--solver-gap", "nan"), ("--solver-gap", "finite"), id="gap-nan"),
        pytest.param(("--fairness-exponent", "-1"), ("--fairness-exponent",), id="k"),
    ],
)
def test_invalid_shockwave_knob_is_named(
    throughputs: Path, tmp_path: Path, extra: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    out = tmp_path / "out"

    result = invoke(*generated_simulate_args(throughputs, out, "--policy", "shockwave", *extra))

    assert_input_error(result, *fragments)
    assert not (out / "metrics.json").exists()


def test_shockwave_knob_without_the_shockwave_policy_is_an_error(
    throughputs: Path, tmp_path: Path
) -> None:
    args = generated_simulate_args(
        throughputs, tmp_path / "o", "--policy", "fifo", "--window-rounds", "5", "--oracle"
    )

    result = invoke(*args)

    assert_input_error(result, "--window-rounds, --oracle", "shockwave")


# --- the mode mix of generated workloads ------------------------------------------------------


def generate_args(throughputs: Path, trace: Path, jobs: int, *extra: str) -> list[str]:
    return [
        "generate",
        *("--jobs", str(jobs), "--seed", "5", "--throughputs", str(throughputs)),
        *("--out-trace", str(trace), "--out-trajectories", str(trace.with_suffix(".json"))),
        *extra,
    ]


def trace_modes(trace: Path) -> set[str]:
    column = TRACE_FIELDS.index("mode")
    return {line.split("\t")[column] for line in trace.read_text().splitlines()}


@pytest.mark.parametrize(
    ("mix", "modes"),
    [
        ("1,0,0", {"static"}),
        ("0,1,0", {"accordion"}),
        ("0, 0, 1", {"gns"}),
        (None, {"accordion", "gns"}),
    ],
)
def test_generate_mode_mix(
    throughputs: Path, tmp_path: Path, mix: str | None, modes: set[str]
) -> None:
    trace = tmp_path / "mix.trace"
    extra = () if mix is None else ("--mode-mix", mix)

    result = invoke(*generate_args(throughputs, trace, 30, *extra))

    assert result.exit_code == 0, result.output
    assert trace_modes(trace) == modes
    if mix == "1,0,0":
        jobs = json.loads(trace.with_suffix(".json").read_text())["jobs"]
        assert all(len(job["regimes"]) == 1 for job in jobs)


@pytest.mark.parametrize(
    ("mix", "fragment"),
    [
        ("0.5,0.5", "expected 3 shares"),
        ("a,b,c", "expected 3 shares"),
        ("", "expected 3 shares"),
        ("0.5,0.5,0.5", "sum to 1"),
        ("0.5,-0.5,1", ">= 0"),
        ("inf,0,0", "finite"),
    ],
)
def test_malformed_mode_mix_is_a_clean_error(
    throughputs: Path, tmp_path: Path, mix: str, fragment: str
) -> None:
    trace = tmp_path / "mix.trace"

    result = invoke(*generate_args(throughputs, trace, 3, "--mode-mix", mix))

    assert_input_error(result, "--mode-mix", fragment)
    assert not trace.exists()


def test_simulate_generate_takes_the_mode_mix(throughputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = generated_simulate_args(throughputs, out, "--policy", "fifo", "--mode-mix", "1,0,0")

    result = invoke(*args)

    assert result.exit_code == 0, result.output
    assert metrics_of(out, "fifo")["jobs_completed"] == 6


def test_mode_mix_with_a_trace_is_an_error(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    args = [*simulate_args(*generated, throughputs, tmp_path / "o", "fifo"), "--mode-mix", "1,0,0"]

    result = invoke(*args)

    assert_input_error(result, "--mode-mix", "--generate")


# --- predict-report ---------------------------------------------------------------------------


def predict_report(
    generated: tuple[Path, Path], throughputs: Path, out: Path, *extra: str
) -> Result:
    """``predict-report`` on the generated workload, writing to ``out``, plus ``extra``."""
    trace, trajectories = generated
    return invoke(
        "predict-report",
        *("--trace", str(trace), "--trajectories", str(trajectories)),
        *("--throughputs", str(throughputs), "--out", str(out)),
        *extra,
    )


def test_predict_report_prints_the_table_and_writes_json_and_plot(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "pred"

    result = predict_report(generated, throughputs, out)

    assert result.exit_code == 0, result.output
    for fragment in ("0%", "90%", "restatement", "greedy", "mean", "Oracle"):
        assert fragment in result.output
    report = json.loads((out / "prediction.json").read_text())
    assert report["jobs"] == JOBS
    assert [row["percent"] for row in report["progress"]] == list(range(0, 100, 10))
    assert report["overall"]["oracle"] == {"regime_error": 0.0, "runtime_accuracy": 1.0}
    assert report["policy_predictor"] == "population"
    assert set(report["overall"]["population"]) == {"regime_error", "runtime_accuracy"}
    assert "throughput_error" not in report
    assert (out / "prediction.png").read_bytes().startswith(PNG_MAGIC)


def test_predict_report_without_declared_throughputs_reports_their_error(
    generated: tuple[Path, Path], throughputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "pred"
    knowledge = ("--throughput-knowledge", "noisy:0.2", "--seed", "4", "--slowdown", "2")

    result = predict_report(generated, throughputs, out, *knowledge)

    assert result.exit_code == 0, result.output
    assert "population*" in result.output and "throughput" in result.output
    report = json.loads((out / "prediction.json").read_text())
    assert (report["throughput_knowledge"], report["slowdown"]) == ("noisy:0.2", 2.0)
    assert 0 < report["throughput_error"] < 100
    assert "throughput_error" in report["progress"][0]


def test_predict_report_without_dynamic_jobs_is_an_error(throughputs: Path, tmp_path: Path) -> None:
    trace = tmp_path / "static.trace"
    assert invoke(*generate_args(throughputs, trace, 4, "--mode-mix", "1,0,0")).exit_code == 0

    result = invoke(
        "predict-report",
        *("--trace", str(trace), "--trajectories", str(trace.with_suffix(".json"))),
        *("--throughputs", str(throughputs)),
    )

    assert_input_error(result, str(trace), "accordion or gns")


def test_user_text_is_printed_inert_control_characters_escaped_and_no_markup() -> None:
    from rich.console import Console

    from shockwave_cli.client.jobs_render import events_table, jobs_table

    hostile = "x\x1b[2J\x9b[bold]y[/bold]"
    console = Console(record=True, width=200, color_system=None)
    console.print(jobs_table([{"id": "j", "name": hostile, "state": "PENDING"}]))
    console.print(events_table([{"kind": "excluded", "reason": hostile, "payload": {}}]))
    text = console.export_text()
    assert "\x1b" not in text and "\x9b" not in text
    assert text.count("x\\x1b[2J\\x9b[bold]y[/bold]") == 2


def test_jobs_logs_follow_prints_only_what_the_new_tail_adds() -> None:
    from shockwave_cli.commands.jobs_commands import new_output

    assert new_output("", "a\nb\n") == "a\nb\n"
    assert new_output("a\nb\n", "a\nb\nc\n") == "c\n"
    assert new_output("a\nb\nc\n", "b\nc\nd\n") == "d\n", "the window slid past its start"
    assert new_output("a\nb\n", "a\nb\n") == ""
