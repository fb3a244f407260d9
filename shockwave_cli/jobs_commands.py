"""``shockwave jobs``: submit, list, inspect, cancel and watch jobs through the REST API.

The API is found at ``--api-url`` (or SHOCKWAVE_API_URL, default http://127.0.0.1:8000) and
called with ``--token`` (or SHOCKWAVE_TOKEN; none in open mode). Read commands take
``--output table|json|yaml``. An error the API returns is one red line,
``error: <title>: <detail>``, with exit code 1; so is an API that does not answer. A usage
error (a bad option, an unreadable job file) exits with 2.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from shockwave_cli.jobs_client import (
    DEFAULT_API_URL,
    ApiError,
    ApiUnreachable,
    Json,
    ShockwaveClient,
)
from shockwave_cli.jobs_render import (
    OutputFormat,
    dump,
    events_table,
    job_detail,
    jobs_table,
    print_document,
    state_summary,
    user_text,
)

API_ERROR_EXIT = 1
USAGE_ERROR_EXIT = 2
Snapshot = Callable[[], tuple[list[Json], str | None]]
"""Fetches the jobs to show: (jobs, None), or ([], why the API did not answer)."""
STATES = "PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED, CANCELLED"

jobs_app = typer.Typer(
    help="Submit, list, inspect, cancel and watch jobs through the Shockwave API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
console = Console()
errors = Console(stderr=True)
if not console.is_terminal:
    console.width = max(console.width, 160)

ApiUrl = Annotated[
    str,
    typer.Option("--api-url", envvar="SHOCKWAVE_API_URL", help="Base URL of the Shockwave API."),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SHOCKWAVE_TOKEN",
        show_default=False,
        help="Bearer token (from `shockwave admin create-token`); none in open mode.",
    ),
]
Output = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="table for people, json or yaml for scripts.")
]
StateFilter = Annotated[
    str | None, typer.Option("--state", help=f"Only jobs in this state ({STATES}).")
]
TenantFilter = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's jobs.")]
NameFilter = Annotated[str | None, typer.Option("--name", help="Only jobs with this exact name.")]


@jobs_app.command("submit")
def submit_command(
    file: Annotated[
        Path | None,
        typer.Argument(
            help="Job as YAML or JSON with the API's JobCreate fields ('-': stdin). "
            "Options given as well override the file's fields.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant (admins only).")] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs the job needs (1, 2, 4 or 8).")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs to train.")] = None,
    samples_per_epoch: Annotated[int | None, typer.Option(help="Samples in one epoch.")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Initial batch size (initial_batch_size).")
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="Batch-size adaptation: static, accordion, gns, custom.")
    ] = None,
    batch_sizes: Annotated[
        str | None, typer.Option(help="Batch sizes the job may use, comma-separated.")
    ] = None,
    throughput: Annotated[
        str | None,
        typer.Option(help="Known throughput, BATCH=SAMPLES_PER_S pairs, comma-separated."),
    ] = None,
    budget: Annotated[float | None, typer.Option(help="Fair-share budget weight.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name, for people.")] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(help="Retry-safe key: resubmitting with the same key returns the same job."),
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Submit a job from a YAML/JSON file or from options; print the job the API created."""
    flags: dict[str, Any] = {
        "name": name,
        "tenant": tenant,
        "gpus": gpus,
        "epochs": epochs,
        "samples_per_epoch": samples_per_epoch,
        "initial_batch_size": batch_size,
        "mode": mode,
        "batch_sizes": None if batch_sizes is None else _int_list("--batch-sizes", batch_sizes),
        "throughput": None if throughput is None else _throughput(throughput),
        "budget": budget,
        "model": model,
    }
    given = {key: value for key, value in flags.items() if value is not None}
    if file is None and not given:
        _usage("give a job file (YAML or JSON) or options such as --gpus, --epochs")
    body = {**(_job_file(file) if file is not None else {}), **given}
    with _api(api_url, token) as client:
        job = client.submit_job(body, idempotency_key)
    _show_job(job, output)


