"""The service's long-running processes: ``shockwave worker`` (a solver worker) and its peers.

Each command reads its settings once, from the environment, and imports the service (Celery,
SQLAlchemy, the API) only when it runs, so the simulator's commands start as fast as before.
One section per command; main.py registers each with ``app.command(name)(function)``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from shockwave_cli.runtime.demo import Demo
    from shockwave_cli.runtime.embedded import Embedded

DATA_DIR = Path(".shockwave")
"""Where ``shockwave up`` keeps its database and the database's lock file by default: a folder of
the current directory (git-ignored in the project), so that neither lands among the sources."""

# --- shockwave worker ------------------------------------------------------------------------


def worker_command(
    concurrency: Annotated[
        int, typer.Option(help="Worker processes: plans solved at the same time.", min=1)
    ] = 1,
    log_level: Annotated[
        str, typer.Option(help="Log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Run a solver worker: a Celery worker on the solver queue that plans clusters.

    SHOCKWAVE_BROKER_URL names the broker (default redis://127.0.0.1:6379/0),
    SHOCKWAVE_DATABASE_URL the database plans are read from and written to, and
    SHOCKWAVE_SOLVER_QUEUE the queue (default solver). Start as many workers as you like.
    """
    from solver_service.celery_app import app
    from solver_service.settings import SolverSettings

    settings = SolverSettings()
    app.worker_main(
        [
            "worker",
            "--queues",
            settings.solver_queue,
            "--concurrency",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "--loglevel",
            log_level,
            "--hostname",
            f"solver-{os.getpid()}@%h",
            "--without-mingle",
            "--without-gossip",
        ]
    )


# --- shockwave driver ------------------------------------------------------------------------


