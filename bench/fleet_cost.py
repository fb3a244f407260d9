"""Fleet cost: the simulated agents' own CPU (``shockwave_fleet``), against a stub server.

Usage::

    python -m bench.fleet_cost [--nodes 1024] [--gpus-per-node 8] [--seconds 60]
        [--round-seconds 30] [--wait-seconds 10] [--changed 0.3] [--port P] [--json OUT]

Why: ``bench/scale.py`` runs its fleet in the process that measures the service, on the same
cores; whatever the fleet spends is taken from the servers it measures. This bench runs the
same :class:`shockwave_fleet.fleet.Fleet` (the protocol of ``bench/scale.py`` from 256 nodes:
long polls, a heartbeat every 3 s, events batched in the node's polls, each job's progress
once a round) against a stub of the agent API in a process of its own that answers from
memory, so the fleet's CPU is measured alone and reproducibly, without Postgres or the API.

The stub: every node holds ``--gpus-per-node`` one-GPU leases; a round lasts
``--round-seconds`` from the stub's start; at each round a ``--changed`` share of the nodes
(a hash of the node and the round) get new attempts of other jobs, the rest keep theirs
(extended). A long poll is held while nothing is new for its node (as the API's
:func:`api.agent.has_news` decides) up to its ``wait_s``, and a new round wakes it at once.
Reports and events are answered as accepted.

It prints and writes (``--json``) the fleet process's CPU seconds over the measured window
(after every node registered), per node-minute, the requests by kind, the long polls by why
each was answered, and for each round every node saw, how far apart the first and the last
node saw it (``round_seen_spread_s``: the stub answers every held poll at once, so what
spreads them is the fleet's own lag).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shockwave.domain.model import Regime
from shockwave_cli.runtime.supervision import answers, free_port, wait_until
from shockwave_fleet.fleet import Fleet, TrainingJob

HOST = "127.0.0.1"
EPOCH_S = 5.0
"""Each stub job's epoch (wall seconds): progress to report every round, never finished."""
JOB_EPOCHS = 100_000


def job_id(node: str, gpu: int, stint: int) -> str:
    """The job a node's GPU runs in a stint: two jobs a GPU, taking turns."""
    return f"job-{node}-{gpu}-{stint % 2}"


def last_change(node: str, round_index: int, changed: float) -> int:
    """The latest round up to ``round_index`` at which ``node``'s leases changed (0: the first
    round issues them)."""
    for r in range(round_index, 0, -1):
        if zlib.crc32(f"{node}/{r}".encode()) / 2**32 < changed:
            return r
    return 0


