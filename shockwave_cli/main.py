"""``shockwave``: the command line of the trace-driven simulator.

Commands: ``simulate`` (run policies on a trace or a generated workload, print a comparison
table, write metrics.json, per-job CSVs and plots; the Shockwave policy's knobs are options too),
``generate`` (write a synthetic workload in the reference formats), ``import-trace`` (a
production job log, CSV, in the reference formats: shockwave_cli/commands/import_trace.py),
``predict-report`` (how well
the regime predictor knows each job's future, the paper's modeling-error figure) and
``policies`` (list the registered policies). ``api``, ``admin`` and ``jobs`` serve and use the
REST API (shockwave_cli/commands/api_commands.py, jobs_commands.py); ``worker`` runs a solver worker
(shockwave_cli/commands/service_commands.py).

Input the user can fix (a missing file, a malformed trace line, an unknown policy) is reported as
one red line naming the file, line or option, with exit code 2 and no traceback.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from shockwave.domain.model import AdaptationMode, Cluster, ValidationError
from shockwave.market.elastic import make_elastic
from shockwave.market.heterogeneity import check_fits_typed, makespan_lower_bound
from shockwave.policies import BASELINES
from shockwave.policies.policy import Policy, get_policy, policy_names
from shockwave.policies.shockwave_market.shockwave import ShockwaveParams
from shockwave.simulation.metrics import RunMetrics, summarize
from shockwave.simulation.prediction_report import (
    AtUse,
    HeldOut,
    held_out_as_dict,
    prediction_report,
)
from shockwave.simulation.prediction_report import (
    leave_one_model_out as leave_one_model_out_reports,
)
from shockwave.simulation.simulator import SimResult, SimSettings, simulate
from shockwave.workloads.generator import MODE_MIX, generate_workload
from shockwave.workloads.throughput_knowledge import apply_knowledge
from shockwave.workloads.traces import TRACE_MODES, format_trace, format_trajectories
from shockwave.workloads.variation import apply_variation
from shockwave.workloads.workload import Workload
from shockwave_cli.commands import (
    knobs,
    tenant_options,
    token_commands,  # noqa: F401  (registers the admin token commands)
)
from shockwave_cli.commands.api_commands import admin_app, api_command
from shockwave_cli.commands.cluster_commands import cluster_command, nodes_app
from shockwave_cli.commands.import_trace import import_trace_command
from shockwave_cli.commands.inputs import (
    InputError,
    load_throughputs,
    load_typed_workload,
    load_workload,
    parse_cluster,
    parse_mode_mix,
    policy_params,
    resolve_policies,
)
from shockwave_cli.commands.jobs_commands import jobs_app
from shockwave_cli.commands.knobs import ShockwaveKnobs, apply_knobs
from shockwave_cli.commands.replay_command import replay_command
from shockwave_cli.commands.service_commands import (
    agent_command,
    driver_command,
    up_command,
    worker_command,
)
from shockwave_cli.commands.tenant_commands import tenants_app, usage_command
from shockwave_cli.reports.html_report import write_html_report
from shockwave_cli.reports.plots import (
    plot_ftf_cdf,
    plot_gantt,
    plot_gantts,
    plot_prediction,
    plot_utilization,
)
from shockwave_cli.reports.report import (
    comparison_table,
    held_out_table,
    prediction_table,
    run_record,
    tenant_table,
    write_jobs_csv,
    write_json,
)
from solver_service.collector import quiet_collector

app = typer.Typer(
    help="Shockwave GPU-cluster scheduler: trace-driven simulator, REST API and its CLI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
console = Console()
errors = Console(stderr=True)

INPUT_ERROR_EXIT = 2

ModeMix = Annotated[
    str | None,
    typer.Option(
        help="Shares of static,accordion,gns jobs, e.g. 0.5,0.25,0.25 "
        f"(default {','.join(f'{MODE_MIX.get(mode, 0.0):g}' for mode in TRACE_MODES)}).",
    ),
]


@dataclass(frozen=True, slots=True)
class PolicySetup:
    """One simulation to run: the policy, its params and the simulated system's settings."""

    policy: Policy
    params: Any
    settings: SimSettings


