"""``shockwave nodes ls`` and ``shockwave cluster``: the cluster as the API sees it.

Same connection options and output formats as ``shockwave jobs``
(:mod:`shockwave_cli.commands.jobs_commands`).
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from shockwave_cli.client.jobs_client import DEFAULT_API_URL, ApiError
from shockwave_cli.client.jobs_render import SHORT_ID, OutputFormat, print_document, short_time
from shockwave_cli.commands.jobs_commands import ApiUrl, Output, Token, api_client, console

nodes_app = typer.Typer(
    help="The cluster's nodes (GPU machines with a node agent).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

NODE_STYLES = {"READY": "bold green", "LOST": "bold red"}

SUMMARY_WIDTH = 100
"""Columns ``shockwave cluster`` fills where its output is no terminal and ``COLUMNS`` is unset.
The list commands widen such output to keep every row on one line for scripts; the cluster's
summary is read by people, in a terminal-sized window even when captured."""


def summary_width() -> int:
    """The terminal's width; where the output is no terminal, ``COLUMNS`` or
    :data:`SUMMARY_WIDTH`."""
    if console.is_terminal:
        return console.size.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else SUMMARY_WIDTH


@nodes_app.command("ls")
def nodes_command(
    state: Annotated[
        str | None, typer.Option(help="Only nodes in this state (READY, LOST).")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Every node: id, state, GPUs, GPU type and last heartbeat (users see id, GPUs, state)."""
    with api_client(api_url, token) as client:
        nodes = client.nodes(state.upper() if state else None)
    if output is not OutputFormat.TABLE:
        print_document(console, {"items": nodes}, output)
        return
    table = Table(title=f"{len(nodes)} node(s)", title_justify="left")
    for column in ("id", "state", "gpus", "gpu type", "last heartbeat"):
        table.add_column(column, no_wrap=column != "id")
    for node in nodes:
        state_name = str(node.get("state", ""))
        table.add_row(
            str(node.get("id", "")),
            Text(state_name, style=NODE_STYLES.get(state_name, "")),
            str(node.get("gpus", "")),
            str(node.get("gpu_type", "-")) or "-",
            short_time(node.get("last_heartbeat_at")) or "-",
        )
    console.print(table)


def cluster_command(
    api_url: ApiUrl = DEFAULT_API_URL,
    token: Token = None,
    output: Output = OutputFormat.TABLE,
) -> None:
    """The cluster at a glance: GPUs (all and READY), nodes and jobs by state, the current
    round and its plan, and the queue with why each job waits."""
    with api_client(api_url, token) as client:
        summary = client.cluster()
        schedule = client.schedule()
        try:
            queue = client.queue()
        except ApiError as error:  # agents see the cluster but not the queue
            if error.status != 403:
                raise
            queue = []
    if output is not OutputFormat.TABLE:
        print_document(console, {"cluster": summary, "schedule": schedule, "queue": queue}, output)
        return
    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column("field", style="bold", no_wrap=True)
    facts.add_column("value", overflow="fold")
    facts.add_row("GPUs", f"{summary['ready_gpus']} READY of {summary['total_gpus']}")
    if summary.get("nodes") is not None:
        facts.add_row("nodes", _counts(summary["nodes"]))
    facts.add_row("jobs", _counts(summary["jobs"]) + _tenant(summary))
    facts.add_row("round", _round(schedule))
    width = summary_width()
    console.print(facts, width=width)
    if queue:
        table = Table(title="Queue", title_justify="left")
        for column in ("id", "name", "state", "gpus", "ftf", "why"):
            table.add_column(column, overflow="fold", no_wrap=column in ("id", "state", "gpus"))
        for entry in queue:
            table.add_row(
                str(entry["job_id"])[:SHORT_ID],
                str(entry["name"]),
                str(entry["state"]),
                str(entry["gpus"]),
                "-" if entry["ftf_estimate"] is None else f"{float(entry['ftf_estimate']):.2f}",
                str(entry["reason"]),
            )
        console.print(table, width=width)


def _counts(counts: dict[str, Any]) -> str:
    shown = [f"{n} {state}" for state, n in counts.items() if n]
    return ", ".join(shown) or "none"


def _tenant(summary: dict[str, Any]) -> str:
    return f" (tenant {summary['tenant']})" if summary.get("tenant") else ""


def _round(schedule: dict[str, Any]) -> str:
    if schedule.get("round") is None:
        return str(schedule.get("reason", "no round yet"))
    plan = schedule.get("plan") or {}
    running = plan.get("running_jobs", len(plan.get("jobs", [])))
    return f"{schedule['round']} ({plan.get('source', '?')}): {running} job(s) hold GPUs"
