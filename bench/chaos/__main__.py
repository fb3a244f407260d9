"""``python -m bench.chaos``: kill -9 parts of a running deployment while jobs run, then check
that nothing acknowledged was lost or duplicated, no GPU or job was leased twice, every job
finished and rounds kept coming. Exits 1 on any violation.

Usage::

    python -m bench.chaos [--seed 1] [--faults 24] [--duration 180] [--jobs 40]
        [--apis 3] [--nodes 4] [--round-seconds 2] [--max-down 3] [--drain 240]
        [--logs DIR] [--json OUT]

It needs PostgreSQL's server binaries (initdb, pg_ctl) and redis-server installed; it starts
private instances of both on free ports (the shared ones are never touched).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from bench.chaos.report import render
from bench.chaos.run import Config, run


def parse(argv: list[str] | None) -> tuple[Config, Path | None]:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, help="RNG seed (schedule, targets, jobs)"
    )
    parser.add_argument("--faults", type=int, default=defaults.faults, help="faults to inject")
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration_s,
        help="seconds the faults are spread over",
    )
    parser.add_argument("--jobs", type=int, default=defaults.jobs, help="jobs the workload submits")
    parser.add_argument(
        "--max-epochs",
        type=int,
        default=defaults.max_epochs,
        help="longest job (epochs; one per round)",
    )
    parser.add_argument("--apis", type=int, default=defaults.apis, help="API processes (>= 2)")
    parser.add_argument(
        "--nodes", type=int, default=defaults.nodes, help="simulated agents (2 GPUs each)"
    )
    parser.add_argument("--round-seconds", type=float, default=defaults.round_seconds)
    parser.add_argument(
        "--max-down",
        type=float,
        default=defaults.max_down_s,
        help="longest downtime of a killed component (s)",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=defaults.drain_s,
        help="seconds to wait for every job to finish",
    )
    parser.add_argument(
        "--logs", type=Path, default=None, help="directory for the process logs and journals"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.apis < 2:
        parser.error("--apis must be at least 2 (the clients round-robin over them)")
    if args.faults < 1 or args.jobs < 1 or args.nodes < 2:
        parser.error("--faults and --jobs must be positive, --nodes at least 2")
    config = Config(
        seed=args.seed,
        faults=args.faults,
        duration_s=args.duration,
        jobs=args.jobs,
        max_epochs=max(2, args.max_epochs),
        apis=args.apis,
        nodes=args.nodes,
        round_seconds=args.round_seconds,
        max_down_s=args.max_down,
        drain_s=args.drain,
        log_dir=args.logs,
    )
    return config, args.json


def main(argv: list[str] | None = None) -> int:
    config, json_path = parse(argv)
    console = Console()
    result = run(
        config, say=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)
    )
    render(result, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result.as_json(), indent=2) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
