"""Reading and writing the reference formats: traces, trajectories, throughput tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shockwave.domain.model import AdaptationMode, Regime, ValidationError
from shockwave.workloads.traces import (
    TRACE_FIELDS,
    FormatError,
    ThroughputTable,
    TraceFormatError,
    TrajectoryRecord,
    build_workload,
    format_trace,
    format_trajectories,
    parse_throughputs,
    parse_trace,
    parse_trajectories,
)
from shockwave.workloads.workload import SimJob, Workload

# ---------------------------------------------------------------------------------- builders

GOOD = {
    "job_type": "ResNet-18 (batch size 32)",
    "command": "python3 main.py --data_dir=%s/cifar10 --batch_size 32",
    "working_directory": "image_classification/cifar10",
    "num_steps_arg": "--num_steps",
    "needs_data_dir": "1",
    "total_steps": "143450",
    "scale_factor": "1",
    "mode": "accordion",
    "priority_weight": "1",
    "slo": "-1.000000",
    "duration_s": "3338",
    "arrival_s": "55",
}


def trace_line(**overrides: str) -> str:
    return "\t".join({**GOOD, **overrides}[name] for name in TRACE_FIELDS)


def throughput_obj(*entries: tuple[str, int, float]) -> dict[str, Any]:
    """A throughput file holding ``(job_type, gpus, steps/s alone)`` entries under v100."""
    return {"v100": {f"('{job_type}', {gpus})": {"null": rate} for job_type, gpus, rate in entries}}


TABLE = parse_throughputs(
    throughput_obj(
        ("ResNet-18 (batch size 32)", 1, 50.0),
        ("ResNet-18 (batch size 256)", 1, 10.0),
        ("ResNet-18 (batch size 32)", 2, 90.0),
        ("ResNet-18 (batch size 256)", 2, 18.0),
    ),
    "table.json",
)


def trajectory(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "job": 0,
        "model": "ResNet-18",
        "dataset": "CIFAR-10",
        "num_epochs": 92,
        "samples_per_epoch": 50000,
        "scale_factor": 1,
        "trace_duration_s": 3338,
        "regimes": [[32, 28], [256, 64]],
        "epoch_seconds_at_bs": {"32": 31.25, "256": 19.53125},
    }
    entry.update(overrides)
    return entry


def build(lines: list[str], entries: list[dict[str, Any]]) -> Workload:
    return build_workload(
        parse_trace("\n".join(lines), "t.trace"),
        parse_trajectories({"jobs": entries}, "t.json"),
        TABLE,
        "tiny",
    )


def round_trip(workload: Workload, table: ThroughputTable) -> Workload:
    """Write the workload in both formats (through JSON text) and read it back."""
    trajectories = json.loads(json.dumps(format_trajectories(workload)))
    return build_workload(
        parse_trace(format_trace(workload), "out.trace"),
        parse_trajectories(trajectories, "out.json"),
        table,
        workload.name,
    )


# -------------------------------------------------------------------------------- trace lines


@pytest.mark.parametrize(
    ("bad_line", "field", "message"),
    [
        ("only\tthree\tfields", "line", "expected 12 tab-separated fields, got 3"),
        (trace_line() + "\textra", "line", "expected 12 tab-separated fields, got 13"),
        (trace_line(job_type="ResNet-18"), "job_type", "field 1 (job_type) must look like"),
        (
            trace_line(job_type="A3C (batch size 4)"),
            "job_type",
            "field 1 (job_type) must name a model of known size",
        ),
        (
            trace_line(needs_data_dir="yes"),
            "needs_data_dir",
            "field 5 (needs_data_dir) must be 0 or 1, got 'yes'",
        ),
        (
            trace_line(total_steps="many"),
            "total_steps",
            "field 6 (total_steps) must be a whole number, got 'many'",
        ),
        (
            trace_line(total_steps="0"),
            "total_steps",
            "field 6 (total_steps) must be positive, got '0'",
        ),
        (
            trace_line(scale_factor="3"),
            "scale_factor",
            "field 7 (scale_factor) must be a power of two from 1 to 1024, got '3'",
        ),
        (
            trace_line(scale_factor="1.5"),
            "scale_factor",
            "field 7 (scale_factor) must be a whole number, got '1.5'",
        ),
        (
            trace_line(mode="elastic"),
            "mode",
            "field 8 (mode) must be one of static, accordion, gns, got 'elastic'",
        ),
        (
            trace_line(mode="custom"),
            "mode",
            "field 8 (mode) must be one of static, accordion, gns, got 'custom'",
        ),
        (
            trace_line(priority_weight="0"),
            "priority_weight",
            "field 9 (priority_weight) must be positive, got '0'",
        ),
        (trace_line(slo="none"), "slo", "field 10 (slo) must be a number, got 'none'"),
        (
            trace_line(duration_s="inf"),
            "duration_s",
            "field 11 (duration_s) must be a finite number, got 'inf'",
        ),
        (
            trace_line(arrival_s="-5"),
            "arrival_s",
            "field 12 (arrival_s) must be >= 0, got '-5'",
        ),
        (
            trace_line(arrival_s="soon"),
            "arrival_s",
            "field 12 (arrival_s) must be a number, got 'soon'",
        ),
    ],
)
def test_malformed_line_is_reported_with_source_line_and_field(
    bad_line: str, field: str, message: str
) -> None:
    text = f"{trace_line()}\n\n{bad_line}\n{trace_line()}\n"

    with pytest.raises(TraceFormatError) as caught:
        parse_trace(text, "traces/x.trace")

    error = caught.value
    assert str(error).startswith(f"traces/x.trace line 3: {message}")
    assert (error.source, error.line_number, error.field) == ("traces/x.trace", 3, field)
    assert isinstance(error, ValidationError)
    assert isinstance(error, ValueError)


def test_trace_line_is_read_into_typed_fields() -> None:
    (job,) = parse_trace(trace_line(), "x.trace")

    assert job.job_type == "ResNet-18 (batch size 32)"
    assert (job.model, job.initial_batch_size, job.samples_per_epoch) == ("ResNet-18", 32, 50000)
    assert job.command == "python3 main.py --data_dir=%s/cifar10 --batch_size 32"
    assert job.working_directory == "image_classification/cifar10"
    assert (job.num_steps_arg, job.needs_data_dir) == ("--num_steps", True)
    assert (job.total_steps, job.scale_factor, job.mode) == (143450, 1, AdaptationMode.ACCORDION)
    assert (job.priority_weight, job.slo, job.duration_s, job.arrival_s) == (1, -1, 3338, 55)
    assert job.line() == trace_line()


@pytest.mark.parametrize(
    ("job_type", "total_steps", "epochs"),
    [
        ("ResNet-18 (batch size 32)", "143450", 92),
        ("ResNet-18 (batch size 32)", "1563", 1),
        ("ResNet-18 (batch size 32)", "1564", 2),
        ("LM (batch size 10)", "134583", 23),
        ("ResNet-50 (batch size 64)", "41840", 27),
        ("Transformer (batch size 64)", "5842", 38),
        ("Recommendation (batch size 8192)", "44921", 2995),
    ],
)
def test_epochs_are_steps_over_rounded_up_iterations_per_epoch(
    job_type: str, total_steps: str, epochs: int
) -> None:
    (job,) = parse_trace(trace_line(job_type=job_type, total_steps=total_steps), "x.trace")

    assert job.num_epochs == epochs


def test_blank_lines_are_skipped_and_crlf_accepted() -> None:
    text = f"\n{trace_line()}\r\n   \n{trace_line(arrival_s='60')}\n\n"

    jobs = parse_trace(text, "x.trace")

    assert [job.arrival_s for job in jobs] == [55, 60]


# -------------------------------------------------------------------------------- throughputs


def test_throughput_table_keeps_isolated_rates_of_batch_size_job_types() -> None:
    table = parse_throughputs(
        {
            "k80": {"('ResNet-18 (batch size 32)', 1)": {"null": 5.0}},
            "v100": {
                "('ResNet-18 (batch size 64)', 1)": {
                    "null": 40.0,
                    "('LM (batch size 5)', 1)": [1, 2],
                },
                "('ResNet-18 (batch size 16)', 1)": {"null": 60.0},
                "('Transformer (batch size 256)', 1)": {"null": 0.0},
                "('A3C', 1)": {"null": 3.0},
            },
        },
        "t.json",
    )

    assert table.models == ("ResNet-18",)
    assert table.batch_sizes("ResNet-18", 1) == (16, 64)
    assert table.batch_sizes("Transformer", 1) == ()
    assert table.steps_per_second("ResNet-18", 64, 1) == 40.0
    assert table.steps_per_second("ResNet-18", 64, 2) is None
    assert table.epoch_seconds("ResNet-18", 64, 1, 50000) == pytest.approx(50000 / 64 / 40.0)
    assert dict(table.profile("ResNet-18", 1).samples_per_second) == {16: 960.0, 64: 2560.0}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"k80": {}}, "t.json GPU type 'v100': not in the file (has k80)"),
        ({"v100": {"ResNet-18": {"null": 1.0}}}, "t.json v100 key 'ResNet-18': must look like"),
        (
            {"v100": {"('LM (batch size 5)', 1)": {"null": -1.0}}},
            "t.json v100 key \"('LM (batch size 5)', 1)\": needs a rate >= 0 under 'null', got -1",
        ),
        (
            {"v100": {"('LM (batch size 5)', 1)": [1.0]}},
            "t.json v100 key \"('LM (batch size 5)', 1)\": needs a rate >= 0 under 'null', got N",
        ),
    ],
)
def test_malformed_throughputs_name_source_and_key(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(FormatError) as caught:
        parse_throughputs(obj, "t.json")

    assert str(caught.value).startswith(message)


# ------------------------------------------------------------------------------- trajectories


def test_trajectory_record_is_read_into_regimes_and_epoch_times() -> None:
    (record,) = parse_trajectories({"format": "...", "jobs": [trajectory()]}, "t.json")

    assert record == TrajectoryRecord(
        job=0,
        model="ResNet-18",
        num_epochs=92,
        samples_per_epoch=50000,
        scale_factor=1,
        regimes=(Regime(32, 28), Regime(256, 64)),
        epoch_seconds_at_bs={32: 31.25, 256: 19.53125},
        dataset="CIFAR-10",
        trace_duration_s=3338,
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"format": "x"}, "t.json top level: needs a 'jobs' list"),
        ({"jobs": ["job"]}, "t.json job 0: must be an object"),
        ({"jobs": [trajectory(model=3)]}, "t.json job 0: model must be a non-empty string"),
        ({"jobs": [trajectory(regimes=[])]}, "t.json job 0: regimes must be a non-empty list"),
        ({"jobs": [trajectory(regimes=[[32]])]}, "t.json job 0: regimes[0] must be [batch_size"),
        (
            {"jobs": [trajectory(regimes=[[32, 92], [256, 0]])]},
            "t.json job 0: regimes[1].epochs must be a positive integer, got 0",
        ),
        (
            {"jobs": [trajectory(num_epochs=90)]},
            "t.json job 0: regimes sum to 92 epochs but num_epochs is 90",
        ),
        (
            {"jobs": [trajectory(epoch_seconds_at_bs={"32": 31.25})]},
            "t.json job 0: epoch_seconds_at_bs lacks the regimes' batch sizes [256]",
        ),
        (
            {"jobs": [trajectory(epoch_seconds_at_bs={"32": 31.25, "256": 0})]},
            "t.json job 0: epoch_seconds_at_bs[256] must be positive, got 0",
        ),
        (
            {"jobs": [trajectory(), trajectory(scale_factor="two")]},
            "t.json job 1: scale_factor must be a whole number >= 0, got 'two'",
        ),
    ],
)
def test_malformed_trajectories_name_source_and_job(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(FormatError) as caught:
        parse_trajectories(obj, "t.json")

    assert str(caught.value).startswith(message)


# ----------------------------------------------------------------------------------- workload


def test_workload_joins_trace_trajectory_and_table() -> None:
    workload = build(
        [trace_line(), trace_line(scale_factor="2", mode="gns", arrival_s="60")],
        [trajectory(), trajectory(job=1, scale_factor=2)],
    )

    first, second = workload.jobs
    assert workload.name == "tiny"
    assert [j.spec.job_id for j in workload.jobs] == ["0", "1"]
    assert (first.spec.gpus, first.spec.epochs, first.spec.initial_batch_size) == (1, 92, 32)
    assert (first.spec.mode, first.spec.batch_sizes, first.spec.model) == (
        AdaptationMode.ACCORDION,
        (32, 256),
        "ResNet-18",
    )
    assert dict(first.spec.throughput.samples_per_second) == {32: 1600.0, 256: 2560.0}
    assert first.trajectory == (Regime(32, 28), Regime(256, 64))
    assert first.t_exclusive_s == pytest.approx(28 * 31.25 + 64 * 19.53125)
    assert dict(first.trace_fields) == GOOD
    assert (second.spec.gpus, second.spec.mode, second.spec.arrival_s) == (2, "gns", 60.0)


@pytest.mark.parametrize(
    ("lines", "entries", "message"),
    [
        (
            [trace_line(), trace_line()],
            [trajectory()],
            "tiny jobs: the trace has 2 jobs but the trajectories have 1",
        ),
        (
            [trace_line()],
            [trajectory(job=7)],
            "tiny job 0: trace and trajectory disagree on job: trace 0, trajectory 7",
        ),
        (
            [trace_line(scale_factor="2")],
            [trajectory()],
            "tiny job 0: trace and trajectory disagree on scale_factor: trace 2, trajectory 1",
        ),
        (
            [trace_line(total_steps="1563")],
            [trajectory()],
            "tiny job 0: trace and trajectory disagree on num_epochs: trace 1, trajectory 92",
        ),
        (
            [trace_line()],
            [trajectory(model="LM")],
            "tiny job 0: trace and trajectory disagree on model: trace 'ResNet-18', "
            "trajectory 'LM'",
        ),
        (
            [trace_line()],
            [trajectory(regimes=[[256, 64], [32, 28]])],
            "tiny job 0: trace and trajectory disagree on initial_batch_size: trace 32, "
            "trajectory 256",
        ),
        (
            [trace_line()],
            [trajectory(regimes=[[32, 28], [128, 64]], epoch_seconds_at_bs={"32": 1, "128": 1})],
            "tiny job 0: the v100 throughput table has no rate for ResNet-18 at batch sizes "
            "[128] on 1 GPUs",
        ),
        (
            [trace_line(), trace_line(arrival_s="50")],
            [trajectory(), trajectory(job=1)],
            "tiny job 1: arrives at 50.0 s, before job 0 (55.0 s)",
        ),
    ],
)
def test_disagreeing_inputs_name_the_job(
    lines: list[str], entries: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(FormatError) as caught:
        build(lines, entries)

    assert str(caught.value) == message


def test_written_workload_reads_back_equal() -> None:
    workload = build(
        [
            trace_line(),
            trace_line(priority_weight="2.5", arrival_s="60.25", slo="12.5", needs_data_dir="0"),
        ],
        [trajectory(), trajectory(job=1)],
    )

    text = format_trace(workload)

    assert text.splitlines()[1].split("\t")[4:] == [
        "0", "143450", "1", "accordion", "2.5", "12.500000", "3338", "60.25",
    ]  # fmt: skip
    assert round_trip(workload, TABLE) == workload


def test_job_without_trace_fields_is_written_with_gavel_command_and_run_time() -> None:
    job = build([trace_line()], [trajectory()]).jobs[0]
    bare = Workload((SimJob(job.spec, job.trajectory, job.epoch_seconds),), name="bare")

    (line,) = format_trace(bare).splitlines()

    assert line == trace_line(total_steps=str(92 * 1563), duration_s=str(round(job.t_exclusive_s)))
    assert round_trip(bare, TABLE).jobs[0].spec == job.spec


# ------------------------------------------------------------------------------ reference data

REFERENCE_TRACES = [
    ("120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic", "tacc", 120),
    ("220_0.2_5_100_25_4_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic", "wisr", 220),
    ("900_0.2_5_1000_5_15_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic", "wisr", 900),
    ("900_0.2_5_100_5_15_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic", "wisr", 900),
]


def load_reference(
    reference_dir: Path, stem: str, kind: str
) -> tuple[str, Workload, ThroughputTable]:
    table_path = reference_dir / "throughputs" / f"{kind}_throughputs.json"
    trace_path = reference_dir / "traces" / f"{stem}.trace"
    trajectory_path = reference_dir / "trajectories" / f"{stem}.{kind}.trajectories.json"
    table = parse_throughputs(json.loads(table_path.read_text()), table_path.name)
    text = trace_path.read_text()
    workload = build_workload(
        parse_trace(text, trace_path.name),
        parse_trajectories(json.loads(trajectory_path.read_text()), trajectory_path.name),
        table,
        stem,
    )
    return text, workload, table


@pytest.mark.parametrize(("stem", "kind", "jobs"), REFERENCE_TRACES)
def test_reference_trace_builds_and_writes_back_unchanged(
    reference_dir: Path, stem: str, kind: str, jobs: int
) -> None:
    text, workload, table = load_reference(reference_dir, stem, kind)

    assert len(workload.jobs) == jobs
    assert format_trace(workload) == text
    assert round_trip(workload, table) == workload


@pytest.mark.parametrize(
    ("job_id", "model", "initial_bs", "epochs", "mode", "arrival_s", "regimes"),
    [
        ("0", "LM", 10, 23, "gns", 0, ((10, 11), (20, 10), (40, 1), (10, 1))),
        ("1", "ResNet-18", 32, 92, "accordion", 55, ((32, 28), (256, 64))),
        ("2", "ResNet-50", 64, 27, "gns", 64, ((64, 27),)),
    ],
)
def test_reference_120_job_trace_agrees_with_its_trajectory_file(
    reference_dir: Path,
    job_id: str,
    model: str,
    initial_bs: int,
    epochs: int,
    mode: str,
    arrival_s: float,
    regimes: tuple[tuple[int, int], ...],
) -> None:
    _, workload, _ = load_reference(reference_dir, *REFERENCE_TRACES[0][:2])
    job = workload.jobs[int(job_id)]

    assert job.spec.job_id == job_id
    assert (job.spec.model, job.spec.initial_batch_size, job.spec.epochs) == (
        model,
        initial_bs,
        epochs,
    )
    assert (job.spec.mode, job.spec.arrival_s) == (mode, arrival_s)
    assert job.trajectory == tuple(Regime(bs, n) for bs, n in regimes)


def test_reference_120_job_trace_lower_bound_on_32_gpus(reference_dir: Path) -> None:
    _, workload, _ = load_reference(reference_dir, *REFERENCE_TRACES[0][:2])

    assert workload.makespan_lower_bound(32) == pytest.approx(20518, abs=1)
    assert sum(j.gpu_seconds for j in workload.jobs) == pytest.approx(635795, abs=1)
