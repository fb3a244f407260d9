"""The simulator's reports: the comparison table, ``metrics.json`` and per-job CSV files, and
the prediction-accuracy table.

Shapes:

- ``metrics.json``: a JSON list with one object per policy (:func:`run_record`):
  :meth:`RunMetrics.as_dict` (``policy``, ``makespan_s``, ``avg_jct_s``, ``utilization``,
  ``worst_ftf``, ``unfair_fraction``, ``worst_ftf_contention``, ``unfair_fraction_contention``,
  ``jobs_completed``, ``decision_seconds{median,p99,max}``, ...), plus ``params`` (the policy's
  params as run, nested dataclasses as objects) and, for the shockwave policy, ``solver``:
  ``{solves, last_solve{status, solver, objective, bound, gain_gap, gap}}`` (``solves``: plans
  solved over the run; ``last_solve``: what the last one reported).
  With tenants, each object also has ``tenants`` (tenant path -> ``entitled_gpu_s``,
  ``received_gpu_s``, ``ratio``, ``worst_hour_ratio``, ``hours``, ``jobs``, ``avg_jct_s``,
  ``worst_ftf``), ``worst_tenant_ratio``, ``tenant_jain`` and ``ftf_tenant`` (per job, FTF
  within its tenant's share); :mod:`shockwave.simulation.metrics`.
- ``jobs-<policy>.csv``: one row per job in workload order with ``job_id, arrival, finish, jct,
  t_exclusive, ftf, ftf_contention`` (seconds; empty cells for a job that did not finish).
- ``prediction.json``: :meth:`PredictionReport.as_dict`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path

from rich.table import Table

from shockwave.policies.policy import SolveSummary
from shockwave.simulation.metrics import RunMetrics
from shockwave.simulation.prediction_report import (
    AtUse,
    HeldOut,
    PredictionReport,
    Predictor,
    held_out_means,
)
from shockwave.simulation.simulator import SimResult

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
    """One row per policy with the figures the paper compares (defined in
    shockwave.simulation.metrics)."""
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


def tenant_table(runs: Sequence[RunMetrics]) -> Table:
    """One row per policy and tenant: GPU-hours entitled and received, the worst hour's
    received / entitled, the tenant's jobs, mean JCT and worst FTF within its share; each
    policy's first row also its worst tenant ratio and Jain's index over tenants."""
    table = Table(title="Tenants", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    table.add_column("tenant", no_wrap=True)
    for header in (
        "entitled\nGPU-h",
        "received\nGPU-h",
        "worst\nhour",
        "jobs",
        "avg JCT\ns",
        "worst FTF\nin tenant",
        "worst\ntenant",
        "Jain",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    for run in runs:
        for i, (name, t) in enumerate(run.tenants.items()):
            table.add_row(
                run.policy if i == 0 else "",
                name or "(default)",
                f"{t.entitled_gpu_s / 3600:,.1f}",
                f"{t.received_gpu_s / 3600:,.1f}",
                f"{t.worst_hour_ratio:.2f}",
                str(t.jobs),
                f"{t.avg_jct_s:,.0f}",
                f"{t.worst_ftf:.2f}",
                f"{run.worst_tenant_ratio:.2f}" if i == 0 else "",
                f"{run.tenant_jain:.3f}" if i == 0 else "",
            )
    return table


def run_record(result: SimResult, run: RunMetrics, params: object) -> dict[str, object]:
    """The ``metrics.json`` object of one run; ``run`` is ``summarize(result)``, ``params`` what
    the policy ran with."""
    record = run.as_dict()
    if is_dataclass(params) and not isinstance(params, type):
        record["params"] = asdict(params)
    solver = solver_summary(result.solve)
    if solver is not None:
        record["solver"] = solver
    record["cluster"] = {"nodes": list(result.cluster.node_gpus)}
    record["engine"] = {
        "mid_round_fills": result.settings.mid_round_fills,
        "plan_latency_s": result.settings.plan_latency_s,
        "plan_sources": dict(result.notes.get("sources", {})),
        "fills": result.notes.get("fills", 0),
    }
    at_use = result.notes.get("predictions")
    if isinstance(at_use, AtUse) and at_use.uses:
        record["prediction_at_use"] = at_use.as_dict()
    return record


def solver_summary(solve: SolveSummary | None) -> dict[str, object] | None:
    """What the policy's planner reported at the run's last decision; None for a policy that
    solves nothing."""
    if solve is None:
        return None
    return {
        "solves": solve.solves,
        "last_solve": {
            "status": solve.status,
            "solver": solve.solver,
            "objective": solve.objective,
            "bound": solve.bound,
            "gain_gap": solve.gain_gap,
            "gap": solve.gap,
        },
    }


def write_json(obj: object, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def prediction_table(report: PredictionReport) -> Table:
    """Per progress point, regime-length error and run-time accuracy of the paper's rule, the
    population predictor and the greedy latest-throughput guess (the policy's predictor marked
    ``*``), the throughput error when throughputs are not declared, then the overall means."""
    table = Table(
        title=f"Prediction accuracy: {report.jobs} dynamic jobs of {report.workload} "
        f"({report.adapting_jobs} change batch size; throughputs {report.throughput_knowledge})",
        title_justify="left",
    )
    shown = (Predictor.RESTATEMENT, Predictor.POPULATION, Predictor.GREEDY)
    names = [f"{p}*" if p is report.policy_predictor else str(p) for p in shown]
    estimated = report.throughput_knowledge != "declared"
    table.add_column("progress", justify="right", no_wrap=True)
    for measure in ("regime error", "run-time acc."):
        for name in names:
            table.add_column(f"{measure}\n{name}", justify="right", no_wrap=True)
    if estimated:
        table.add_column("throughput\nerror", justify="right", no_wrap=True)
    rows = [(f"{row.percent}%", row.accuracy, row.throughput_error) for row in report.rows]
    means = [
        ("mean", report.overall, report.throughput_error),
        (f"mean, {report.adapting_jobs} adapting", report.adapting, None),
    ]
    for index, (label, accuracy, rate_error) in enumerate([*rows, *means]):
        if not accuracy:
            continue
        cells = [f"{accuracy[p].regime_error:.1%}" for p in shown]
        cells += [f"{accuracy[p].runtime_accuracy:.1%}" for p in shown]
        if estimated:
            cells.append("" if rate_error is None else f"{rate_error:.1%}")
        table.add_row(label, *cells, end_section=index == len(rows) - 1)
    return table


HELD_OUT_TITLES: Mapping[HeldOut, str] = {
    HeldOut.NEVER_SEEN: "Prediction accuracy on a model never seen (the prior never learns a job "
    "of it; the other models' jobs learnt as they finish)",
    HeldOut.NEW: "Prediction accuracy on a model new to the cluster (the prior starts with every "
    "other model's jobs; the model's own learnt as they finish)",
}


def held_out_table(
    reports: Mapping[str, PredictionReport], held_out: HeldOut = HeldOut.NEVER_SEEN
) -> Table:
    """Per model, each predictor's regime-length error and run-time accuracy on that model's
    jobs when the prior was built without it (leave-one-model-out; what it withholds:
    ``held_out``), then the mean over models (every model weighs the same)."""
    table = Table(
        title=HELD_OUT_TITLES[held_out],
        title_justify="left",
    )
    shown = (Predictor.RESTATEMENT, Predictor.POPULATION, Predictor.GREEDY)
    first = next(iter(reports.values()), None)
    policy = first.policy_predictor if first is not None else None
    names = [f"{p}*" if p is policy else str(p) for p in shown]
    table.add_column("held-out model", no_wrap=True)
    table.add_column("jobs", justify="right", no_wrap=True)
    for measure in ("regime error", "run-time acc."):
        for name in names:
            table.add_column(f"{measure}\n{name}", justify="right", no_wrap=True)
    scored = {model: r for model, r in reports.items() if r.overall}
    for index, (model, report) in enumerate(scored.items()):
        cells = [f"{report.overall[p].regime_error:.1%}" for p in shown]
        cells += [f"{report.overall[p].runtime_accuracy:.1%}" for p in shown]
        table.add_row(model, str(report.jobs), *cells, end_section=index == len(scored) - 1)
    if scored:
        means = held_out_means(scored)
        cells = [f"{means[p].regime_error:.1%}" for p in shown]
        cells += [f"{means[p].runtime_accuracy:.1%}" for p in shown]
        table.add_row("mean over models", str(sum(r.jobs for r in scored.values())), *cells)
    return table


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
