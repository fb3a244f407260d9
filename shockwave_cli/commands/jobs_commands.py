"""``shockwave jobs``: submit, list, inspect, cancel and watch jobs through the REST API.

The API is found at ``--api-url`` (or SHOCKWAVE_API_URL, default http://127.0.0.1:8000) and
called with ``--token`` (or SHOCKWAVE_TOKEN; none in open mode). Read commands take
``--output table|json|yaml``. An error the API returns is one red line,
``error: <title>: <detail>``, with exit code 1; so is an API that does not answer. A usage
error (a bad option, an unreadable job file) exits with 2.
"""

from __future__ import annotations

import shlex
import sys
import threading
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

from shockwave.domain.lifecycle import JobState
from shockwave_cli.client.jobs_client import (
    DEFAULT_API_URL,
    ApiError,
    ApiUnreachable,
    Json,
    ShockwaveClient,
)
from shockwave_cli.client.jobs_render import (
    OutputFormat,
    dump,
    event_line,
    events_table,
    job_detail,
    jobs_table,
    print_document,
    state_summary,
    user_text,
    why_text,
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
JobId = Annotated[
    str, typer.Argument(help="Job id, or any unique start of one.", show_default=False)
]
Wide = Annotated[bool, typer.Option("--wide", help="Every column, full ids.")]


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
    gpus: Annotated[
        int | None, typer.Option(help="GPUs the job needs (a power of two up to 1024).")
    ] = None,
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
    budget: Annotated[
        float | None,
        typer.Option(help="The job's weight inside its tenant's share (admins only)."),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(help="A priority class the admins defined: moves the job within its tenant."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name, for people.")] = None,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="What a node agent runs for the job, split like a shell line (no shell runs "
            "it): --command 'python train.py --lr 0.1'.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(help="Container image to run --command in, where the agent runs Docker."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="KEY=VALUE for the job's environment (repeat for more).",
            show_default=False,
        ),
    ] = None,
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
        "priority": priority,
        "model": model,
        "command": None if command is None else _argv(command),
        "image": image,
        "env": None if not env else _env(env),
    }
    given = {key: value for key, value in flags.items() if value is not None}
    if file is None and not given:
        _usage("give a job file (YAML or JSON) or options such as --gpus, --epochs")
    body = {**(_job_file(file) if file is not None else {}), **given}
    with api_client(api_url, token) as client:
        job = client.submit_job(body, idempotency_key)
    _show_job(job, output)
    if not job.get("command"):
        errors.print(
            Text(
                f"warning: job {str(job.get('id', ''))[:8]} has no command: it is planned, but "
                "no node agent can run it (give --command, or `command:` in the job file)",
                style="yellow",
            ),
            soft_wrap=True,
        )


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
    wide: Wide = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """List jobs, oldest first: one page, or every page with --all. The table shows short ids
    (any unique start of an id works wherever a job id is asked for); --wide shows every
    column and full ids.

    json/yaml print {"items": [...], "next_page_token": ...} (no token after --all).
    """
    filters: dict[str, Any] = {
        "state": _state(state),
        "tenant": tenant,
        "name": name,
        "page_size": page_size,
    }
    with api_client(api_url, token) as client:
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
    console.print(jobs_table(page.get("items", []), wide=wide))
    if page.get("next_page_token"):
        errors.print(
            f"More jobs: add --all, or --page-token {page['next_page_token']}", soft_wrap=True
        )


@jobs_app.command("get")
def get_command(
    job_id: JobId,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Show one job."""
    with api_client(api_url, token) as client:
        job_id = client.resolve_job(job_id)
        job = client.get_job(job_id)
    _show_job(job, output)


@jobs_app.command("cancel")
def cancel_command(
    job_id: JobId,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Cancel a job (PENDING, RUNNING or SUSPENDED); print it in its new state."""
    with api_client(api_url, token) as client:
        job_id = client.resolve_job(job_id)
        job = client.cancel_job(job_id)
    _show_job(job, output)


@jobs_app.command("events")
def events_command(
    job_id: JobId,
    kind: Annotated[
        str | None, typer.Option(help="Only events of this kind: state, progress or scaling.")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """A job's history, oldest first: state changes with their reasons, progress and
    batch-size scaling events."""
    with api_client(api_url, token) as client:
        job_id = client.resolve_job(job_id)
        events = _all_events(client, job_id, kind)
    if output is not OutputFormat.TABLE:
        print_document(console, events, output)
        return
    console.print(events_table(events, title=f"Events of job {job_id}"))


@jobs_app.command("logs")
def logs_command(
    job_id: JobId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the job ends.")
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between reads with -f.", min=0.1)] = 2.0,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
) -> None:
    """The tail of the job's output (its newest attempt's last few KiB, as its node agent last
    shipped them with its polls); -f follows it until the job ends."""
    with api_client(api_url, token) as client:
        job_id = client.resolve_job(job_id)
        shown = ""
        attempt = None
        while True:
            tails = [a for a in client.attempts(job_id) if a.get("log_tail") is not None]
            if tails:
                newest = tails[-1]
                if newest["attempt_id"] != attempt:
                    if attempt is not None or len(tails) > 1:
                        errors.print(
                            f"--- attempt {newest['attempt_id']} on {newest['node_id']}",
                            style="dim",
                        )
                    attempt, shown = newest["attempt_id"], ""
                text = str(newest["log_tail"])
                _write(new_output(shown, text))
                shown = text
            elif not follow:
                errors.print(
                    "no output yet: the job has not run, or its agent has not shipped any",
                    style="dim",
                )
            if not follow:
                return
            if JobState(client.get_job(job_id)["state"]).terminal:
                final = [a for a in client.attempts(job_id) if a.get("log_tail") is not None]
                if final and final[-1]["attempt_id"] == attempt:
                    _write(new_output(shown, str(final[-1]["log_tail"])))
                return
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return


def new_output(shown: str, text: str) -> str:
    """What of ``text`` (a fresh tail) was not in ``shown`` (the tail printed before): the
    tails are windows on a growing log, so the new part follows the longest end of ``shown``
    that ``text`` starts with (all of ``text`` when they do not overlap)."""
    for size in range(min(len(shown), len(text)), 0, -1):
        if text.startswith(shown[-size:]):
            return text[size:]
    return text


def _write(text: str) -> None:
    if text:
        console.file.write(text)
        console.file.flush()


@jobs_app.command("why")
def why_command(
    job_id: JobId,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Why the job waits (or what it does): the cause in words, its planned rounds, its
    finish-time-fairness estimate and remaining time, and its last preemption's reason."""
    with api_client(api_url, token) as client:
        job_id = client.resolve_job(job_id)
        prediction = client.prediction(job_id)
        preemptions = _all_events(client, job_id, "preemption")
    if output is not OutputFormat.TABLE:
        print_document(
            console,
            {**prediction, "last_preemption": preemptions[-1] if preemptions else None},
            output,
        )
        return
    console.print(why_text(prediction, preemptions[-1] if preemptions else None))


@jobs_app.command("watch")
def watch_command(
    state: StateFilter = None,
    tenant: TenantFilter = None,
    name: NameFilter = None,
    interval: Annotated[
        float, typer.Option(help="Refresh at least this often (seconds).", min=0.1)
    ] = 10.0,
    count: Annotated[
        int | None,
        typer.Option(help="Stop after this many refreshes, or events (default: Ctrl-C).", min=1),
    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many jobs.", min=1)] = 200,
    events: Annotated[
        bool,
        typer.Option(
            "--events",
            help="Print each job state change and preemption as it happens (the event stream) "
            "instead of a table.",
        ),
    ] = False,
    job: Annotated[
        str | None, typer.Option("--job", help="With --events: only this job's events.")
    ] = None,
    since: Annotated[
        int | None,
        typer.Option(
            help="With --events: replay the events after this event id first (0: all).", min=0
        ),
    ] = None,
    wide: Wide = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """A live table of jobs, refreshed as soon as the API's event stream (GET /v1/events)
    says a job changed state, and at least every --interval seconds; until Ctrl-C (or
    --count refreshes). --events prints the stream itself, one event a line.

    json/yaml print one document per refresh (JSON lines, or YAML documents).
    An API that stops answering is shown and retried; an error the API returns ends the watch.
    """
    filters: dict[str, Any] = {"state": _state(state), "tenant": tenant, "name": name}
    with api_client(api_url, token) as client:
        if events:
            job_id = client.resolve_job(job) if job is not None else None
            try:
                _print_events(client, job_id, since, count, output)
            except KeyboardInterrupt:
                return
            return

        def snapshot() -> tuple[list[Json], str | None]:
            try:
                return list(client.iter_jobs(limit=limit, **filters)), None
            except ApiUnreachable as error:
                return [], str(error)

        follower = Follower(api_url, token)
        follower.start()
        try:
            if output is OutputFormat.TABLE:
                _watch_live(snapshot, follower.changed, interval, count, api_url, wide)
            else:
                _watch_documents(snapshot, follower.changed, interval, count, output)
        except KeyboardInterrupt:
            return
        finally:
            follower.stop()


class Follower:
    """Follows the event stream in a thread and sets ``changed`` on every event; reconnects
    after a drop (resuming after the last event id) until :meth:`stop`."""

    def __init__(self, api_url: str, token: str | None) -> None:
        self.api_url, self.token = api_url, token
        self.changed = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shockwave-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        last: str | None = None
        while not self._stopped.is_set():
            try:
                with ShockwaveClient(self.api_url, self.token) as client:
                    for event in client.stream(last):
                        last = str(event["id"])
                        self.changed.set()
                        if self._stopped.is_set():
                            return
            except (ApiError, ApiUnreachable, ValueError, KeyError):
                pass
            self._stopped.wait(2.0)


def _print_events(
    client: ShockwaveClient,
    job_id: str | None,
    since: int | None,
    count: int | None,
    output: OutputFormat,
) -> None:
    """Each event of the stream as it comes: a line for people, or a JSON/YAML document."""
    seen = 0
    last: str | None = None if since is None else str(since)
    while True:
        try:
            for event in client.stream(last, job=job_id):
                last = str(event["id"])
                if output is OutputFormat.TABLE:
                    console.print(event_line(event), soft_wrap=True)
                else:
                    console.file.write(dump(event, output, compact=True) + "\n")
                    console.file.flush()
                seen += 1
                if count is not None and seen >= count:
                    return
        except ApiUnreachable as error:
            errors.print(Text(f"error: {error} (retrying)", style="bold red"), soft_wrap=True)
            time.sleep(2.0)


def _watch_live(
    snapshot: Snapshot,
    changed: threading.Event,
    interval: float,
    count: int | None,
    api_url: str,
    wide: bool,
) -> None:
    refreshes = 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            changed.clear()
            jobs, problem = snapshot()
            refreshes += 1
            stamp = datetime.now().strftime("%H:%M:%S")
            title = f"Jobs at {api_url}, {stamp}: {state_summary(jobs)}"
            table = jobs_table(jobs, title=title, wide=wide)
            footer = Text(
                f"Refreshed on each job event, at least every {interval:g} s; Ctrl-C to stop.",
                style="dim",
            )
            if problem:
                footer = user_text(f"{problem} (retrying)", "bold red")
            live.update(Group(table, footer), refresh=True)
            if count is not None and refreshes >= count:
                break
            changed.wait(interval)
    if not console.is_terminal:
        console.line()


def _watch_documents(
    snapshot: Snapshot,
    changed: threading.Event,
    interval: float,
    count: int | None,
    output: OutputFormat,
) -> None:
    refreshes = 0
    while True:
        changed.clear()
        jobs, problem = snapshot()
        refreshes += 1
        if problem:
            errors.print(user_text(f"error: {problem} (retrying)", "bold red"), soft_wrap=True)
        else:
            console.file.write(dump({"items": jobs}, output, compact=True) + "\n")
            console.file.flush()
        if count is not None and refreshes >= count:
            return
        changed.wait(interval)


def _argv(text: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as error:
        _usage(f"--command: {error}")
    if not argv:
        _usage("--command: give the program to run")
    return argv


def _env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _usage(f"--env: expected KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


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
def api_client(api_url: str, token: str | None) -> Iterator[ShockwaveClient]:
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
