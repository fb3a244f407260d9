"""``shockwave tenants ls|set`` and ``shockwave usage``: the tenant tree, its shares and
limits, and who used how many GPU-hours, over the API (``/v1/tenants``, ``/v1/usage``).

Same connection options and output formats as ``shockwave jobs``
(:mod:`shockwave_cli.commands.jobs_commands`); ``shockwave usage --output csv`` prints the API's
CSV."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table

from shockwave_cli.client.jobs_client import DEFAULT_API_URL
from shockwave_cli.client.jobs_render import OutputFormat, print_document, short_time
from shockwave_cli.commands.jobs_commands import ApiUrl, Output, Token, api_client, console

tenants_app = typer.Typer(
    help="Tenants: the tree of shares (weights) and limits (admins change them).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

CLEAR = "none"
"""The value of a limit option that clears the limit."""


def _limit(option: str, text: str | None) -> tuple[bool, int | None]:
    """(given, value) of a limit option: a whole number >= 0, or ``none`` to clear it."""
    if text is None:
        return False, None
    if text.strip().lower() == CLEAR:
        return True, None
    try:
        value = int(text)
    except ValueError:
        message = f"a whole number or {CLEAR!r}, got {text!r}"
        raise typer.BadParameter(message, param_hint=option) from None
    if value < 0:
        raise typer.BadParameter(f"must be 0 or more, got {value}", param_hint=option)
    return True, value


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


@tenants_app.command("ls")
def tenants_ls(
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """The tenant tree (a user: its own tenant).

    Weight, guaranteed and max GPUs, max jobs and jobs queued and running; ``*`` marks a
    tenant without settings of its own (the defaults)."""
    with api_client(api_url, token) as client:
        tree = client.request("GET", "/v1/tenants")
    if output is not OutputFormat.TABLE:
        print_document(console, tree, output)
        return
    items = {t["path"]: t for t in tree.get("items", [])}
    table = Table(title=f"{len(items)} tenant(s)", title_justify="left")
    for column in ("tenant", "weight", "guaranteed", "max gpus", "max jobs", "active", "changed"):
        table.add_column(column, no_wrap=True)

    def add(path: str, depth: int) -> None:
        tenant = items[path]
        mark = "" if tenant.get("configured") else " *"
        table.add_row(
            "  " * depth + (path.rsplit("/", 1)[-1] if depth else path) + mark,
            f"{float(tenant['weight']):g}",
            _cell(tenant.get("guaranteed_gpus")),
            _cell(tenant.get("max_gpus")),
            _cell(tenant.get("max_jobs")),
            str(tenant.get("active_jobs", 0)),
            short_time(tenant.get("updated_at")) or "-",
        )
        for child in tenant.get("children", []):
            if child in items:
                add(child, depth + 1)

    for root in tree.get("roots", []):
        add(root, 0)
    console.print(table)


@tenants_app.command("set")
def tenants_set(
    path: Annotated[str, typer.Argument(help="The tenant's path, e.g. org/team.")],
    weight: Annotated[
        float | None, typer.Option(help="Its share among its siblings (relative).")
    ] = None,
    guaranteed_gpus: Annotated[
        str | None, typer.Option(help=f"GPUs it gets when it has demand ({CLEAR!r} clears).")
    ] = None,
    max_gpus: Annotated[
        str | None, typer.Option(help=f"The most GPUs its jobs hold ({CLEAR!r} clears).")
    ] = None,
    max_jobs: Annotated[
        str | None,
        typer.Option(help=f"The most jobs queued and running ({CLEAR!r} clears)."),
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Configure a tenant or change the settings given (admins).

    Each change is kept with its time in the tenant's history."""
    changes: dict[str, Any] = {} if weight is None else {"weight": weight}
    for option, name, text in (
        ("--guaranteed-gpus", "guaranteed_gpus", guaranteed_gpus),
        ("--max-gpus", "max_gpus", max_gpus),
        ("--max-jobs", "max_jobs", max_jobs),
    ):
        given, value = _limit(option, text)
        if given:
            changes[name] = value
    with api_client(api_url, token) as client:
        tenant = client.request("PATCH", f"/v1/tenants/{quote(path, safe='/')}", json=changes)
    if output is not OutputFormat.TABLE:
        print_document(console, tenant, output)
        return
    limits = ", ".join(
        f"{name} {_cell(tenant.get(name))}" for name in ("guaranteed_gpus", "max_gpus", "max_jobs")
    )
    console.print(
        f"tenant {tenant['path']}: weight {float(tenant['weight']):g}, {limits} "
        f"(version {tenant['version']})",
        markup=False,
    )


USAGE_COLUMNS = (
    "key",
    "tenant",
    "label",
    "gpu_hours",
    "jobs",
    "finished",
    "mean_wait_s",
    "mean_ftf",
    "max_ftf",
)


def usage_command(
    since: Annotated[
        str | None,
        typer.Option(help="Start (RFC 3339, 2026-11-01T00:00:00Z; default: a day before until)."),
    ] = None,
    until: Annotated[str | None, typer.Option(help="End (RFC 3339; default: now).")] = None,
    group_by: Annotated[str, typer.Option(help="tenant, user or job.")] = "tenant",
    tenant: Annotated[
        str | None, typer.Option(help="Only this tenant and those below it (admins).")
    ] = None,
    csv: Annotated[bool, typer.Option("--csv", help="Print the API's CSV table.")] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """GPU-hours, jobs, waits and FTF per tenant, user or job (as sacct/sreport give them).

    A user sees its own tenant's usage; an admin everyone's."""
    params = {"since": since, "until": until, "group_by": group_by, "tenant": tenant}
    with api_client(api_url, token) as client:
        if csv:
            text = client.text("/v1/usage", {**params, "format": "csv"}, "text/csv")
            console.file.write(text)
            console.file.flush()
            return
        usage = client.request("GET", "/v1/usage", params=params)
    if output is not OutputFormat.TABLE:
        print_document(console, usage, output)
        return
    table = Table(
        title=f"usage {short_time(usage['since'])} to {short_time(usage['until'])} by "
        f"{usage['group_by']}: {float(usage['total_gpu_hours']):.2f} GPU-hours",
        title_justify="left",
    )
    for column in USAGE_COLUMNS:
        table.add_column(column.replace("_", " "), no_wrap=column != "label")
    for row in usage.get("rows", []):
        table.add_row(*(_figure(row.get(column)) for column in USAGE_COLUMNS))
    console.print(table)


def _figure(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