def driver_command(
    round_seconds: Annotated[
        float | None,
        typer.Option(
            help="Round length in seconds, set on the cluster (default: the cluster's).", min=0.01
        ),
    ] = None,
    node_ttl: Annotated[
        float | None,
        typer.Option(
            help="Seconds without a heartbeat before a node is LOST (default 30).", min=0.01
        ),
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(help="Serve Prometheus metrics on this port (0: off).", min=0, max=65535)
    ] = 0,
    log_level: Annotated[
        str, typer.Option(help="Log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Run the round driver: at every round boundary it turns the freshest plan into leases
    (previous plan or greedy as fallbacks), once a round it asks for the next plan (half-way,
    or earlier when plans take longer to come back), and it marks silent nodes LOST.

    Start two for a standby: on Postgres one holds an advisory lock and drives, the other
    waits and takes over within a round if the first dies. SHOCKWAVE_DATABASE_URL names the
    database (migrated: `shockwave admin migrate`); plans are requested through the solver
    service (SHOCKWAVE_SOLVER_MODE, SHOCKWAVE_BROKER_URL, as for `shockwave worker`).
    """
    import logging
    import signal
    import threading

    from pydantic import ValidationError as PydanticError
    from sqlalchemy import inspect
    from sqlalchemy.exc import SQLAlchemyError

    from solver_service.driver import DriverSettings, RoundDriver
    from solver_service.enqueue import request_plan, shutdown
    from store.db import make_engine
    from store.lease_signal import CLUSTER, OVERLOAD, Listener, Wakeup

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = DriverSettings()
    except PydanticError as error:
        first = error.errors()[0]
        where = "SHOCKWAVE_" + "_".join(str(part) for part in first["loc"]).upper()
        typer.echo(f"error: {where}: {first['msg']}", err=True)
        raise typer.Exit(2) from None
    overrides = {"round_seconds": round_seconds, "node_ttl_s": node_ttl}
    settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    engine = make_engine(settings.database_url, settings.database_schema)
    try:
        migrated = inspect(engine).has_table("rounds")
    except SQLAlchemyError:
        migrated = True  # unreachable for now: the driver retries until it answers
    if not migrated:
        typer.echo("error: the database is not migrated: run `shockwave admin migrate`", err=True)
        raise typer.Exit(1)
    # A change the API processes commit (a job finished or submitted, a node joined) wakes
    # the driver at once over Postgres NOTIFY; without the channel it wakes every tick_s.
    # An API process that sheds requests (overloaded) says so: the driver then counts no
    # node's silence for a TTL.
    wakeup = Wakeup()
    driver = RoundDriver(engine, settings, request_plan=request_plan, sleep=wakeup.sleep)
    listener = (
        Listener(engine, {CLUSTER: wakeup.set, OVERLOAD: driver.servers_overloaded})
        if Listener.supported(engine)
        else None
    )
    if listener is not None:
        listener.start()
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, registry=driver.metrics.registry)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    standby = " (a standby until it holds the lock)" if engine.dialect.name == "postgresql" else ""
    typer.echo(
        f"Round driver on {engine.url.render_as_string(hide_password=True)}"
        f"{f', metrics on :{metrics_port}' if metrics_port else ''}{standby}",
        err=True,
    )
    try:
        driver.run(stop)
    finally:
        if listener is not None:
            listener.stop()
        shutdown()
        engine.dispose()


# --- shockwave up ----------------------------------------------------------------------------


def up_command(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Port the API listens on.", min=1, max=65535)] = 8000,
    db: Annotated[
        Path,
        typer.Option(
            help="SQLite file (created and migrated if new); its lock file goes beside it. The "
            "default's folder, .shockwave in the current directory, is created when missing.",
            dir_okay=False,
        ),
    ] = DATA_DIR / "shockwave.db",
    round_seconds: Annotated[
        float, typer.Option(help="Round length in seconds.", min=0.1, max=86400)
    ] = 120.0,
    policy: Annotated[
        str, typer.Option(help="Scheduling policy (`shockwave policies` lists them).")
    ] = "shockwave",
    host: Annotated[
        str, typer.Option(help="Address to listen on (loopback only in open mode).")
    ] = "127.0.0.1",
    open_mode: Annotated[
        bool,
        typer.Option(
            "--open/--no-open",
            help="Open mode: requests without a token act as admin (loopback hosts only). "
            "--no-open requires tokens (`shockwave admin create-token`).",
        ),
    ] = True,
    log_level: Annotated[
        str, typer.Option(help="Log level: critical, error, warning, info, debug.")
    ] = "info",
    solver: Annotated[
        str,
        typer.Option(
            help="Where plans are solved: inline (a thread of this process) or process (one "
            "child process: a long solve does not slow the API and the round driver).",
        ),
    ] = "inline",
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Also run local agents and a small workload of real training jobs "
            "(examples/numpy_linear.py), shown in a live table; exits when they are done. "
            "Defaults then: a fresh database in a temporary directory, rounds of 4 s, "
            "log level warning.",
        ),
    ] = False,
    agents: Annotated[int, typer.Option(help="--demo: local agents (nodes).", min=1, max=8)] = 1,
    slots: Annotated[int, typer.Option(help="--demo: GPU slots per agent.", min=1, max=16)] = 2,
) -> None:
    """Run the whole service in one process: the API, the round driver and the solver, on a
    SQLite file, with no Redis or Postgres. Stop it with Ctrl-C (or SIGTERM).

    Open mode (the default) serves requests without a token as an admin, so it listens on
    loopback addresses only. The implementation is shockwave_cli/runtime/embedded.py; --demo's is
    shockwave_cli/runtime/demo.py.
    """
    import logging
    import signal
    import tempfile

    from shockwave.policies.policy import UnknownPolicyError, get_policy
    from shockwave_cli.commands.api_commands import _fail, _migrate, is_loopback

    if open_mode and not is_loopback(host):
        _fail(
            f"open mode serves every request as an admin, so it listens on loopback addresses "
            f"only (127.0.0.1, ::1, localhost), not {host!r}: use --no-open and tokens "
            "(`shockwave admin create-token`) to listen elsewhere",
            2,
        )
    try:
        get_policy(policy)
    except UnknownPolicyError as error:
        _fail(f"--policy: {error}", 2)
    demo_dir: Path | None = None
    if demo:
        if not open_mode:
            _fail("--demo runs its agents and jobs in open mode: drop --no-open", 2)
        demo_dir = Path(tempfile.mkdtemp(prefix="shockwave-demo-"))
        if _defaulted(ctx, "db"):
            db = demo_dir / "demo.db"
        if _defaulted(ctx, "round_seconds"):
            round_seconds = 4.0
        if _defaulted(ctx, "log_level"):
            log_level = "warning"
    if _defaulted(ctx, "db"):
        db = data_directory_database(db)
    if not db.parent.is_dir():
        _fail(f"--db: the directory {str(db.parent)!r} does not exist", 2)
    if solver not in ("inline", "process"):
        _fail(f"--solver: inline or process, not {solver!r}", 2)

    from shockwave_cli.runtime import embedded

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if log_level.lower() != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)
    config = embedded.EmbeddedConfig(
        database=db,
        host=host,
        port=port,
        round_seconds=round_seconds,
        policy=policy,
        open_mode=open_mode,
        log_level=log_level.lower(),
        solver="process" if solver == "process" else "inline",
    )
    service = None
    show = None
    try:
        with embedded.claim(config) as listener:
            _migrate(config.database_url, None)
            service = embedded.Embedded(config)
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: service.stop.set() if service else None)
            service.start(listener)
            for line in embedded.banner(config):
                typer.echo(line)
            if demo_dir is not None:
                show = start_demo(service, config.base_url, demo_dir, agents, slots)
            died = service.wait()
            if show is not None:
                show.close()
            typer.echo("Stopping: API, round driver, solver ...", err=True)
            service.close()
            if died is not None:
                _fail(f"{died} stopped unexpectedly", 1)
            if show is not None and show.error is not None:
                _fail(show.error, 1)
    except embedded.CannotStart as error:
        _fail(str(error), 1)
    finally:
        if show is not None:
            show.close()
        if service is not None:
            service.close()
    typer.echo("Stopped.", err=True)


def data_directory_database(db: Path) -> Path:
    """``db`` (the default database path, in :data:`DATA_DIR`) with its folder created."""
    db.parent.mkdir(parents=True, exist_ok=True)
    return db


def _defaulted(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was left out of the command line (and its variable)."""
    source = ctx.get_parameter_source(name)
    return source is None or source.name in ("DEFAULT", "DEFAULT_MAP")


def start_demo(service: Embedded, api_url: str, work_dir: Path, agents: int, slots: int) -> Demo:
    """Start ``--demo``'s agents and jobs, and its live table in a thread that stops the
    service once every demo job is done."""
    import threading

    from rich.console import Console

    from shockwave_cli.runtime.demo import Demo, DemoError

    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # a log file or a pipe: room for the table's columns
    show = Demo(
        api_url,
        service.engine,
        work_dir,
        agents=agents,
        slots=slots,
        console=console,
        round_seconds=service.config.round_seconds,
    )
    typer.echo(
        f"Demo: {agents} agent(s) x {slots} slot(s), {len(show.jobs)} jobs; files in {work_dir}"
    )
    try:
        show.start()
    except DemoError as error:
        show.error = str(error)
    except Exception as error:  # an agent that cannot be spawned, an API that does not answer
        show.error = f"the demo could not start: {error}"
    if show.error is not None:
        service.stop.set()  # `up` then stops what did start, and exits 1
        return show
    threading.Thread(
        target=show.run, args=(service.stop,), name="shockwave-demo", daemon=True
    ).start()
    return show


# --- shockwave agent -------------------------------------------------------------------------


def agent_command(
    api: Annotated[
        str, typer.Option("--api", help="The Shockwave API's base URL.")
    ] = "http://127.0.0.1:8000",
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SHOCKWAVE_AGENT_TOKEN",
            help="An agent token (`shockwave admin create-token --role agent --node N`); "
            "none in open mode. Prefer the variable or --token-file to the command line.",
            show_default=False,
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="Read the token from this file.", dir_okay=False, exists=True),
    ] = None,
    gpus: Annotated[
        str,
        typer.Option(help="GPUs to offer: auto (every one nvidia-smi lists) or a number of slots."),
    ] = "auto",
    runtime: Annotated[
        str,
        typer.Option(help="auto (docker where `docker info` answers), process or docker."),
    ] = "auto",
    node_name: Annotated[
        str | None,
        typer.Option(
            help="The node to act for (open mode and admin tokens; default: the hostname "
            "without a token, the token's node with one).",
            show_default=False,
        ),
    ] = None,
    work_dir: Annotated[
        Path,
        typer.Option(
            help="Holds the state file, attempt logs and checkpoints/<job>.", file_okay=False
        ),
    ] = Path("shockwave-agent"),
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between lease polls.", min=0.05, max=60)
    ] = 1.0,
    heartbeat_interval: Annotated[
        float, typer.Option(help="Seconds between heartbeats.", min=0.1, max=600)
    ] = 3.0,
    grace_seconds: Annotated[
        float,
        typer.Option(help="Seconds a job has to checkpoint and exit after SIGTERM.", min=0),
    ] = 10.0,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds before a request to the API counts as failed.", min=0.1)
    ] = 3.0,
    lease_slack: Annotated[
        float,
        typer.Option(
            help="Seconds a lease may run past its end with no word from the server.", min=0
        ),
    ] = 5.0,
    orphan_grace: Annotated[
        float,
        typer.Option(
            help="Seconds a job outlives its agent (killed, crashed) before it is stopped; "
            "with --grace-seconds keep it below the server's node TTL. 0: never.",
            min=0,
        ),
    ] = 10.0,
    job_uids: Annotated[
        str,
        typer.Option(
            help="Run each job as a uid of its own from FIRST-LAST (an agent running as root; "
            "auto: 60000-60999 as root, none otherwise; off: as the agent's user).",
        ),
    ] = "auto",
    container_network: Annotated[
        str,
        typer.Option(
            help="The Docker network job containers join (host: the host's network, only "
            "where jobs may have it).",
        ),
    ] = "bridge",
    container_memory: Annotated[
        str | None,
        typer.Option(
            help="Memory limit of each job container (e.g. 16g); default: none.", show_default=False
        ),
    ] = None,
    container_pids: Annotated[
        int, typer.Option(help="Most processes and threads in one job container.", min=16)
    ] = 4096,
    allowed_image: Annotated[
        list[str] | None,
        typer.Option(
            help="An image (any tag), an exact reference, or a registry or namespace ending "
            "with / that jobs may run in; repeat it; default: any image reference.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="Log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Run a node agent: register this machine, heartbeat, poll its leases and run each lease's
    job as a process (or a Docker container), with CUDA_VISIBLE_DEVICES and the SHOCKWAVE_*
    environment; stop jobs with SIGTERM, a grace period, then SIGKILL; report every attempt.

    A server outage never stops a job early: it runs to the end of its lease. A restarted
    agent re-attaches to the jobs it had started (state in --work-dir). Ctrl-C or SIGTERM stops
    every job cleanly; twice exits at once, leaving them to the next agent. See docs/agent.md.
    """
    import logging
    import os
    import re
    from typing import Literal, cast

    from agent.config import ContainerLimits
    from agent.main import Options, UsageError, WorkDirBusy, configure, serve
    from shockwave.domain.image_reference import is_image_reference
    from shockwave_cli.commands.api_commands import _fail

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if log_level.lower() != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.pop("SHOCKWAVE_AGENT_TOKEN", None)  # read; nothing the agent starts inherits it
    if token_file is not None:
        if token_file.stat().st_mode & 0o077:
            logging.getLogger("agent").warning(
                "--token-file %s is readable by others: make it mode 0600", token_file
            )
        token = token_file.read_text().strip() or None
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", container_network):
        _fail(f"--container-network: not a Docker network name: {container_network!r}", 2)
    if container_memory is not None and not re.fullmatch(r"[0-9]+[bkmgBKMG]?", container_memory):
        _fail(f"--container-memory: expected a size such as 16g, got {container_memory!r}", 2)
    for entry in allowed_image or []:
        if not is_image_reference(entry.rstrip("/")):
            _fail(f"--allowed-image: not an image reference or registry: {entry!r}", 2)
    if gpus != "auto" and not (gpus.isdigit() and 1 <= int(gpus) <= 1024):
        _fail(f"--gpus: expected auto or a number from 1 to 1024, got {gpus!r}", 2)
    if runtime not in ("auto", "process", "docker"):
        _fail(f"--runtime: expected auto, process or docker, got {runtime!r}", 2)
    options = Options(
        api_url=api,
        token=token,
        node=node_name,
        gpus=None if gpus == "auto" else int(gpus),
        runtime=cast(Literal["auto", "process", "docker"], runtime),
        work_dir=work_dir,
        poll_interval_s=poll_interval,
        heartbeat_interval_s=heartbeat_interval,
        grace_s=grace_seconds,
        lease_slack_s=lease_slack,
        request_timeout_s=request_timeout,
        orphan_grace_s=orphan_grace,
        job_uids=job_uids,
        containers=ContainerLimits(
            network=container_network,
            memory=container_memory,
            pids=container_pids,
            allowed_images=tuple(allowed_image or ()),
        ),
    )
    try:
        serve(configure(options))
    except UsageError as error:
        _fail(str(error), 2)
    except WorkDirBusy as error:
        _fail(f"{error}: one agent per work directory", 1)