@app.command("simulate")
def simulate_command(
    throughputs: Annotated[
        Path, typer.Option(help="Throughput table (reference JSON, e.g. tacc_throughputs.json).")
    ],
    out: Annotated[Path, typer.Option(help="Directory for metrics.json, CSVs and plots.")],
    gpus: Annotated[
        str | None,
        typer.Option(
            help="GPUs in the simulated cluster (nodes of --gpus-per-node): a count (the "
            "throughput file's default type) or GPU types, TYPE:COUNT comma-separated "
            "(v100:12,p100:12,k80:8; docs/heterogeneity.md)."
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(
            help="Instead of --gpus: the node list, COUNTxGPUS comma-separated "
            "(2x8,3x4,2x2: two 8-GPU nodes, three 4-GPU nodes, two 2-GPU nodes); typed: "
            "COUNTxGPUS:TYPE (2x8:v100,3x4:k80)."
        ),
    ] = None,
    heterogeneity_agnostic: Annotated[
        bool,
        typer.Option(
            "--heterogeneity-agnostic",
            help="On a typed cluster, run the policies blind to GPU types (every GPU looks "
            "like the file's default type; jobs still run at their true speed).",
        ),
    ] = False,
    trace: Annotated[
        Path | None, typer.Option(help="Gavel-format trace (12 tab-separated fields a line).")
    ] = None,
    trajectories: Annotated[
        Path | None, typer.Option(help="The trace's *.trajectories.json (true regimes).")
    ] = None,
    generate: Annotated[
        int | None,
        typer.Option(help="Without --trace: simulate N synthetic jobs made with --seed.", min=1),
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 4,
    round_seconds: Annotated[float, typer.Option(help="Round length in seconds.")] = 120.0,
    restart_overhead: Annotated[
        float, typer.Option(help="Checkpoint-restart cost of a start, resume or move (s).")
    ] = 20.0,
    plan_latency: Annotated[
        float,
        typer.Option(
            help="Seconds from the state a plan is computed for to when it can be used "
            "(its solve time); rounds before it take the previous plan or first in, first out."
        ),
    ] = 0.0,
    mid_round_fills: Annotated[
        bool,
        typer.Option(
            help="Start waiting jobs on GPUs freed between boundaries (--no-mid-round-fills: "
            "the reference simulator's mechanics, jobs start only at boundaries)."
        ),
    ] = True,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed for any randomness (--generate, seeded policies, --prediction-error, "
            "--throughput-knowledge noisy:P)."
        ),
    ] = None,
    mean_interarrival: Annotated[
        float, typer.Option(help="With --generate: mean seconds between arrivals.")
    ] = 100.0,
    policy: Annotated[
        str, typer.Option(help="Policy names, comma-separated, or 'all' (see `policies`).")
    ] = "all",
    mode_mix: ModeMix = None,
    window_rounds: knobs.WindowRounds = None,
    makespan_weight: knobs.MakespanWeight = None,
    deadline_weight: knobs.DeadlineWeight = None,
    horizon_margin: knobs.HorizonMargin = None,
    critical_path_margin: knobs.CriticalPathMargin = None,
    critical_path_gate: knobs.CriticalPathGate = None,
    fairness_exponent: knobs.FairnessExponent = None,
    replan: knobs.Replan = None,
    replan_every: knobs.ReplanEvery = None,
    packing_order: knobs.PackingOrder = None,
    solver_time_limit: knobs.SolverTimeLimit = None,
    solver_gap: knobs.SolverGap = None,
    use_scip: knobs.UseScip = None,
    oracle: knobs.Oracle = False,
    prediction_error: knobs.PredictionError = None,
    predictor: knobs.RegimePredictorOption = None,
    forecast_contention: knobs.ForecastContention = False,
    throughput_knowledge: knobs.ThroughputKnowledgeOption = "declared",
    variation: knobs.VariationOption = "none",
    elastic: Annotated[
        bool,
        typer.Option(
            "--elastic",
            help="Make every job elastic from 1 GPU to --elastic-max-gpus (or its request), "
            "its throughput on each count from the table (docs/elastic.md).",
        ),
    ] = False,
    elastic_max_gpus: Annotated[
        int,
        typer.Option(help="With --elastic: the most GPUs an elastic job may get (a power of two)."),
    ] = 8,
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="Also write report.html: the comparison table and every plot in one page.",
        ),
    ] = False,
    tenants: tenant_options.Tenants = None,
    tenant_seed: tenant_options.TenantSeed = 0,
    tenant_file: tenant_options.TenantFile = None,
    tenant_weights: tenant_options.TenantWeights = None,
    tenant_guaranteed_gpus: tenant_options.TenantGuaranteed = None,
    tenant_max_gpus: tenant_options.TenantMaxGpus = None,
) -> None:
    """Simulate policies on a workload; print a comparison table and write reports to --out.

    Options marked "Shockwave:" tune the shockwave policy only (defaults in parentheses).
    """
    tuning = ShockwaveKnobs(
        window_rounds=window_rounds,
        makespan_weight=makespan_weight,
        deadline_weight=deadline_weight,
        horizon_margin=horizon_margin,
        critical_path_margin=critical_path_margin,
        critical_path_gate=critical_path_gate,
        fairness_exponent=fairness_exponent,
        replan=replan,
        replan_every=replan_every,
        packing_order=packing_order,
        solver_time_limit=solver_time_limit,
        solver_gap=solver_gap,
        use_scip=use_scip,
        oracle=oracle,
        prediction_error=prediction_error,
        predictor=predictor,
        forecast_contention=forecast_contention,
    )
    try:
        knowledge = knobs.parse_knowledge(throughput_knowledge)
        varied = knobs.parse_variation(variation)
        policies = resolve_policies(policy)
        cluster = parse_cluster(gpus, gpus_per_node, nodes)
        settings = _settings(round_seconds, restart_overhead, plan_latency, mid_round_fills)
        settings = replace(settings, heterogeneity_agnostic=heterogeneity_agnostic)
        setups = _policy_setups(policies, seed, settings, tuning)
        mix = _mode_mix(mode_mix, generate)
        workload = _workload(
            trace, trajectories, generate, throughputs, seed, mean_interarrival, mix
        )
        workload = apply_knowledge(workload, knowledge, 0 if seed is None else seed)
        workload = load_typed_workload(workload, throughputs, cluster)
        workload = apply_variation(workload, varied, 0 if seed is None else seed)
        if elastic and not varied.none:
            raise InputError("--variation with --elastic is not modelled: give one or the other")
        if elastic:
            if cluster.is_typed:
                raise InputError(
                    "--elastic runs on one GPU type: give --gpus a count, not TYPE:COUNT "
                    "(elastic jobs on typed clusters are not modelled yet)"
                )
            workload = _elastic(workload, throughputs, elastic_max_gpus)
        workload = tenant_options.apply_tenant_options(
            workload,
            tenants,
            tenant_seed,
            tenant_file,
            tenant_weights,
            tenant_guaranteed_gpus,
            tenant_max_gpus,
        )
        _check_fits(workload, cluster)
        _make_dir(out)
    except InputError as error:
        _fail(str(error))
    lower_bound = makespan_lower_bound(workload, cluster)
    errors.print(
        f"Workload {workload.name}: {len(workload.jobs)} jobs on {cluster.total_gpus} GPUs "
        f"({cluster.describe()}), "
        f"rounds of {settings.round_seconds:g} s, throughputs {knowledge}"
        + ("" if varied.none else f", variation {varied}"),
        soft_wrap=True,
    )
    with quiet_collector():
        results = _run_all(workload, cluster, setups)
    runs = [summarize(result) for result in results]
    if not console.is_terminal:
        console.width = max(console.width, 120)
    console.print(comparison_table(runs))
    if any(len(run.tenants) > 1 for run in runs):
        console.print(tenant_table(runs))
    console.print(
        f"Makespan lower bound: {lower_bound:,.0f} s "
        "(max of total GPU-seconds / GPUs and latest arrival + exclusive run time)"
    )
    for result in results:
        reads = result.notes.get("predictions")
        if isinstance(reads, AtUse) and (at_use := reads.mean()) is not None:
            console.print(
                f"{result.policy}: predictions at the moment of use (every one it read of a "
                f"dynamic job for a decision, {reads.uses:,}): regime error "
                f"{at_use.regime_error:.1%}, run-time accuracy {at_use.runtime_accuracy:.1%}"
            )
    _write_reports(out, setups, results, runs, str(knowledge), report)
    written = "metrics.json, jobs-*.csv, *.png" + (", report.html" if report else "")
    console.print(f"Reports written to {out}/ ({written})")


