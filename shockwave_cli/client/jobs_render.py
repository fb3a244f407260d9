"""How the ``shockwave jobs`` commands show what the API returns: rich tables for people,
JSON or YAML for scripts (the API's own fields, unchanged)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shockwave.domain.lifecycle import JobState

STATE_STYLES: dict[str, str] = {
    JobState.PENDING: "yellow",
    JobState.RUNNING: "bold green",
    JobState.SUSPENDED: "magenta",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
}


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def dump(document: Any, output: OutputFormat, *, compact: bool = False) -> str:
    """``document`` as JSON (indented, or one line when ``compact``) or as a YAML document."""
    if output is OutputFormat.YAML:
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
        return f"---\n{text}" if compact else text.rstrip("\n")
    if compact:
        return json.dumps(document, separators=(",", ":"))
    return json.dumps(document, indent=2)


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def user_text(value: object, style: str = "") -> Text:
    """What a user or a job wrote (names, models, commands, reasons) as inert text: never
    read as rich markup, and each control character shown escaped (``\\x1b``), so printed text
    cannot move the cursor, recolour or clear the terminal."""
    return Text(CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value)), style=style)


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def short_time(stamp: str | None) -> str:
    """An ISO timestamp from the API as local ``YYYY-MM-DD HH:MM:SS``."""
    if not stamp:
        return ""
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if moment.tzinfo is not None:
        moment = moment.astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _progress(job: Mapping[str, Any]) -> str:
    done = float(job.get("epochs_done", 0.0))
    return f"{done:g}/{job.get('epochs', '?')}"


SHORT_ID = 8
"""Characters of a job id the compact table shows (any unique start of an id is accepted)."""


def jobs_table(
    jobs: Sequence[Mapping[str, Any]], title: str | None = None, *, wide: bool = False
) -> Table:
    """One row per job. Compact (about 80 columns): short id, name, state, GPUs, batch size,
    epochs. ``wide``: the full id, tenant, mode and creation time too."""
    table = Table(title=title, title_justify="left", caption_justify="left")
    table.add_column("id", no_wrap=True, style="cyan", min_width=36 if wide else SHORT_ID)
    table.add_column("name", overflow="fold", min_width=8)
    if wide:
        table.add_column("tenant", overflow="fold", min_width=6)
    table.add_column("state", no_wrap=True, min_width=9)
    table.add_column("gpus", justify="right", no_wrap=True)
    if wide:
        table.add_column("mode", no_wrap=True)
    table.add_column("batch", justify="right", no_wrap=True)
    table.add_column("epochs", justify="right", no_wrap=True)
    if wide:
        table.add_column("created", no_wrap=True)
    for job in jobs:
        ident = str(job.get("id", ""))
        cells: list[str | Text] = [
            user_text(ident if wide else ident[:SHORT_ID]),
            user_text(job.get("name", "")),
        ]
        if wide:
            cells.append(user_text(job.get("tenant", "")))
        cells += [state_text(str(job.get("state", ""))), str(job.get("gpus", ""))]
        if wide:
            cells.append(user_text(job.get("mode", "")))
        cells += [str(job.get("batch_size", "")), _progress(job)]
        if wide:
            cells.append(short_time(job.get("created_at")))
        table.add_row(*cells)
    return table


def job_detail(job: Mapping[str, Any]) -> Table:
    """Every field of one job, one per line."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in job.items():
        if key == "state":
            table.add_row(key, state_text(str(value)))
        elif key in ("created_at", "updated_at"):
            table.add_row(key, short_time(value))
        elif isinstance(value, dict | list):
            table.add_row(key, user_text(json.dumps(value)) if value else "-")
        else:
            table.add_row(key, user_text(value))
    return table


def events_table(events: Sequence[Mapping[str, Any]], title: str | None = None) -> Table:
    """One row per event: time, kind, client sequence number, reason, payload."""
    table = Table(title=title, title_justify="left")
    table.add_column("time", no_wrap=True)
    table.add_column("kind")
    table.add_column("seq", justify="right")
    table.add_column("reason", overflow="fold")
    table.add_column("payload", overflow="fold")
    for event in events:
        seq = event.get("seq")
        payload = event.get("payload")
        table.add_row(
            short_time(event.get("created_at")),
            user_text(event.get("kind", "")),
            "" if seq is None else str(seq),
            user_text(event.get("reason", "")),
            user_text(json.dumps(payload, separators=(", ", ": ")) if payload else ""),
        )
    return table


def state_summary(jobs: Sequence[Mapping[str, Any]]) -> str:
    """``"2 RUNNING, 5 PENDING"``: counts by state, in state-machine order."""
    counts = Counter(str(job.get("state", "")) for job in jobs)
    order = [s for s in STATE_STYLES if counts[s]] + sorted(set(counts) - set(STATE_STYLES))
    return ", ".join(f"{counts[s]} {s}" for s in order) or "no jobs"


def print_document(console: Console, document: Any, output: OutputFormat) -> None:
    """JSON or YAML to stdout, unwrapped and without markup."""
    console.file.write(dump(document, output) + "\n")
    console.file.flush()


def why_text(prediction: Mapping[str, Any], preemption: Mapping[str, Any] | None) -> Table:
    """``shockwave jobs why``: the cause in words first, then the figures behind it."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("why", Text(str(prediction.get("reason", "")), style="bold"))
    table.add_row("cause", str(prediction.get("cause", "")))
    table.add_row("state", state_text(str(prediction.get("state", ""))))
    rounds = prediction.get("planned_rounds") or []
    table.add_row("planned rounds", ", ".join(map(str, rounds)) if rounds else "-")
    table.add_row("FTF estimate", f"{float(prediction.get('ftf_estimate', 0.0)):.2f}")
    table.add_row("remaining (alone)", f"{float(prediction.get('remaining_seconds', 0.0)):.0f} s")
    progress = f"{float(prediction.get('epochs_done', 0.0)):g}/{prediction.get('epochs', '?')}"
    table.add_row("epochs", f"{progress} at batch size {prediction.get('batch_size', '?')}")
    if preemption is not None:
        when = short_time(preemption.get("created_at"))
        table.add_row("last preemption", f"{when}: {preemption.get('reason', '')}")
    return table


def event_line(event: Mapping[str, Any]) -> Text:
    """One stream event for people: time, job, what happened, why."""
    when = short_time(event.get("created_at"))
    job = f"{str(event.get('job_id', ''))[:SHORT_ID]} {event.get('name', '')}"
    if event.get("kind") == "preemption":
        what = Text("preempted", style="magenta")
    else:
        what = Text(f"{event.get('from') or 'new'} -> ", style="dim")
        what.append(state_text(str(event.get("to", ""))))
    line = Text(f"{when}  {job}  ")
    line.append(what)
    reason = str(event.get("reason", ""))
    if reason:
        line.append(f"  ({reason})", style="dim")
    return line
