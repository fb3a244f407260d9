"""Time from submit to start: how long a job waits for GPUs that are (or become) free.

Usage::

    python -m bench.submit_start [--repeats 5] [--round-seconds 120] [--json out.json]

It starts ``shockwave up`` (embedded, a SQLite file, rounds of ``--round-seconds``) and one
``shockwave agent`` with two GPU slots (process runtime), waits until the node is READY and a
round is under way, and then measures, ``--repeats`` times each:

- **idle**: a 1-GPU job submitted to an idle cluster: seconds from ``POST /v1/jobs`` until
  ``GET /v1/jobs/{id}`` says RUNNING (the agent started its process and said so).
- **busy**: both slots taken by jobs that run ``BUSY_JOB_S`` seconds, a third job submitted
  behind them: seconds from its submit to RUNNING, and from the first busy job's exit
  (SUCCEEDED) to the waiting job's start, which work conservation makes a matter of seconds
  instead of the rest of the round.

Rounds are long (120 s by default) on purpose: a start within seconds comes from the mid-round
fill (``solver_service.leases.fill_round``), not from a boundary. The figures are wall times on
this machine; median and max over the repeats are printed. ``measure`` is what the end-to-end
test (``tests/e2e/test_submit_start.py``) asserts on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.deployment import ROOT, base_env
from shockwave_cli.runtime.supervision import Supervisor, free_port, wait_until

NOWHERE_ENV = base_env("postgresql+psycopg://nobody@127.0.0.1:1/none", "redis://127.0.0.1:1/0")
BUSY_JOB_S = 3.0
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: ``kind`` idle or busy; ``submit_to_start_s``; for busy, also
    ``free_to_start_s`` (from the busy job's exit to the waiting job's start)."""

    kind: str
    submit_to_start_s: float
    free_to_start_s: float | None = None


class Cluster:
    """An embedded service with one agent of two slots, for measuring starts."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base, timeout=10)

    def submit(self, seconds: float) -> str:
        body = {
            "gpus": 1,
            "epochs": 1,
            "samples_per_epoch": 1000,
            "initial_batch_size": 32,
            "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        }
        response = self.http.post("/v1/jobs", json=body)
        response.raise_for_status()
        job_id: str = response.json()["id"]
        return job_id

    def state(self, job_id: str) -> str:
        response = self.http.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        state: str = response.json()["state"]
        return state

    def wait_state(self, job_id: str, states: set[str], timeout_s: float) -> float:
        """Poll until the job is in one of ``states``; the monotonic time it was seen there."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.state(job_id) in states:
                return time.monotonic()
            time.sleep(POLL_S)
        raise TimeoutError(f"job {job_id} not {sorted(states)} within {timeout_s} s")

    def idle_start(self, timeout_s: float) -> Sample:
        began = time.monotonic()
        job = self.submit(1.0)
        started = self.wait_state(job, {"RUNNING", "SUCCEEDED"}, timeout_s)
        self.wait_state(job, {"SUCCEEDED"}, timeout_s + 10)
        return Sample("idle", started - began)

    def busy_start(self, timeout_s: float) -> Sample:
        first = self.submit(BUSY_JOB_S)
        second = self.submit(BUSY_JOB_S + 2.0)
        for job in (first, second):
            self.wait_state(job, {"RUNNING"}, timeout_s)
        began = time.monotonic()
        waiting = self.submit(1.0)
        freed = self.wait_state(first, {"SUCCEEDED"}, BUSY_JOB_S + timeout_s)
        assert self.state(waiting) == "PENDING", "the third job started before a slot freed"
        started = self.wait_state(waiting, {"RUNNING", "SUCCEEDED"}, timeout_s)
        for job in (second, waiting):
            self.wait_state(job, {"SUCCEEDED"}, BUSY_JOB_S + timeout_s + 10)
        return Sample("busy", started - began, started - freed)


@contextmanager
def embedded_cluster(work: Path, round_seconds: float) -> Iterator[Cluster]:
    """``shockwave up`` on a SQLite file in ``work`` and one agent with two slots, ready (the
    node READY and the first round out); stopped at the end."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with Supervisor(work, NOWHERE_ENV, cwd=ROOT) as processes:
        up = processes.shockwave(
            "up",
            "up",
            "--port",
            str(port),
            "--db",
            str(work / "shockwave.db"),
            "--round-seconds",
            str(round_seconds),
        )
        wait_until(
            lambda: "Shockwave is up" in up.log_tail(),
            60,
            lambda: f"shockwave up:\n{up.log_tail()}",
        )
        agent_dir = work / "agent"
        agent_dir.mkdir(exist_ok=True)
        processes.shockwave(
            "agent",
            "agent",
            "--api",
            base,
            "--gpus",
            "2",
            "--runtime",
            "process",
            "--node-name",
            "bench-node",
            "--work-dir",
            str(agent_dir),
            "--poll-interval",
            "0.2",
            "--job-uids",  # its jobs run this interpreter, which another uid may not reach
            "off",
            "--log-level",
            "warning",
        )
        cluster = Cluster(base)

        def ready() -> bool:
            nodes = cluster.http.get("/v1/cluster").json()
            return int(nodes.get("ready_gpus", 0)) == 2

        wait_until(ready, 60, lambda: f"the agent's node to be READY:\n{processes.logs()}")
        time.sleep(1.0)  # the registration's fill found nothing to start: the cluster is idle
        try:
            yield cluster
        finally:
            cluster.http.close()


def measure(work: Path, repeats: int, round_seconds: float, timeout_s: float) -> list[Sample]:
    """``repeats`` idle starts, then ``repeats`` busy ones, on one embedded cluster."""
    with embedded_cluster(work, round_seconds) as cluster:
        samples = [cluster.idle_start(timeout_s) for _ in range(repeats)]
        samples += [cluster.busy_start(timeout_s) for _ in range(repeats)]
    return samples


def summary(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """Median and max per kind and figure."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("idle", "busy"):
        chosen = [s for s in samples if s.kind == kind]
        figures = {"submit_to_start_s": [s.submit_to_start_s for s in chosen]}
        frees = [s.free_to_start_s for s in chosen if s.free_to_start_s is not None]
        if frees:
            figures["free_to_start_s"] = frees
        for name, values in figures.items():
            if values:
                out[f"{kind} {name}"] = {
                    "median": statistics.median(values),
                    "max": max(values),
                    "n": float(len(values)),
                }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="per start (s)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="submit-start-") as tmp:
        samples = measure(Path(tmp), args.repeats, args.round_seconds, args.timeout)
    figures = summary(samples)
    print(f"submit to start, rounds of {args.round_seconds:g} s, {args.repeats} repeats")
    for name, values in figures.items():
        print(f"  {name:28} median {values['median']:6.2f} s   max {values['max']:6.2f} s")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"samples": [asdict(s) for s in samples], "summary": figures}, indent=2)
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