@app.command("generate")
def generate_command(
    jobs: Annotated[int, typer.Option(help="Number of jobs.", min=1)],
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files.")],
    throughputs: Annotated[Path, typer.Option(help="Throughput table (reference JSON).")],
    out_trace: Annotated[Path, typer.Option(help="Where to write the Gavel-format trace.")],
    out_trajectories: Annotated[Path, typer.Option(help="Where to write the trajectories JSON.")],
    mean_interarrival: Annotated[
        float, typer.Option(help="Mean seconds between arrivals (Poisson arrivals).")
    ] = 100.0,
    mode_mix: ModeMix = None,
) -> None:
    """Write a synthetic workload as a trace and a trajectory file (the reference formats)."""
    try:
        mix = MODE_MIX if mode_mix is None else parse_mode_mix(mode_mix)
        workload = _generated(jobs, throughputs, seed, mean_interarrival, mix)
        for path in (out_trace, out_trajectories):
            _make_dir(path.parent)
        out_trace.write_text(format_trace(workload), encoding="utf-8")
        out_trajectories.write_text(
            json.dumps(format_trajectories(workload), indent=1) + "\n", encoding="utf-8"
        )
    except InputError as error:
        _fail(str(error))
    except OSError as error:
        _fail(f"cannot write the workload: {error}")
    console.print(f"Wrote {len(workload.jobs)} jobs to {out_trace} and {out_trajectories}")