@jobs_app.command("ls")
def list_command(
    state: StateFilter = None,
    tenant: TenantFilter = None,
    name: NameFilter = None,
    page_size: Annotated[int | None, typer.Option(help="Jobs per page.", min=1, max=500)] = None,
    page_token: Annotated[
        str | None, typer.Option(help="Continue from a previous page's next_page_token.")
    ] = None,
    all_pages: Annotated[
        bool, typer.Option("--all", help="Follow next_page_token to the last page.")
    ] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """List jobs, oldest first: one page, or every page with --all.

    json/yaml print {"items": [...], "next_page_token": ...} (no token after --all).
    """
    filters: dict[str, Any] = {
        "state": _state(state),
        "tenant": tenant,
        "name": name,
        "page_size": page_size,
    }
    with _api(api_url, token) as client:
        if all_pages:
            page: Json = {
                "items": list(client.iter_jobs(**filters, page_token=page_token)),
                "next_page_token": None,
            }
        else:
            page = client.list_jobs(**filters, page_token=page_token)
    if output is not OutputFormat.TABLE:
        print_document(console, page, output)
        return
    console.print(jobs_table(page.get("items", [])))
    if page.get("next_page_token"):
        errors.print(
            f"More jobs: add --all, or --page-token {page['next_page_token']}", soft_wrap=True
        )


@jobs_app.command("get")
def get_command(
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Show one job."""
    with _api(api_url, token) as client:
        job = client.get_job(job_id)
    _show_job(job, output)


@jobs_app.command("cancel")
def cancel_command(
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Cancel a job (PENDING, RUNNING or SUSPENDED); print it in its new state."""
    with _api(api_url, token) as client:
        job = client.cancel_job(job_id)
    _show_job(job, output)


@jobs_app.command("events")
def events_command(
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    kind: Annotated[
        str | None, typer.Option(help="Only events of this kind: state, progress or scaling.")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """A job's history, oldest first: state changes with their reasons, progress and
    batch-size scaling events."""
    with _api(api_url, token) as client:
        events = _all_events(client, job_id, kind)
    if output is not OutputFormat.TABLE:
        print_document(console, events, output)
        return
    console.print(events_table(events, title=f"Events of job {job_id}"))


@jobs_app.command("watch")
def watch_command(
    state: StateFilter = None,
    tenant: TenantFilter = None,
    name: NameFilter = None,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.1)] = 2.0,
    count: Annotated[
        int | None, typer.Option(help="Stop after this many refreshes (default: Ctrl-C).", min=1)
    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many jobs.", min=1)] = 200,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Refresh a table of jobs every --interval seconds until Ctrl-C (or --count refreshes).

    json/yaml print one document per refresh (JSON lines, or YAML documents).
    An API that stops answering is shown and retried; an error the API returns ends the watch.
    """
    filters: dict[str, Any] = {"state": _state(state), "tenant": tenant, "name": name}
    with _api(api_url, token) as client:

        def snapshot() -> tuple[list[Json], str | None]:
            try:
                return list(client.iter_jobs(limit=limit, **filters)), None
            except ApiUnreachable as error:
                return [], str(error)

        try:
            if output is OutputFormat.TABLE:
                _watch_live(snapshot, interval, count, api_url)
            else:
                _watch_documents(snapshot, interval, count, output)
        except KeyboardInterrupt:
            return


def _watch_live(snapshot: Snapshot, interval: float, count: int | None, api_url: str) -> None:
    refreshes = 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            jobs, problem = snapshot()
            refreshes += 1
            stamp = datetime.now().strftime("%H:%M:%S")
            title = f"Jobs at {api_url}, {stamp}: {state_summary(jobs)}"
            table = jobs_table(jobs, title=title)
            footer = Text(f"Refreshing every {interval:g} s; Ctrl-C to stop.", style="dim")
            if problem:
                footer = user_text(f"{problem} (retrying)", "bold red")
            live.update(Group(table, footer), refresh=True)
            if count is not None and refreshes >= count:
                break
            time.sleep(interval)
    if not console.is_terminal:
        console.line()


def _watch_documents(
    snapshot: Snapshot, interval: float, count: int | None, output: OutputFormat
) -> None:
    refreshes = 0
    while True:
        jobs, problem = snapshot()
        refreshes += 1
        if problem:
            errors.print(user_text(f"error: {problem} (retrying)", "bold red"), soft_wrap=True)
        else:
            console.file.write(dump({"items": jobs}, output, compact=True) + "\n")
            console.file.flush()
        if count is not None and refreshes >= count:
            return
        time.sleep(interval)


def _all_events(client: ShockwaveClient, job_id: str, kind: str | None) -> list[Json]:
    """Every event of the job, following pages when the API pages them. An API without the
    events endpoint (404 or 405 while the job itself exists) is an error that says so."""
    events: list[Json] = []
    token: str | None = None
    while True:
        try:
            body = client.job_events(job_id, kind=kind, page_token=token, page_size=500)
        except ApiError as error:
            if error.status in (404, 405):
                client.get_job(job_id)
                raise ApiError(
                    error.status,
                    "Not supported",
                    f"this API does not serve job events (GET /v1/jobs/{job_id}/events "
                    f"answered {error.status})",
                ) from None
            raise
        if isinstance(body, list):
            return body
        events.extend(body.get("items", []))
        token = body.get("next_page_token")
        if not token:
            return events


def _show_job(job: Json, output: OutputFormat) -> None:
    if output is OutputFormat.TABLE:
        console.print(job_detail(job))
    else:
        print_document(console, job, output)


@contextmanager
def _api(api_url: str, token: str | None) -> Iterator[ShockwaveClient]:
    """A client for the duration of a command; API failures become one red line and exit 1."""
    if not api_url.startswith(("http://", "https://")):
        _usage(f"--api-url must start with http:// or https://, got {api_url!r}")
    try:
        with ShockwaveClient(api_url, token) as client:
            yield client
    except ApiError as error:
        message = f"error: {error.one_line()}"
        if error.status == 401 and not token:
            message += " (set SHOCKWAVE_TOKEN or pass --token)"
        _exit(message, API_ERROR_EXIT)
    except ApiUnreachable as error:
        _exit(f"error: {error} (is `shockwave api` running there?)", API_ERROR_EXIT)


def _job_file(path: Path) -> Json:
    """The job described in ``path`` (YAML or JSON; ``-`` is stdin), keys with ``-`` or ``_``."""
    where = "stdin" if str(path) == "-" else str(path)
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        document = yaml.safe_load(text)
    except OSError as error:
        _usage(f"cannot read {where}: {error.strerror or error}")
    except UnicodeDecodeError:
        _usage(f"{where}: not a text file")
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "malformed"
        _usage(f"{where}{line}: not valid YAML or JSON ({problem})")
    if not isinstance(document, dict):
        _usage(f"{where}: expected a mapping of job fields (gpus, epochs, ...)")
    return {str(key).replace("-", "_"): value for key, value in document.items()}


def _int_list(option: str, text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        _usage(f"{option}: expected comma-separated integers, got {text!r}")


def _throughput(text: str) -> dict[str, float]:
    table: dict[str, float] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        batch, sep, rate = pair.partition("=")
        try:
            if not sep:
                raise ValueError(pair)
            table[str(int(batch))] = float(rate)
        except ValueError:
            _usage(f"--throughput: expected BATCH=SAMPLES_PER_S pairs, got {pair!r}")
    return table


def _state(text: str | None) -> str | None:
    if text is None:
        return None
    state = text.strip().upper()
    if state not in STATES.split(", "):
        _usage(f"--state: expected one of {STATES}, got {text!r}")
    return state


def _usage(message: str) -> NoReturn:
    _exit(f"error: {message}", USAGE_ERROR_EXIT)


def _exit(message: str, code: int) -> NoReturn:
    errors.print(user_text(message, "bold red"), soft_wrap=True)
    raise typer.Exit(code)
