"""Importing a production job log: columns by name, times, bad rows, windows, the seeded rule,
and ``shockwave import-trace`` writing whole files or none."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shockwave.domain.model import AdaptationMode, ValidationError, nearest_width
from shockwave.workloads.trace_import import (
    ImportOptions,
    LogFormatError,
    busiest_window,
    import_job_log,
    parse_job_log,
    parse_time,
)
from shockwave.workloads.traces import (
    FormatError,
    ThroughputTable,
    build_workload,
    parse_throughputs,
    parse_trace,
    parse_trajectories,
)
from shockwave_cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def table(reference_dir: Path) -> ThroughputTable:
    path = reference_dir / "throughputs" / "tacc_throughputs.json"
    return parse_throughputs(json.loads(path.read_text()), str(path))


LOG = """job_id,submission_time,duration,num_gpu
a,100,600,1
b,160,7200,2
c,130,3600,16
d,400,86400,4
"""


def test_columns_are_found_by_name_in_any_order_and_case(table: ThroughputTable) -> None:
    reordered = "NUM_GPUS,Duration_S,arrival_s,model,batch_size,mode,tenant\n"
    reordered += "2,3600,50,ResNet-18,64,static,team-a\n1,900,10,,,,\n"
    result = import_job_log(reordered, "log.csv", table, ImportOptions())

    first, second = result.workload.jobs
    assert [j.spec.arrival_s for j in result.workload.jobs] == [0.0, 40.0]
    assert first.spec.gpus == 1 and second.spec.gpus == 2
    assert second.spec.model == "ResNet-18" and second.spec.initial_batch_size == 64
    assert second.spec.mode is AdaptationMode.STATIC
    assert [r.batch_size for r in second.trajectory] == [64]
    assert result.kept[1].tenant == "team-a" and result.kept[0].tenant is None
    # The epochs make the exclusive run time the real one, to within one epoch.
    epoch = second.epoch_seconds[64]
    assert abs(second.t_exclusive_s - 3600.0) <= epoch / 2 + 1e-6


def test_a_header_without_a_required_column_is_refused(table: ThroughputTable) -> None:
    with pytest.raises(FormatError, match="line 1: the header has no duration"):
        import_job_log("submission_time,num_gpu\n1,1\n", "log.csv", table, ImportOptions())


def test_iso_times_are_read_as_utc_seconds(table: ThroughputTable) -> None:
    log = (
        "timestamp,duration_s,num_gpus\n"
        "2021-03-04T10:00:00Z,600,1\n"
        "2021-03-04T10:00:30,600,1\n"
        "2021-03-04T11:00:00+01:00,600,1\n"
    )
    result = import_job_log(log, "log.csv", table, ImportOptions())
    assert [j.spec.arrival_s for j in result.workload.jobs] == [0.0, 0.0, 30.0]
    assert result.offset_s == parse_time("2021-03-04T10:00:00Z")
    assert parse_time("2021-03-04T10:00:00Z") == 1614852000.0


def test_bad_rows_are_reported_by_line_number(table: ThroughputTable) -> None:
    log = (
        "submission_time,duration,num_gpu,model\n"
        "0,600,1,\n"
        "soon,600,1,\n"
        "10,-5,1,\n"
        "\n"
        "20,600,two,\n"
        "30,600,1,BERT\n"
        "40,600,2,Recommendation\n"
    )
    with pytest.raises(LogFormatError) as caught:
        import_job_log(log, "log.csv", table, ImportOptions())
    lines = [line for line, _ in caught.value.bad]
    assert lines == [3, 4, 6, 7]
    message = str(caught.value)
    assert message.startswith("log.csv 4 bad rows: line 3: arrival must be seconds or an ISO")
    assert "line 4: duration must be a number of seconds above 0" in message
    assert "line 7: model 'BERT' is not one of" in message

    # Once they are fixed, a given model the table lacks on the width is reported too.
    fixed = "\n".join(log.splitlines()[i] for i in (0, 1, 7)) + "\n"
    with pytest.raises(LogFormatError, match="line 3: the throughput table has no rate for Rec"):
        import_job_log(fixed, "log.csv", table, ImportOptions())

    skipped = import_job_log(log, "log.csv", table, ImportOptions(skip_bad_rows=True))
    assert len(skipped.workload.jobs) == 1
    assert [(d.line, d.reason.split(":")[0]) for d in skipped.dropped] == [
        (3, "unreadable"),
        (4, "unreadable"),
        (6, "unreadable"),
        (7, "unreadable"),
        (8, "unreadable"),
    ]


def test_window_and_cluster_drops_are_reported(table: ThroughputTable) -> None:
    log = LOG + "e,450,600,3\nf,500,600,64\ng,5000,600,1\nh,460,600,48\n"
    options = ImportOptions(since=120, until=1000, max_gpus=32)
    result = import_job_log(log, "log.csv", table, options)

    assert [j.job_id for j in result.kept] == ["c", "b", "d", "e"]
    assert [j.spec.arrival_s for j in result.workload.jobs] == [0.0, 30.0, 270.0, 320.0]
    assert result.workload.jobs[0].spec.gpus == 16
    reasons = {d.job_id: d.reason for d in result.dropped}
    assert reasons == {
        "a": "before --since",
        "f": "wider than the cluster (64 GPUs > 32)",
        "g": "at or after --until",
        "h": "wider than the cluster (48 GPUs > 32)",
    }
    assert result.rows == 8 and len(result.kept) + len(result.dropped) == result.rows
    kept_raw = import_job_log(log, "log.csv", table, ImportOptions(rebase=False, max_gpus=64))
    assert kept_raw.workload.jobs[0].spec.arrival_s == 100.0
    with pytest.raises(ValidationError, match="no job left"):
        import_job_log(log, "log.csv", table, ImportOptions(since=10**6))


def test_the_rule_is_seeded_per_row(table: ThroughputTable) -> None:
    once = import_job_log(LOG, "log.csv", table, ImportOptions(seed=3))
    again = import_job_log(LOG, "log.csv", table, ImportOptions(seed=3))
    assert once.workload == again.workload
    other = [import_job_log(LOG, "log.csv", table, ImportOptions(seed=s)) for s in range(4, 10)]
    assert any(o.workload != once.workload for o in other)
    # A row draws the same whatever else is imported with it.
    window = import_job_log(LOG, "log.csv", table, ImportOptions(seed=3, since=150))
    full = {j.job_id: job for j, job in zip(once.kept, once.workload.jobs, strict=True)}
    for log_job, job in zip(window.kept, window.workload.jobs, strict=True):
        mine = full[log_job.job_id]
        assert (job.spec.model, job.trajectory, job.spec.mode) == (
            mine.spec.model,
            mine.trajectory,
            mine.spec.mode,
        )


def test_each_job_gets_a_model_of_its_size_class_that_fits_its_run_time(
    table: ThroughputTable,
) -> None:
    rows = "".join(f"{i},{600 + 37 * i},1\n" for i in range(60))
    rows += "".join(f"{100 + i},{40 * 3600},2\n" for i in range(30))
    result = import_job_log("arrival_s,duration_s,num_gpus\n" + rows, "x", table, ImportOptions())
    models = {job.spec.model for job in result.workload.jobs}
    large = {job.spec.model for job in result.workload.jobs if job.spec.gpus == 2}
    assert "Recommendation" not in large  # only Small jobs get the one-GPU model
    assert len(models) >= 4
    for job in result.workload.jobs:
        real = float(job.trace_fields["duration_s"])
        epoch = max(job.epoch_seconds.values())
        assert job.t_exclusive_s <= real + epoch


def test_a_width_that_is_not_a_gang_size_runs_on_the_nearest_with_its_gpu_seconds(
    table: ThroughputTable,
) -> None:
    widths = (3, 5, 6, 7, 12, 24, 48)
    log = "job_id,arrival_s,duration_s,num_gpus\n" + "".join(
        f"j{w},{i * 10},{3600 * w},{w}\n" for i, w in enumerate(widths)
    )
    result = import_job_log(log, "log.csv", table, ImportOptions(max_gpus=56))

    assert result.dropped == ()
    assert [(r.logged_gpus, r.gpus) for r in result.reshaped] == [
        (3, 4),
        (5, 4),
        (6, 8),
        (7, 8),
        (12, 16),
        (24, 32),
        (48, 32),  # 64 is nearer, but wider than the cluster
    ]
    for logged, job in zip(result.kept, result.workload.jobs, strict=True):
        width = int(logged.job_id[1:])
        assert job.spec.gpus == logged.gpus
        # The same GPU-seconds as the log's row: 3600 s x w^2.
        assert math.isclose(logged.duration_s * logged.gpus, 3600.0 * width * width)
        assert job.t_exclusive_s <= logged.duration_s + max(job.epoch_seconds.values())
    exact = import_job_log("arrival_s,duration_s,num_gpus\n0,600,8\n", "x", table, ImportOptions())
    assert exact.reshaped == () and exact.kept[0].duration_s == 600.0


def test_nearest_width() -> None:
    assert [nearest_width(g) for g in (1, 2, 3, 5, 6, 11, 12, 22, 2000)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        16,
        1024,
    ]
    assert nearest_width(48, 40) == 32 and nearest_width(3, 2) == 2
    with pytest.raises(ValueError, match="at least one GPU"):
        nearest_width(0)
    with pytest.raises(ValueError, match="no gang size"):
        nearest_width(3, 0)


def test_busiest_window() -> None:
    jobs, _, _ = parse_job_log(
        "arrival_s,duration_s,num_gpus\n0,10,1\n100,10,1\n150,100,8\n400,10,1\n", "x"
    )
    assert busiest_window(jobs, 100.0) == (100.0, 200.0)
    assert busiest_window(jobs, 1000.0) == (0.0, 1000.0)


def test_wide_gangs_run_at_the_tables_widest_rate_scaled(table: ThroughputTable) -> None:
    exponent = table.scaling_exponent("ResNet-50")
    assert exponent is not None and 0.5 < exponent <= 1.0
    assert table.batch_sizes("ResNet-50", 32) == table.batch_sizes("ResNet-50", 8)
    rate8 = table.steps_per_second("ResNet-50", 64, 8)
    rate32 = table.steps_per_second("ResNet-50", 64, 32)
    assert rate8 is not None and rate32 is not None
    assert math.isclose(rate32, rate8 * 4**exponent)
    assert table.scaling_exponent("Recommendation") is None
    assert table.batch_sizes("Recommendation", 16) == ()
    assert table.batch_sizes("ResNet-50", 12) == () and table.batch_sizes("ResNet-50", 2048) == ()


def write_log(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "log.csv"
    path.write_text(text)
    return path


def command(tmp_path: Path, log: Path, throughputs: Path, *extra: str) -> list[str]:
    return [
        "import-trace",
        *("--csv", str(log), "--throughputs", str(throughputs)),
        *("--out-trace", str(tmp_path / "out" / "x.trace")),
        *("--out-trajectories", str(tmp_path / "out" / "x.json")),
        *extra,
    ]


def test_import_trace_writes_files_simulate_reads(tmp_path: Path, reference_dir: Path) -> None:
    throughputs = reference_dir / "throughputs" / "tacc_throughputs.json"
    log = write_log(tmp_path, LOG.rstrip("\n") + "\ne,90,600,3\nf,95,600,64\n")
    report = tmp_path / "out" / "report.json"
    result = runner.invoke(
        app,
        command(
            tmp_path, log, throughputs, "--seed", "5", "--max-gpus", "16", "--report", str(report)
        ),
    )
    assert result.exit_code == 0, result.output
    assert "Imported 5 of 6 jobs" in result.output
    assert "Reshaped 1 rows to the nearest gang size, the same GPU-seconds (3 -> 4 GPUs: 1)" in (
        result.output
    )
    assert "line 7: wider than the cluster (64 GPUs > 16)" in result.output
    trace = parse_trace((tmp_path / "out" / "x.trace").read_text(), "x.trace")
    trajectories_obj = json.loads((tmp_path / "out" / "x.json").read_text())
    records = parse_trajectories(trajectories_obj, "x.json")
    table = parse_throughputs(json.loads(throughputs.read_text()), "t")
    workload = build_workload(trace, records, table, "x")
    assert [j.spec.gpus for j in workload.jobs] == [4, 1, 16, 2, 4]
    assert [e["source_job_id"] for e in trajectories_obj["jobs"]] == ["e", "a", "c", "b", "d"]
    assert [e.get("source_gpus") for e in trajectories_obj["jobs"]] == [3] + [None] * 4
    reported = json.loads(report.read_text())
    assert reported["dropped_rows"] == [
        {"line": 7, "job_id": "f", "reason": "wider than the cluster (64 GPUs > 16)"}
    ]
    assert reported["reshaped_rows"] == [{"line": 6, "job_id": "e", "logged_gpus": 3, "gpus": 4}]
    simulated = runner.invoke(
        app,
        [
            "simulate",
            *("--trace", str(tmp_path / "out" / "x.trace")),
            *("--trajectories", str(tmp_path / "out" / "x.json")),
            *("--throughputs", str(throughputs), "--gpus", "16", "--gpus-per-node", "8"),
            *("--policy", "gavel", "--out", str(tmp_path / "sim")),
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    metrics = json.loads((tmp_path / "sim" / "metrics.json").read_text())
    assert "4/4" in simulated.output or metrics


def test_import_trace_writes_nothing_on_a_bad_row(tmp_path: Path, reference_dir: Path) -> None:
    throughputs = reference_dir / "throughputs" / "tacc_throughputs.json"
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.trace").write_text("earlier\n")
    log = write_log(tmp_path, LOG + "e,later,600,1\n")
    result = runner.invoke(app, command(tmp_path, log, throughputs))
    assert result.exit_code == 2
    assert "line 6: arrival must be seconds" in result.output
    assert (out / "x.trace").read_text() == "earlier\n"
    assert sorted(p.name for p in out.iterdir()) == ["x.trace"]


def test_import_trace_writes_nothing_when_one_output_cannot_be_written(
    tmp_path: Path, reference_dir: Path
) -> None:
    throughputs = reference_dir / "throughputs" / "tacc_throughputs.json"
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.trace").write_text("earlier\n")
    (tmp_path / "blocked").write_text("a file where a directory should be")
    log = write_log(tmp_path, LOG)
    args = command(tmp_path, log, throughputs, "--report", str(tmp_path / "blocked" / "r.json"))
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "none written" in result.output
    assert (out / "x.trace").read_text() == "earlier\n"
    assert sorted(p.name for p in out.iterdir()) == ["x.trace"]


def test_text_that_is_not_csv_names_its_line(table: ThroughputTable) -> None:
    log = "arrival_s,duration_s,num_gpus\n1,600,1\n2,600," + "9" * 200_000 + "\n"
    with pytest.raises(FormatError, match=r"^log.csv line 3: is not CSV: field larger"):
        import_job_log(log, "log.csv", table, ImportOptions())