class Stub:
    """The agent API's answers from memory (module docstring)."""

    def __init__(self, gpus: int, round_s: float, changed: float) -> None:
        self.gpus = gpus
        self.round_s = round_s
        self.changed = changed
        self.began = time.time()

    def round_now(self) -> int:
        return int((time.time() - self.began) // self.round_s)

    def ends(self, round_index: int) -> float:
        return self.began + (round_index + 1) * self.round_s

    def answer(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.round_now()
        stint = last_change(node, r, self.changed)
        ends_at = datetime.fromtimestamp(self.ends(r), UTC).isoformat()
        began_at = datetime.fromtimestamp(self.ends(stint - 1), UTC).isoformat()
        running = set(body.get("running", []))
        leases = []
        for gpu in range(self.gpus):
            attempt = f"{node}-{gpu}-{stint}"
            job = job_id(node, gpu, stint)
            leases.append(
                {
                    "attempt_id": attempt,
                    "job_id": job,
                    "node": node,
                    "round_index": r,
                    "gpus": [gpu],
                    "ends_at": ends_at,
                    "began_at": began_at,
                    "state": "RUNNING" if attempt in running else "ISSUED",
                    "batch_size": 32,
                    "checkpoint_dir": f"checkpoints/{job}",
                    "env": {
                        "CUDA_VISIBLE_DEVICES": str(gpu),
                        "SHOCKWAVE_JOB_ID": job,
                        "SHOCKWAVE_ATTEMPT_ID": attempt,
                        "SHOCKWAVE_BATCH_SIZE": "32",
                        "SHOCKWAVE_CHECKPOINT_DIR": f"checkpoints/{job}",
                    },
                    "command": ["python", "train.py"],
                    "image": None,
                }
            )
        live = {lease["attempt_id"] for lease in leases}
        tokens = {a: f"token-{a}" for a in live if a not in running}
        return {
            "node": node,
            "current_round": r,
            "round_ends_at": ends_at,
            "leases": leases,
            "stop": sorted(running - live),
            "node_state": "READY",
            "state_version": r,
            "reports": [
                {"attempt_id": rep["attempt_id"], "status": 200, "stop": False}
                for rep in body.get("reports", [])
            ],
            "events": [
                {"attempt_id": e["attempt_id"], "seq": e["seq"], "status": 201}
                for e in body.get("events", [])
            ],
            "tokens": tokens,
        }

    @staticmethod
    def news(answer: dict[str, Any], body: dict[str, Any]) -> bool:
        running = set(body.get("running", []))
        return (
            answer["current_round"] != body.get("seen_round")
            or any(lease["attempt_id"] not in running for lease in answer["leases"])
            or any(a in running for a in answer["stop"])
        )

    async def poll(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.answer(node, body)
        wait_s = float(body.get("wait_s", 0.0))
        if wait_s <= 0 or self.news(answer, body):
            return answer
        deadline = time.time() + wait_s
        while (left := deadline - time.time()) > 0:
            await asyncio.sleep(min(left, self.ends(answer["current_round"]) - time.time()))
            fresh = self.answer(node, {**body, "reports": [], "events": []})
            if self.news(fresh, body):
                return {**fresh, "reports": answer["reports"], "events": answer["events"]}
        return answer

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw) if raw else {}
                node = headers.get("authorization", "").removeprefix("Bearer ")
                if path == "/readyz":
                    answer: Any = {"ok": True}
                elif path == "/v1/agent/register":
                    answer = {"id": node, "gpus": self.gpus, "gpu_type": "v100"}
                else:
                    answer = await self.poll(node, body)
                data = json.dumps(answer).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(self, port: int) -> None:
        server = await asyncio.start_server(self.handle, HOST, port, backlog=4096)
        async with server:
            await server.serve_forever()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured, after register")
    parser.add_argument("--round-seconds", type=float, default=30.0)
    parser.add_argument("--wait-seconds", type=float, default=10.0)
    parser.add_argument("--changed", type=float, default=0.3, help="share of nodes a round moves")
    parser.add_argument("--port", type=int, default=None, help="the stub's (default: any free)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1 or args.seconds <= 0:
        parser.error("--nodes, --gpus-per-node and --seconds must be positive")
    if not 0 <= args.changed <= 1:
        parser.error("--changed must be between 0 and 1")
    return args


def training_jobs(nodes: Sequence[str], gpus: int) -> dict[str, TrainingJob]:
    jobs = {}
    for node in nodes:
        for gpu in range(gpus):
            for turn in (0, 1):
                job = job_id(node, gpu, turn)
                jobs[job] = TrainingJob(job, 1000, (Regime(32, JOB_EPOCHS),), {32: EPOCH_S})
    return jobs


async def measure(fleet: Fleet, seconds: float) -> dict[str, Any]:
    stop = asyncio.Event()
    running = asyncio.create_task(fleet.run(stop))
    while len(fleet.registered) < len(fleet.nodes) and not running.done():
        await asyncio.sleep(0.2)
    counts = {kind: len(xs) for kind, xs in fleet.log.latency.items()}
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    requests = {k: len(xs) - counts.get(k, 0) for k, xs in fleet.log.latency.items()}
    stop.set()
    await asyncio.wait_for(running, 30.0)
    spreads = []
    for seen in fleet.log.round_seen.values():
        if len(seen) == len(fleet.nodes):
            spreads.append(max(seen.values()) - min(seen.values()))
    return {
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 1),
        "requests": requests,
        "long_polls": dict(fleet.log.long_polls),
        "round_seen_spread_s": [round(s, 2) for s in spreads],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    port = args.port or free_port()
    stub = subprocess.Popen(
        [sys.executable, "-m", "bench.fleet_cost", "--serve", "--port", str(port),
         "--gpus-per-node", str(args.gpus_per_node), "--round-seconds",
         str(args.round_seconds), "--changed", str(args.changed)],
    )  # fmt: skip
    try:
        ready = f"http://{HOST}:{port}/readyz"
        wait_until(lambda: stub.poll() is None and answers(ready), 30.0, f"the stub at {ready}")
        nodes = [f"node-{i:04d}" for i in range(args.nodes)]
        fleet = Fleet(
            [f"http://{HOST}:{port}"],
            {n: (n, args.gpus_per_node) for n in nodes},
            training_jobs(nodes, args.gpus_per_node),
            poll_s=1.0,
            heartbeat_s=3.0,
            wait_s=args.wait_seconds or None,
            boundary_retry_s=0.05 if args.wait_seconds else None,
            batch_events=True,
            report_s=args.round_seconds,
        )
        figures = asyncio.run(measure(fleet, args.seconds))
    finally:
        stub.terminate()
        stub.wait(10.0)
    node_minutes = args.nodes * figures["wall_s"] / 60
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "round_seconds": args.round_seconds,
        "wait_seconds": args.wait_seconds,
        "changed": args.changed,
        **figures,
        "cpu_ms_per_node_minute": round(1000 * figures["cpu_s"] / node_minutes, 2),
        "core_share": round(figures["cpu_s"] / figures["wall_s"], 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        stub = Stub(args.gpus_per_node, args.round_seconds, args.changed)
        asyncio.run(stub.serve(args.port))
        return 0
    record = run(args)
    print(json.dumps(record))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
