"""Server CPU per request of two copies of the API side by side: before/after on a noisy machine.

Usage::

    python -m bench.request_ab --tree DIR [--blocks 10] [--per-block 50] [--postgres ...]
        [--json OUT]

Why: ``bench.request_cost`` measures one copy at a time, endpoint after endpoint; on a shared
machine the load drifts between two such runs by more than a change of a few tenths of a
millisecond (``GET /healthz``, whose code neither copy changes, varied by 25% between runs).
Here the API of ``--tree`` (the old copy) and this copy's run side by side on one throwaway
database, one node of 8 GPUs with 8 running one-GPU leases, and one client sends blocks of
requests of each kind to one process, then the other (the order alternating block by block),
so both meet the same load; each process's own CPU time (user + system, from /proc) over its
blocks is divided by its requests. Printed: CPU ms per request of each and their ratio.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.api import postgres_database
from bench.load import HOST, api_argv, prepare, service_env, started, wait_ready
from bench.request_cost import GPUS, WARMUP, process_cpu_s, progress_events, run_a_round
from shockwave_cli.runtime.supervision import free_port

COPIES = ("old", "new")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="the old copy of the project")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per kind and copy")
    parser.add_argument("--per-block", type=int, default=50, help="requests per block")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="an existing database to connect to while creating and dropping the bench's own",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.blocks < 1 or args.per_block < 1:
        parser.error("--blocks and --per-block must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    trees: dict[str, Path | None] = {"old": args.tree, "new": None}
    with ExitStack() as stack:
        database_url = stack.enter_context(postgres_database(args.postgres, "shockwave_ab"))
        tokens = prepare(database_url, agents=1)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shockwave-ab-")))
        pids: dict[str, int] = {}
        clients: dict[str, httpx.Client] = {}
        for copy, tree in trees.items():
            # one client sends hundreds of requests a second on one token: no rate limit here
            env = service_env(
                database_url, "redis://127.0.0.1:6379/15", tree, SHOCKWAVE_RATE_LIMIT_PER_S="0"
            )
            port = free_port()
            server = stack.enter_context(
                started(f"api-{copy}", api_argv(port, []), env, logs, tree)
            )
            base = f"http://{HOST}:{port}"
            wait_ready(base, server)
            pids[copy] = server.pid
            clients[copy] = stack.enter_context(httpx.Client(base_url=base, timeout=10.0))
        agent = {"Authorization": f"Bearer {tokens.agents[0][1]}"}
        user = {"Authorization": f"Bearer {tokens.user}"}
        first = clients["new"]
        first.post("/v1/agent/register", json={"gpus": GPUS, "hostname": "h"}, headers=agent)
        job = {
            "name": "cost",
            "gpus": 1,
            "epochs": 100_000,
            "samples_per_epoch": 1000,
            "initial_batch_size": 32,
        }
        for _ in range(GPUS):
            first.post("/v1/jobs", json=job, headers=user).raise_for_status()
        attempts = run_a_round(database_url)
        first.post("/v1/agent/poll", json={"running": attempts}, headers=agent).raise_for_status()
        seq = itertools.count(1)

        def progress() -> list[dict[str, object]]:
            return progress_events(attempts, next(seq))

        kinds: dict[str, Callable[[httpx.Client], httpx.Response]] = {
            "GET /healthz (no database)": lambda c: c.get("/healthz"),
            f"poll, {GPUS} running leases, nothing new": lambda c: c.post(
                "/v1/agent/poll", json={"running": attempts}, headers=agent
            ),
            "the same without a heartbeat (a held poll's re-read)": lambda c: c.post(
                "/v1/agent/poll", json={"running": attempts, "heartbeat": False}, headers=agent
            ),
            f"the same with {GPUS} new progress events": lambda c: c.post(
                "/v1/agent/poll", json={"running": attempts, "events": progress()}, headers=agent
            ),
            "GET /v1/jobs (page of 10)": lambda c: c.get("/v1/jobs?page_size=10", headers=user),
        }
        for send in kinds.values():
            for copy in COPIES:
                for _ in range(WARMUP):
                    send(clients[copy]).raise_for_status()
        cpu = {(kind, copy): 0.0 for kind in kinds for copy in COPIES}
        for block in range(args.blocks):
            order = COPIES if block % 2 == 0 else COPIES[::-1]
            for kind, send in kinds.items():
                for copy in order:
                    before = process_cpu_s(pids[copy])
                    for _ in range(args.per_block):
                        send(clients[copy]).raise_for_status()
                    cpu[(kind, copy)] += process_cpu_s(pids[copy]) - before
    requests = args.blocks * args.per_block
    rows = [
        {
            "endpoint": kind,
            "old_cpu_ms": 1000.0 * cpu[(kind, "old")] / requests,
            "new_cpu_ms": 1000.0 * cpu[(kind, "new")] / requests,
        }
        for kind in kinds
    ]
    print(f"server CPU ms per request, {requests} each, blocks of {args.per_block} interleaved")
    print(f"{'old':>7} {'new':>7} {'new/old':>7}  request")
    for row in rows:
        old, new = row["old_cpu_ms"], row["new_cpu_ms"]
        assert isinstance(old, float) and isinstance(new, float)
        print(f"{old:7.2f} {new:7.2f} {new / old if old else 0.0:7.2f}  {row['endpoint']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"requests": requests, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
