"""Figures of simulated runs, written as PNG files.

Uses matplotlib's object API on the Agg canvas (no pyplot, no display, no global figure state),
so it runs on headless machines and in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from shockwave.metrics import RunMetrics, utilization_over_time
from shockwave.prediction_report import PredictionReport, Predictor
from shockwave.simulator import SimResult

WIDTH_COLORS: dict[int, str] = {1: "tab:blue", 2: "tab:green", 4: "tab:orange", 8: "tab:red"}
"""Bar colour by the job's gang size in GPUs."""

_MAX_LABELLED_JOBS = 150


def plot_gantt(result: SimResult, path: Path) -> None:
    """The schedule: one row per job (workload order, top to bottom), a bar for each run of
    consecutive rounds it held GPUs, a grey line from its arrival to its finish."""
    spans = _run_spans(result)
    count = len(result.jobs)
    figure = _figure(width=12.0, height=min(60.0, max(3.0, 0.12 * count + 1.5)))
    axes = figure.add_subplot()
    for row, job in enumerate(result.jobs):
        end = job.finish_s if job.finish_s is not None else result.makespan_s
        axes.hlines(row, job.arrival_s, end, colors="0.8", linewidth=0.8, zorder=1)
        bars = spans.get(job.job_id, [])
        if bars:
            color = WIDTH_COLORS.get(job.gpus, "tab:gray")
            axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, zorder=2)
    axes.set_ylim(count - 0.5, -0.5)
    axes.set_xlim(0, max(result.makespan_s, 1.0))
    if count <= _MAX_LABELLED_JOBS:
        axes.set_yticks(range(count), [job.job_id for job in result.jobs], fontsize=5)
    else:
        axes.set_yticks([])
    axes.set_xlabel("time (s)")
    axes.set_ylabel("job")
    axes.set_title(f"{result.policy}: schedule on {result.cluster.total_gpus} GPUs")
    widths = sorted({job.gpus for job in result.jobs})
    axes.legend(
        handles=[Patch(color=WIDTH_COLORS.get(w, "tab:gray"), label=f"{w} GPU") for w in widths],
        loc="upper right",
        fontsize=7,
    )
    _save(figure, path)


def plot_ftf_cdf(runs: Sequence[RunMetrics], path: Path) -> None:
    """CDF of finish-time fairness (reference definition) of finished jobs, one line a policy."""
    figure = _figure(width=7.0, height=4.5)
    axes = figure.add_subplot()
    for run in runs:
        values = sorted(v for v in run.ftf if v is not None)
        if values:
            shares = [(i + 1) / len(values) for i in range(len(values))]
            axes.step(values, shares, where="post", label=run.policy)
    axes.axvline(1.0, color="0.5", linestyle="--", linewidth=0.8)
    axes.set_xlabel("finish-time fairness ρ (JCT / fair-share time)")
    axes.set_ylabel("share of jobs")
    axes.set_ylim(0, 1.02)
    axes.set_title("FTF CDF (ρ > 1: unfairly treated)")
    axes.legend(fontsize=8)
    _save(figure, path)


def plot_utilization(results: Sequence[SimResult], path: Path) -> None:
    """Busy share of the cluster in each round, over simulated time, one line a policy."""
    figure = _figure(width=9.0, height=4.5)
    axes = figure.add_subplot()
    for result in results:
        points = utilization_over_time(result)
        if points:
            times = [t for t, _ in points] + [result.makespan_s]
            shares = [s for _, s in points] + [points[-1][1]]
            axes.step(times, shares, where="post", label=result.policy, linewidth=0.9)
    axes.set_xlabel("time (s)")
    axes.set_ylabel("GPU utilization")
    axes.set_ylim(0, 1.05)
    axes.set_title("Cluster utilization per round")
    axes.legend(fontsize=8)
    _save(figure, path)


def plot_prediction(report: PredictionReport, path: Path) -> None:
    """Regime-length error and run-time accuracy by progress, one line a predictor (left and
    right panels), dashed lines at the paper's averages (6% and 84%)."""
    figure = _figure(width=10.0, height=4.0)
    error_axes, accuracy_axes = figure.subplots(1, 2)
    percents = [row.percent for row in report.rows]
    for predictor in Predictor:
        style = ":" if predictor is Predictor.ORACLE else "-"
        error_axes.plot(
            percents,
            [100 * row.accuracy[predictor].regime_error for row in report.rows],
            style,
            marker="o",
            label=str(predictor),
        )
        accuracy_axes.plot(
            percents,
            [100 * row.accuracy[predictor].runtime_accuracy for row in report.rows],
            style,
            marker="o",
            label=str(predictor),
        )
    error_axes.axhline(6.0, color="0.5", linestyle="--", linewidth=0.8, label="paper (6%)")
    accuracy_axes.axhline(84.0, color="0.5", linestyle="--", linewidth=0.8, label="paper (84%)")
    error_axes.set_ylabel("regime-length error (% of epochs)")
    accuracy_axes.set_ylabel("run-time accuracy (%)")
    for axes in (error_axes, accuracy_axes):
        axes.set_xlabel("job progress (% of epochs)")
        axes.legend(fontsize=8)
    figure.suptitle(f"Prediction accuracy: {report.jobs} dynamic jobs of {report.workload}")
    _save(figure, path)


def _run_spans(result: SimResult) -> dict[str, list[tuple[float, float]]]:
    """(start, duration) bars per job, consecutive rounds merged into one bar; a job's last bar
    ends when it finished, not at the end of its last round."""
    finish = {job.job_id: job.finish_s for job in result.jobs if job.finish_s is not None}
    spans: dict[str, list[tuple[float, float]]] = {}
    for record in result.rounds:
        for job_id in record.assignment:
            end = min(record.end_s, finish.get(job_id, record.end_s))
            bars = spans.setdefault(job_id, [])
            if bars and abs(bars[-1][0] + bars[-1][1] - record.start_s) < 1e-6:
                start, _ = bars[-1]
                bars[-1] = (start, end - start)
            else:
                bars.append((record.start_s, end - record.start_s))
    return spans


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> None:
    figure.savefig(path, dpi=120)
