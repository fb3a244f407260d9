"""The chaos run's summary: a table of faults by kind, counts and violations by kind."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bench.chaos.faults import KINDS
from bench.chaos.invariants import Findings
from bench.chaos.run import Result

CHECKS = (
    "job_not_once",
    "event_not_once",
    "gpu_double_leased",
    "job_ran_twice",
    "lease_round_mismatch",
    "unfinished",
    "bad_state_chain",
    "lost_progress",
    "round_gap",
    "planning_stalled",
    "unexpected_exit",
    "unexpected_answer",
)
"""Every kind of violation :mod:`bench.chaos.invariants` and the run report (listed even at 0)."""


def render(result: Result, console: Console) -> None:
    faults = result.faults_by_kind()
    table = Table(title=f"chaos run: seed {result.config['seed']}, {result.run_s:.0f}s")
    table.add_column("what")
    table.add_column("count", justify="right")
    targets = result.faults_by_target()
    for kind in KINDS:
        table.add_row(f"fault: {kind}", str(faults.get(kind, 0)))
        if kind == "postgres":
            for how in ("pg-restart", "pg-crash"):
                table.add_row(f"  of which {how}", str(targets.get(how, 0)))
    table.add_row("faults: total", str(len(result.faults)), end_section=True)
    for name, value in result.findings.counts.items():
        table.add_row(name.replace("_", " "), str(value))
    table.add_row("max gap between rounds (s)", f"{result.findings.max_round_gap_s:.1f}")
    table.add_row("client retries (admin client)", str(result.client_retries), end_section=True)
    for kind in _kinds(result.findings):
        count = len(result.findings.violations.get(kind, []))
        table.add_row(f"violations: {kind}", f"[red]{count}[/]" if count else "0")
    console.print(table)
    for kind, details in result.findings.violations.items():
        for detail in details[:5]:
            console.print(f"[red]{kind}[/]: {detail}", markup=True, highlight=False)
    verdict = "[green]OK[/]" if result.ok else f"[red]{result.findings.total} violations[/]"
    console.print(f"{verdict}; logs in {result.log_dir}")


def _kinds(findings: Findings) -> list[str]:
    return [*CHECKS, *(k for k in findings.violations if k not in CHECKS)]