@app.command("predict-report")
def predict_report_command(
    trace: Annotated[Path, typer.Option(help="Gavel-format trace.")],
    trajectories: Annotated[Path, typer.Option(help="The trace's *.trajectories.json.")],
    throughputs: Annotated[Path, typer.Option(help="Throughput table (reference JSON).")],
    out: Annotated[
        Path | None, typer.Option(help="Directory for prediction.json and prediction.png.")
    ] = None,
    throughput_knowledge: knobs.ThroughputKnowledgeOption = "declared",
    seed: Annotated[
        int, typer.Option(help="Seed of the noise of --throughput-knowledge noisy:P.")
    ] = 0,
    slowdown: Annotated[
        float,
        typer.Option(
            help="Timeline of what is known when: each job runs from its arrival this many "
            "times slower than alone (1: alone; a busy cluster is slower).",
            min=1.0,
        ),
    ] = 1.0,
    leave_one_model_out: Annotated[
        bool,
        typer.Option(
            "--leave-one-model-out",
            help="Also score each model's jobs with a prior built without that model, twice: "
            "never seen (the prior never learns a job of it) and new to the cluster (the prior "
            "starts with every other model's jobs and learns the model's own as they finish); "
            "a table each, in prediction.json.",
        ),
    ] = False,
) -> None:
    """How well regimes and run times are predicted at 0%, 10%, ..., 90% of each dynamic job.

    Compares the paper's restatement rule, the population predictor (empirical Bayes over the
    jobs finished by then, no look-ahead) and the greedy latest-throughput guess (and the oracle
    as a sanity check) against the true trajectories.
    """
    try:
        knowledge = knobs.parse_knowledge(throughput_knowledge)
        workload = load_workload(trace, trajectories, load_throughputs(throughputs))
        workload = apply_knowledge(workload, knowledge, seed)
        if out is not None:
            _make_dir(out)
    except InputError as error:
        _fail(str(error))
    report = prediction_report(workload, slowdown=slowdown, throughput_knowledge=str(knowledge))
    if report.jobs == 0:
        _fail(f"{trace}: no job adapts its batch size (mode accordion or gns); nothing to predict")
    if not console.is_terminal:
        console.width = max(console.width, 140)
    console.print(prediction_table(report))
    oracle = report.overall_oracle()
    policy = report.overall[report.policy_predictor]
    console.print(
        f"The Shockwave policy plans with {report.policy_predictor} (*): regime error "
        f"{policy.regime_error:.1%}, run-time accuracy {policy.runtime_accuracy:.1%}. "
        f"Oracle (sanity check): regime error {oracle.regime_error:.1%}, "
        f"run-time accuracy {oracle.runtime_accuracy:.1%}. "
        "Paper: about 6% regime error, 84% run-time accuracy on average."
    )
    held_out = {
        way: leave_one_model_out_reports(
            workload, slowdown=slowdown, throughput_knowledge=str(knowledge), held_out=way
        )
        for way in (HeldOut if leave_one_model_out else ())
    }
    for way, reports in held_out.items():
        console.print(held_out_table(reports, way))
    if out is not None:
        document = report.as_dict()
        if held_out:
            document["leave_one_model_out"] = {
                str(way): held_out_as_dict(reports) for way, reports in held_out.items()
            }
        write_json(document, out / "prediction.json")
        plot_prediction(report, out / "prediction.png")
        console.print(f"Reports written to {out}/ (prediction.json, prediction.png)")


