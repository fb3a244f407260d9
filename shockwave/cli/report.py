"""The simulator's reports: the comparison table, ``metrics.json`` and per-job CSV files.

Shapes:

- ``metrics.json``: a JSON list with one object per policy, :meth:`RunMetrics.as_dict` as-is
  (``policy``, ``makespan_s``, ``avg_jct_s``, ``utilization``, ``worst_ftf``, ``unfair_fraction``,
  ``worst_ftf_contention``, ``unfair_fraction_contention``, ``jobs_completed``,
  ``decision_seconds{median,p99,max}``, ...).
- ``jobs-<policy>.csv``: one row per job in workload order with ``job_id, arrival, finish, jct,
  t_exclusive, ftf, ftf_contention`` (seconds; empty cells for a job that did not finish).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from shockwave.metrics import RunMetrics
from shockwave.simulator import SimResult

JOB_COLUMNS: tuple[str, ...] = (
    "job_id",
    "arrival",
    "finish",
    "jct",
    "t_exclusive",
    "ftf",
    "ftf_contention",
)


def comparison_table(runs: Sequence[RunMetrics]) -> Table:
    """One row per policy with the figures the paper compares (SPEC section 4)."""
    table = Table(title="Policy comparison", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    for header in (
        "makespan\ns",
        "avg JCT\ns",
        "util",
        "worst\nFTF",
        "FTF>1",
        "worst FTF\ncontention",
        "FTF>1\ncontention",
        "jobs\ndone",
        "decide\nmedian ms",
        "makespan\n/ bound",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    for run in runs:
        over_bound = run.makespan_s / run.lower_bound_s if run.lower_bound_s > 0 else None
        table.add_row(
            run.policy,
            f"{run.makespan_s:,.0f}",
            f"{run.avg_jct_s:,.0f}",
            f"{run.utilization:.2f}",
            f"{run.worst_ftf:.2f}",
            f"{run.unfair_fraction:.1%}",
            f"{run.worst_ftf_contention:.2f}",
            f"{run.unfair_fraction_contention:.1%}",
            f"{run.jobs_completed}/{run.jobs_total}",
            f"{run.decision_seconds.median * 1000:.3g}",
            "-" if over_bound is None else f"{over_bound:.2f}",
        )
    return table


def write_metrics_json(runs: Sequence[RunMetrics], path: Path) -> None:
    path.write_text(json.dumps([run.as_dict() for run in runs], indent=2) + "\n", encoding="utf-8")


def write_jobs_csv(result: SimResult, run: RunMetrics, path: Path) -> None:
    """Per-job outcomes of one run; ``run`` must be ``summarize(result)`` (same job order)."""
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(JOB_COLUMNS)
        for job, ftf, ftf_contention in zip(result.jobs, run.ftf, run.ftf_contention, strict=True):
            writer.writerow(
                (
                    job.job_id,
                    _cell(job.arrival_s),
                    _cell(job.finish_s),
                    _cell(job.jct_s),
                    _cell(job.t_exclusive_s),
                    _cell(ftf),
                    _cell(ftf_contention),
                )
            )


def _cell(value: float | None) -> str:
    return "" if value is None else str(round(value, 4))
