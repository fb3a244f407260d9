"""``shockwave import-trace``: a production job log (CSV) as a trace and a trajectory file.

The rule that fills in what the log lacks lives in :mod:`shockwave.workloads.trace_import`; this
module reads the files, writes the outputs and prints what was dropped and why. Outputs are written
whole or not at all: each goes to a temporary file beside its destination, and only when every
one is complete are they renamed into place (a rename within a directory is atomic), so a
failure leaves any earlier files as they were.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from shockwave.domain.model import ValidationError
from shockwave.workloads.trace_import import ImportOptions, ImportResult, import_job_log, parse_time
from shockwave.workloads.traces import format_trace, format_trajectories
from shockwave_cli.commands.inputs import InputError, load_throughputs, read_text

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

REPORT_LINES_SHOWN = 10
"""Dropped rows listed one by one on the terminal (all are in --report)."""


def import_trace_command(
    csv: Annotated[
        Path,
        typer.Option(
            help="Job log, one job per row with a header: submission_time/arrival_s/timestamp "
            "(seconds or ISO date-times), duration/duration_s, num_gpu/num_gpus; optional "
            "model, batch_size, mode, tenant, job_id."
        ),
    ],
    throughputs: Annotated[
        Path, typer.Option(help="Throughput table (reference JSON, e.g. tacc_throughputs.json).")
    ],
    out_trace: Annotated[Path, typer.Option(help="Where to write the Gavel-format trace.")],
    out_trajectories: Annotated[Path, typer.Option(help="Where to write the trajectories JSON.")],
    seed: Annotated[
        int, typer.Option(help="Seed of the rule that assigns model, batch size and mode.")
    ] = 0,
    since: Annotated[
        str | None,
        typer.Option(help="Keep jobs arriving at or after this time (seconds or ISO, as the log)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Keep jobs arriving before this time (seconds or ISO, as the log)."),
    ] = None,
    rebase: Annotated[
        bool, typer.Option(help="Shift times so the first kept job arrives at 0 s.")
    ] = True,
    max_gpus: Annotated[
        int | None,
        typer.Option(
            help="Drop (and report) jobs wider than this: the simulated cluster's size.", min=1
        ),
    ] = None,
    skip_bad_rows: Annotated[
        bool,
        typer.Option(
            "--skip-bad-rows",
            help="Drop unreadable rows into the report instead of failing on them.",
        ),
    ] = False,
    report: Annotated[
        Path | None,
        typer.Option(
            help="Also write a JSON report: the rows read, kept and dropped, and every dropped "
            "row's line, job id and reason (each imported job's log line, job id and tenant "
            "are in the trajectory file)."
        ),
    ] = None,
) -> None:
    """Convert a cluster's job log (CSV) into a trace and trajectory file for `simulate`.

    What the log lacks (model, batch size, adaptation mode, epochs) is assigned by a seeded
    rule: docs/real-traces.md.
    """
    try:
        options = ImportOptions(
            seed=seed,
            since=_time_option("--since", since),
            until=_time_option("--until", until),
            rebase=rebase,
            max_gpus=max_gpus,
            skip_bad_rows=skip_bad_rows,
        )
        table = load_throughputs(throughputs)
        text = read_text(csv, "job log")
        try:
            result = import_job_log(text, str(csv), table, options)
        except ValidationError as error:
            raise InputError(str(error)) from None
        outputs: list[tuple[Path, str]] = [
            (out_trace, format_trace(result.workload)),
            (out_trajectories, json.dumps(_trajectories(result), indent=1) + "\n"),
        ]
        if report is not None:
            outputs.append((report, json.dumps(_report(result, options), indent=1) + "\n"))
        write_all(outputs)
    except InputError as error:
        errors.print(f"[red]error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from None
    _print_summary(result, out_trace, out_trajectories)


def _time_option(name: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as error:
        raise InputError(f"{name} {error}") from None


def write_all(outputs: Sequence[tuple[Path, str]]) -> None:
    """Write every ``(path, text)`` or none: temporary files beside each destination first
    (created new, with the permissions the umask gives), then renames."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in outputs:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
            staged.append((temporary, path))
            with temporary.open("x", encoding="utf-8") as file:
                file.write(text)
        for temporary, path in staged:
            os.replace(temporary, path)
    except OSError as error:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise InputError(f"cannot write the outputs (none written): {error}") from None


def _trajectories(result: ImportResult) -> dict[str, object]:
    """The trajectory file, each job also naming its log line, job id and tenant (and, when
    it was reshaped to a gang size, the GPUs its log gave)."""
    obj = format_trajectories(result.workload)
    jobs = obj["jobs"]
    assert isinstance(jobs, list)
    logged = {r.line: r.logged_gpus for r in result.reshaped}
    for entry, job in zip(jobs, result.kept, strict=True):
        entry["source_line"] = job.line
        entry["source_job_id"] = job.job_id
        if job.line in logged:
            entry["source_gpus"] = logged[job.line]
        if job.tenant is not None:
            entry["tenant"] = job.tenant
    return obj


def _report(result: ImportResult, options: ImportOptions) -> dict[str, object]:
    return {
        "rows": result.rows,
        "imported": len(result.kept),
        "dropped": len(result.dropped),
        "dropped_by_reason": result.dropped_by_reason(),
        "seed": options.seed,
        "offset_s": result.offset_s,
        "dropped_rows": [
            {"line": d.line, "job_id": d.job_id, "reason": d.reason} for d in result.dropped
        ],
        "reshaped": len(result.reshaped),
        "reshaped_rows": [
            {"line": r.line, "job_id": r.job_id, "logged_gpus": r.logged_gpus, "gpus": r.gpus}
            for r in result.reshaped
        ],
    }


def _print_summary(result: ImportResult, out_trace: Path, out_trajectories: Path) -> None:
    jobs = result.workload.jobs
    widths = sorted({job.spec.gpus for job in jobs})
    span = jobs[-1].spec.arrival_s - jobs[0].spec.arrival_s
    console.print(
        f"Imported {len(jobs)} of {result.rows} jobs (widths {', '.join(map(str, widths))} GPUs, "
        f"arrivals over {span / 86400:.2f} days) to {out_trace} and {out_trajectories}",
        soft_wrap=True,
    )
    if result.reshaped:
        moves = Counter((r.logged_gpus, r.gpus) for r in result.reshaped)
        shown = ", ".join(f"{a} -> {b} GPUs: {n}" for (a, b), n in sorted(moves.items()))
        console.print(
            f"Reshaped {len(result.reshaped)} rows to the nearest gang size, the same "
            f"GPU-seconds ({shown})",
            soft_wrap=True,
        )
    if not result.dropped:
        console.print("Dropped: none")
        return
    console.print(f"Dropped {len(result.dropped)} rows:")
    for reason, count in result.dropped_by_reason().items():
        console.print(f"  {count:>6}  {reason}", soft_wrap=True)
    for dropped in result.dropped[:REPORT_LINES_SHOWN]:
        console.print(f"  line {dropped.line}: {dropped.reason}", soft_wrap=True)
    if len(result.dropped) > REPORT_LINES_SHOWN:
        console.print(
            f"  ... ({len(result.dropped) - REPORT_LINES_SHOWN} more; --report lists all)"
        )