@app.command("policies")
def policies_command() -> None:
    """List the registered scheduling policies."""
    table = Table(title="Registered policies", title_justify="left")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("baseline")
    table.add_column("description")
    for name in policy_names():
        table.add_row(name, "yes" if name in BASELINES else "", _summary(get_policy(name)))
    console.print(table)


def _policy_setups(
    policies: Sequence[Policy], seed: int | None, settings: SimSettings, tuning: ShockwaveKnobs
) -> list[PolicySetup]:
    """Each policy with its params: defaults, ``seed`` where they take one, and the Shockwave
    knobs for the policy whose params are ShockwaveParams (its run alone sees the true
    trajectories under ``--oracle``)."""
    setups: list[PolicySetup] = []
    for policy in policies:
        params = policy_params(policy, seed)
        if isinstance(params, ShockwaveParams):
            params = apply_knobs(params, tuning, seed)
            params = replace(params, restart_overhead_s=settings.restart_overhead_s)
            reveal = replace(settings, reveal_trajectories=params.oracle)
            setups.append(PolicySetup(policy, params, reveal))
        else:
            setups.append(PolicySetup(policy, params, settings))
    given = tuning.given()
    if given and not any(isinstance(s.params, ShockwaveParams) for s in setups):
        raise InputError(
            f"{', '.join(given)} tune the shockwave policy only, and --policy does not select it"
        )
    return setups


