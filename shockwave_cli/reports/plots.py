"""Figures of simulated runs, written as PNG files.

Uses matplotlib's object API on the Agg canvas (no pyplot, no display, no global figure state),
so it runs on headless machines and in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from shockwave.simulation.metrics import RunMetrics, utilization_over_time
from shockwave.simulation.prediction_report import PredictionReport, Predictor
from shockwave.simulation.simulator import SimResult

WIDTH_COLORS: dict[int, str] = {1: "tab:blue", 2: "tab:green", 4: "tab:orange", 8: "tab:red"}
"""Bar colour by the job's gang size in GPUs."""

_MAX_LABELLED_JOBS = 150


def plot_gantt(result: SimResult, path: Path, x_max: float | None = None) -> None:
    """The schedule: one row per job (workload order, top to bottom), a bar for each run of
    consecutive rounds it held GPUs, a grey line from its arrival to its finish, and a black
    tick at each change of its batch size. ``x_max``: the time axis' end, the same for every
    policy compared (default: this run's makespan)."""
    count = len(result.jobs)
    figure = _figure(width=12.0, height=min(60.0, max(3.0, 0.12 * count + 1.5)))
    axes = figure.add_subplot()
    _draw_gantt(axes, result, x_max)
    axes.set_title(f"{result.policy}: schedule on {result.cluster.total_gpus} GPUs")
    _gantt_legend(axes, result)
    _save(figure, path)


def plot_gantts(results: Sequence[SimResult], path: Path) -> None:
    """Every policy's schedule stacked on one shared time axis (one panel a policy), so that
    side by side they compare: a shorter panel finished the workload sooner."""
    if not results:
        return
    count = max(len(result.jobs) for result in results)
    panel = min(8.0, max(1.6, 0.03 * count + 1.0))
    figure = _figure(width=12.0, height=min(80.0, panel * len(results) + 0.8))
    axes_list = figure.subplots(len(results), 1, sharex=True, squeeze=False)[:, 0]
    x_max = max(result.makespan_s for result in results)
    for axes, result in zip(axes_list, results, strict=True):
        _draw_gantt(axes, result, x_max, labels=False)
        axes.set_ylabel(result.policy, rotation=0, ha="right", va="center")
        axes.axvline(result.makespan_s, color="black", linewidth=0.8, linestyle="--")
    axes_list[-1].set_xlabel("time (s)")
    _gantt_legend(axes_list[0], results[0])
    figure.suptitle("Schedules on one time axis (dashed: each policy's makespan)")
    _save(figure, path)


def _draw_gantt(axes: Any, result: SimResult, x_max: float | None, labels: bool = True) -> None:
    spans = _run_spans(result)
    count = len(result.jobs)
    ticks_x: list[float] = []
    ticks_y: list[int] = []
    for row, job in enumerate(result.jobs):
        end = job.finish_s if job.finish_s is not None else result.makespan_s
        axes.hlines(row, job.arrival_s, end, colors="0.8", linewidth=0.8, zorder=1)
        bars = spans.get(job.job_id, [])
        if bars:
            color = WIDTH_COLORS.get(job.gpus, "tab:gray")
            axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, zorder=2)
        for moment, _ in job.scalings:
            ticks_x.append(moment)
            ticks_y.append(row)
    if ticks_x:
        axes.scatter(ticks_x, ticks_y, marker="|", s=30, color="black", linewidths=1.0, zorder=3)
    axes.set_ylim(count - 0.5, -0.5)
    axes.set_xlim(0, max(x_max if x_max is not None else result.makespan_s, 1.0))
    if labels and count <= _MAX_LABELLED_JOBS:
        axes.set_yticks(range(count), [job.job_id for job in result.jobs], fontsize=5)
    else:
        axes.set_yticks([])
    if labels:
        axes.set_xlabel("time (s)")
        axes.set_ylabel("job")


def _gantt_legend(axes: Any, result: SimResult) -> None:
    widths = sorted({job.gpus for job in result.jobs})
    handles: list[Any] = [
        Patch(color=WIDTH_COLORS.get(w, "tab:gray"), label=f"{w} GPU") for w in widths
    ]
    handles.append(
        Line2D([], [], color="black", marker="|", linestyle="none", label="batch-size change")
    )
    axes.legend(handles=handles, loc="upper right", fontsize=7)


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
    """Busy share of the cluster over simulated time: one small panel a policy, all on the
    same axes (so eight policies do not blur into one tangle), each with its per-round
    utilization (thin), a moving average over about 5% of the time axis (bold) and its mean
    over the run (dashed, in the title)."""
    if not results:
        return
    columns = 2 if len(results) > 1 else 1
    rows = -(-len(results) // columns)
    figure = _figure(width=11.0, height=max(2.6, 2.0 * rows + 0.6))
    grid = figure.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    x_max = max(result.makespan_s for result in results)
    colors = figure_colors(len(results))
    for index, result in enumerate(results):
        axes = grid[index // columns][index % columns]
        points = utilization_over_time(result)
        mean = 0.0
        if points:
            times = [t for t, _ in points] + [result.makespan_s]
            shares = [u for _, u in points] + [points[-1][1]]
            axes.step(times, shares, where="post", color=colors[index], linewidth=0.5, alpha=0.5)
            smooth_t, smooth_u = moving_average(points, result.makespan_s, 0.05 * x_max)
            axes.plot(smooth_t, smooth_u, color=colors[index], linewidth=1.8)
            mean = time_weighted_mean(points, result.makespan_s)
            axes.axhline(mean, color="0.3", linestyle="--", linewidth=0.8)
        axes.set_title(f"{result.policy}: mean {mean:.0%}", fontsize=9)
        axes.set_ylim(0, 1.05)
        axes.set_xlim(0, max(x_max, 1.0))
    for extra in range(len(results), rows * columns):
        grid[extra // columns][extra % columns].set_visible(False)
    for axes in grid[-1]:
        axes.set_xlabel("time (s)")
    for row in grid:
        row[0].set_ylabel("GPU utilization")
    figure.suptitle("Cluster utilization per round (bold: moving average; dashed: mean)")
    _save(figure, path)


def figure_colors(count: int) -> list[str]:
    palette = [f"C{i}" for i in range(10)]
    return [palette[i % len(palette)] for i in range(count)]


def moving_average(
    points: Sequence[tuple[float, float]], end_s: float, window_s: float
) -> tuple[list[float], list[float]]:
    """The step function ``points`` ((time, value) from each time on, until ``end_s``) averaged
    over a trailing window of ``window_s``, sampled at each step."""
    times = [t for t, _ in points]
    values = [v for _, v in points]
    bounds = [*times[1:], end_s]
    out_t: list[float] = []
    out_v: list[float] = []
    for i, now in enumerate(bounds):
        start = max(times[0], now - max(window_s, 1e-9))
        total = 0.0
        for j in range(i, -1, -1):
            left, right = max(times[j], start), bounds[j]
            if right > left:
                total += values[j] * (right - left)
            if times[j] <= start:
                break
        out_t.append(now)
        out_v.append(total / max(now - start, 1e-9))
    return out_t, out_v


def time_weighted_mean(points: Sequence[tuple[float, float]], end_s: float) -> float:
    bounds = [*(t for t, _ in points[1:]), end_s]
    span = end_s - points[0][0]
    if span <= 0:
        return points[0][1]
    return sum(v * (b - t) for (t, v), b in zip(points, bounds, strict=True)) / span


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
