"""The ``shockwave replay`` command: options, input checks, a progress bar and the reports.

The replay itself is :mod:`shockwave_cli.runtime.replay`. Its reports are the simulator's
(``metrics.json`` with one object for the run, ``jobs-<policy>.csv``, the Gantt chart, the FTF
CDF and the utilization plot) plus a ``replay`` object in the run's ``metrics.json`` entry: rounds
by plan source, mid-round fills, late boundaries, events posted, lost and duplicated, job states.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from shockwave.domain.model import ValidationError
from shockwave.policies.policy import UnknownPolicyError, get_policy
from shockwave_cli.commands import tenant_options
from shockwave_cli.commands.inputs import InputError, load_throughputs, load_workload, parse_cluster
from shockwave_cli.reports.plots import plot_ftf_cdf, plot_gantt, plot_utilization
from shockwave_cli.reports.report import comparison_table, run_record, write_jobs_csv, write_json
from shockwave_cli.runtime.replay import ReplayConfig, ReplayError, replay

INPUT_ERROR_EXIT = 2
console = Console()
errors = Console(stderr=True)


def replay_command(
    trace: Annotated[Path, typer.Option(help="Gavel-format trace (12 tab-separated fields).")],
    trajectories: Annotated[Path, typer.Option(help="The trace's *.trajectories.json.")],
    throughputs: Annotated[Path, typer.Option(help="Throughput table (reference JSON).")],
    out: Annotated[Path, typer.Option(help="Directory for metrics.json, CSVs, plots, logs.")],
    gpus: Annotated[
        int | None, typer.Option(help="GPUs in the cluster (nodes of --gpus-per-node).")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 4,
    nodes: Annotated[
        str | None,
        typer.Option(
            help="Instead of --gpus: the node list, COUNTxGPUS comma-separated (2x8,3x4)."
        ),
    ] = None,
    round_seconds: Annotated[
        float, typer.Option(help="Round length in simulated seconds.", min=0.001)
    ] = 120.0,
    time_scale: Annotated[
        float,
        typer.Option(
            help="Simulated seconds per wall second (120: a 120 s round takes 1 s).", min=1
        ),
    ] = 120.0,
    policy: Annotated[str, typer.Option(help="The service's policy (one name).")] = "shockwave",
    restart_overhead: Annotated[
        float,
        typer.Option(help="Simulated seconds an agent spends restoring a started job.", min=0),
    ] = 20.0,
    restore_rule: Annotated[
        Literal["simulator", "always"],
        typer.Option(
            help="simulator: a start restores but for a short final stretch (one the job "
            "finishes within its lease less 5 s) and a job trains no further than its lease, "
            "as `shockwave simulate` charges it; always: every start restores and a revoked "
            "job trains on until the revoke reaches it, as a real job does."
        ),
    ] = "simulator",
    mode: Annotated[
        Literal["embedded", "distributed"],
        typer.Option(
            help="embedded: `shockwave up` on SQLite; distributed: API, Celery worker and round "
            "driver on a throwaway Postgres database and Redis."
        ),
    ] = "embedded",
    api: Annotated[
        str | None,
        typer.Option(help="Use the service at this URL instead of starting one (--mode ignored)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SHOCKWAVE_TOKEN",
            help="With --api: an admin token (none: the service is in open mode).",
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(help="With --api: its database, to count plan sources and late rounds."),
    ] = None,
    poll_seconds: Annotated[
        float | None,
        typer.Option(
            help="Agents' poll interval in wall seconds (default: a tenth of a round).", min=0.005
        ),
    ] = None,
    long_poll: Annotated[
        bool | None,
        typer.Option(
            "--long-poll/--no-long-poll",
            help="Agents hold each poll open until the service has news for them (a bounded "
            "long poll, up to a poll interval); --no-long-poll: plain polls. Default: on in the "
            "embedded and distributed modes, off with --api.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Wall seconds the jobs have after the last arrival (default: from the workload).",
            min=1,
        ),
    ] = None,
    tenants: tenant_options.Tenants = None,
    tenant_seed: tenant_options.TenantSeed = 0,
    tenant_file: tenant_options.TenantFile = None,
    tenant_weights: tenant_options.TenantWeights = None,
    tenant_guaranteed_gpus: tenant_options.TenantGuaranteed = None,
    tenant_max_gpus: tenant_options.TenantMaxGpus = None,
) -> None:
    """Replay a trace through the real service on a compressed clock, with simulated agents.

    Jobs are submitted at their arrival times (divided by --time-scale); one simulated agent per
    node trains each leased job by its trajectory and reports progress and batch-size changes
    over HTTP as a real agent and the SDK do. Writes the simulator's reports to --out. The
    tenant options are simulate's: each job is submitted to its tenant, and the tenants'
    settings are set through /v1/tenants before the first arrival.
    """
    try:
        get_policy(policy)
        cluster = parse_cluster(gpus, gpus_per_node, nodes)
        workload = load_workload(trace, trajectories, load_throughputs(throughputs))
        workload = tenant_options.apply_tenant_options(
            workload,
            tenants,
            tenant_seed,
            tenant_file,
            tenant_weights,
            tenant_guaranteed_gpus,
            tenant_max_gpus,
        )
        for job in workload.jobs:
            try:
                job.spec.check_fits(cluster)
            except ValidationError as error:
                raise InputError(f"job {job.spec.job_id}: {error.message}") from None
        out.mkdir(parents=True, exist_ok=True)
    except UnknownPolicyError as error:
        _fail(f"--policy: {error}")
    except InputError as error:
        _fail(str(error))
    except OSError as error:
        _fail(f"--out: {error}")
    config = ReplayConfig(
        cluster=cluster,
        policy=policy,
        out=out,
        round_seconds=round_seconds,
        time_scale=time_scale,
        restart_overhead_s=restart_overhead,
        restore_rule=restore_rule,
        mode=mode,
        api=api,
        token=token,
        database_url=database_url,
        poll_s=poll_seconds,
        long_poll=long_poll,
        timeout_s=timeout,
    )
    errors.print(
        f"Replaying {workload.name}: {len(workload.jobs)} jobs on {cluster.total_gpus} GPUs "
        f"({','.join(str(g) for g in cluster.node_gpus)}), {policy}, rounds of "
        f"{round_seconds:g} s at {time_scale:g}x ({config.round_wall_s:g} s wall), "
        f"{'the service at ' + api if api else mode}",
        soft_wrap=True,
    )
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done, simulated {task.fields[sim]:,.0f} s"),
        TimeElapsedColumn(),
        console=errors,
        transient=True,
    ) as bar:
        task = bar.add_task("replay", total=len(workload.jobs), sim=0.0)

        def progress(sim_s: float, finished: int, submitted: int) -> None:
            bar.update(task, completed=finished, sim=sim_s)

        previous = signal.signal(signal.SIGTERM, _interrupt)  # stop the service too
        try:
            report = replay(workload, config, progress)
        except ReplayError as error:
            _fail(str(error), 1)
        except KeyboardInterrupt:
            _fail("interrupted: the service and the agents were stopped", 130)
        finally:
            signal.signal(signal.SIGTERM, previous)
    record = {**run_record(report.result, report.run, None), **report.record()}
    write_json([record], out / "metrics.json")
    write_jobs_csv(report.result, report.run, out / f"jobs-{policy}.csv")
    plot_gantt(report.result, out / f"{policy}-gantt.png")
    plot_ftf_cdf([report.run], out / "ftf-cdf.png")
    plot_utilization([report.result], out / "utilization.png")
    console.print(comparison_table([report.run]))
    replayed: dict[str, Any] = report.record()["replay"]
    console.print(
        f"Plan sources {replayed['plan_sources']}, mid-round fills {replayed['fills']}, "
        f"late boundaries {replayed['late_boundaries']}, events {replayed['events']}, "
        f"job states {replayed['job_states']}, {report.wall_s:.0f} s wall",
        soft_wrap=True,
    )
    console.print(f"Reports written to {out}/ (metrics.json, jobs-{policy}.csv, *.png, logs/)")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _fail(message: str, code: int = INPUT_ERROR_EXIT) -> NoReturn:
    errors.print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    raise typer.Exit(code)