def _run_all(
    workload: Workload, cluster: Cluster, setups: Sequence[PolicySetup]
) -> list[SimResult]:
    """Simulate each policy in turn, with a progress bar per policy advancing on finished jobs
    (on stderr, only when it is a terminal: a log or a pipe gets the table alone)."""
    results: list[SimResult] = []
    columns = (
        TextColumn("[bold]{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs  t={task.fields[now]:>9,.0f} s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=errors, disable=not errors.is_terminal) as progress:
        for setup in setups:
            task = progress.add_task(setup.policy.name, total=len(workload.jobs), now=0.0)

            def on_round(now: float, finished: int, total: int, task_id: TaskID = task) -> None:
                progress.update(task_id, completed=finished, now=now)

            result = simulate(
                workload,
                cluster,
                setup.policy,
                setup.params,
                setup.settings,
                timer=time.perf_counter,
                on_round=on_round,
            )
            results.append(result)
    return results


def _write_reports(
    out: Path,
    setups: Sequence[PolicySetup],
    results: Sequence[SimResult],
    runs: Sequence[RunMetrics],
    knowledge: str,
    report: bool = False,
) -> None:
    records = [
        {**run_record(result, run, setup.params), "throughput_knowledge": knowledge}
        for setup, result, run in zip(setups, results, runs, strict=True)
    ]
    write_json(records, out / "metrics.json")
    x_max = max((result.makespan_s for result in results), default=None)
    for result, run in zip(results, runs, strict=True):
        write_jobs_csv(result, run, out / f"jobs-{result.policy}.csv")
        plot_gantt(result, out / f"{result.policy}-gantt.png", x_max=x_max)
    plot_gantts(results, out / "gantt.png")
    plot_ftf_cdf(runs, out / "ftf-cdf.png")
    plot_utilization(results, out / "utilization.png")
    if report:
        images = [out / "gantt.png", out / "utilization.png", out / "ftf-cdf.png"]
        images += [out / f"{result.policy}-gantt.png" for result in results]
        title = f"Shockwave simulation: {results[0].workload}" if results else "Simulation"
        write_html_report(out / "report.html", title, records, images)


def _workload(
    trace: Path | None,
    trajectories: Path | None,
    generate: int | None,
    throughputs: Path,
    seed: int | None,
    mean_interarrival: float,
    mode_mix: Mapping[AdaptationMode, float],
) -> Workload:
    if trace is not None:
        if generate is not None:
            raise InputError("give either --trace or --generate, not both")
        if trajectories is None:
            raise InputError("--trace needs --trajectories (the trace's *.trajectories.json)")
        return load_workload(trace, trajectories, load_throughputs(throughputs))
    if generate is None:
        raise InputError("give --trace and --trajectories, or --generate N")
    seed = 0 if seed is None else seed
    return _generated(generate, throughputs, seed, mean_interarrival, mode_mix)


def _elastic(workload: Workload, throughputs: Path, max_gpus: int) -> Workload:
    try:
        return make_elastic(workload, load_throughputs(throughputs), max_gpus)
    except ValueError as error:
        raise InputError(str(error)) from None


def _mode_mix(text: str | None, generate: int | None) -> Mapping[AdaptationMode, float]:
    if text is None:
        return MODE_MIX
    if generate is None:
        raise InputError("--mode-mix shapes a generated workload: use it with --generate N")
    return parse_mode_mix(text)


def _generated(
    jobs: int,
    throughputs: Path,
    seed: int,
    mean_interarrival: float,
    mode_mix: Mapping[AdaptationMode, float],
) -> Workload:
    table = load_throughputs(throughputs)
    try:
        return generate_workload(
            jobs,
            seed=seed,
            throughputs=table,
            mean_interarrival_s=mean_interarrival,
            mode_mix=mode_mix,
        )
    except ValueError as error:
        raise InputError(f"cannot generate the workload: {error}") from None


def _settings(
    round_seconds: float, restart_overhead: float, plan_latency: float, mid_round_fills: bool
) -> SimSettings:
    try:
        return SimSettings(
            round_seconds=round_seconds,
            restart_overhead_s=restart_overhead,
            plan_latency_s=plan_latency,
            mid_round_fills=mid_round_fills,
        )
    except ValueError as error:
        raise InputError(f"--round-seconds/--restart-overhead/--plan-latency: {error}") from None


def _check_fits(workload: Workload, cluster: Cluster) -> None:
    for job in workload.jobs:
        try:
            check_fits_typed(job.spec, cluster)
        except ValidationError as error:
            raise InputError(
                f"{workload.name} job {job.spec.job_id}: {error.message} (raise --gpus)"
            ) from None


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot create directory {path}: {error}") from None


def _summary(policy: Policy) -> str:
    """First line of the policy class's own docstring, else of its module's."""
    doc = type(policy).__dict__.get("__doc__") or sys.modules[type(policy).__module__].__doc__
    return (doc or "").strip().splitlines()[0].replace("``", "") if doc else ""


def _fail(message: str) -> NoReturn:
    errors.print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    raise typer.Exit(INPUT_ERROR_EXIT)


app.command("api")(api_command)
app.command("replay")(replay_command)
app.command("import-trace")(import_trace_command)
app.add_typer(admin_app, name="admin")
app.add_typer(jobs_app, name="jobs")
app.add_typer(nodes_app, name="nodes")
app.add_typer(tenants_app, name="tenants")
app.command("usage")(usage_command)
app.command("cluster")(cluster_command)
app.command("worker")(worker_command)
app.command("driver")(driver_command)
app.command("up")(up_command)
app.command("agent")(agent_command)
