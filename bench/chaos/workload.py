"""The chaos run's workload: a thread that submits jobs and posts scaling events through every
API process in turn while the faults go on, and remembers what the service acknowledged.
A third of the jobs come at once (a backlog the policy must share the GPUs among), the rest in
step with the faults, so that jobs are submitted, placed, moved and finished throughout.

Each submission has an ``Idempotency-Key`` that is also the job's name (unique to the run), and
is retried with that same key until an API process acknowledges it (2xx): however many tries a
fault cost, the invariants then expect exactly one job of that name. Scaling events (the job
asks to keep its batch size: a real event, stored and re-planned for, that leaves the job's
progress as it is) use sequence numbers from :data:`SCALING_SEQ_BASE` on, clear of the agents'
progress events, which use the epoch number.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.client import RoundRobin, Unavailable

SCALING_SEQ_BASE = 1_000_000
SAMPLES_PER_EPOCH = 1000
BATCH_SIZE = 32
GPU_CHOICES = (1, 1, 1, 2, 2, 4)
"""Job widths: nodes have two GPUs, so a 4-GPU job spans two nodes (one attempt on each)."""


@dataclass(frozen=True)
class JobPlan:
    """A job the workload will submit: its name (also its Idempotency-Key), width, length."""

    name: str
    gpus: int
    epochs: int

    def body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpus": self.gpus,
            "epochs": self.epochs,
            "samples_per_epoch": SAMPLES_PER_EPOCH,
            "initial_batch_size": BATCH_SIZE,
        }


def plan_jobs(rng: random.Random, count: int, prefix: str, max_epochs: int) -> list[JobPlan]:
    return [
        JobPlan(f"{prefix}-{i:03d}", rng.choice(GPU_CHOICES), rng.randint(2, max_epochs))
        for i in range(count)
    ]


@dataclass
class Acknowledged:
    """What the service acknowledged: job name -> id, and client events as (job id, seq)."""

    jobs: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, int, str]] = field(default_factory=list)
    """(job id, seq, kind) of every event a 2xx acknowledged."""
    submitted: list[str] = field(default_factory=list)
    """Names of every job submitted at least once (acknowledged or not)."""


BURST_SHARE = 1 / 3
"""The share of the jobs submitted at once at the start: a backlog, so that the policy has
to choose, preempt and move jobs while the faults go on."""
LAST_RELEASE = 0.9
"""The last job is released when this share of the faults is done (it still meets some)."""


class Workload(threading.Thread):
    """Submits ``jobs``: a third at once, the rest released in step with ``progress()`` (the
    share of the faults done, 0 to 1), at least ``gap_s`` apart; posts a scaling event to a
    random acknowledged job every ``scale_every_s`` seconds, until :meth:`finish`."""

    def __init__(
        self,
        client: RoundRobin,
        jobs: list[JobPlan],
        progress: Callable[[], float],
        scale_every_s: float,
        rng: random.Random,
        gap_s: float = 0.5,
    ) -> None:
        super().__init__(name="chaos-workload", daemon=True)
        self.client = client
        self.jobs = jobs
        self.progress = progress
        self.gap_s = gap_s
        self.burst = int(len(jobs) * BURST_SHARE)
        self.scale_every_s = scale_every_s
        self.rng = rng
        self.acked = Acknowledged()
        self.unavailable = 0
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._submitted_all = False

    def finish(self) -> None:
        """Stop posting scaling events (every job is submitted by then) and wait."""
        self._stop_event.set()
        self.join()

    @property
    def submitting(self) -> bool:
        return self.is_alive() and not self._submitted_all

    def run(self) -> None:
        next_scale = time.monotonic() + self.scale_every_s
        scale_seq = SCALING_SEQ_BASE
        for i, job in enumerate(self.jobs):
            while not self._released(i) and not self._stop_event.is_set():
                if time.monotonic() >= next_scale:
                    scale_seq += 1
                    self._scale(scale_seq)
                    next_scale = time.monotonic() + self.scale_every_s
                time.sleep(self.gap_s)
            self._submit(job)
            if i >= self.burst:
                time.sleep(self.gap_s)
        self._submitted_all = True
        while not self._stop_event.wait(self.scale_every_s):
            scale_seq += 1
            self._scale(scale_seq)

    def _released(self, i: int) -> bool:
        """Whether job ``i`` is due: the burst at once, then in step with the faults."""
        later = len(self.jobs) - self.burst
        if i < self.burst or later <= 0:
            return True
        return self.progress() >= LAST_RELEASE * (i - self.burst + 1) / later

    def _submit(self, job: JobPlan) -> None:
        """Retry with the same key until acknowledged (or the run is stopped)."""
        with self._lock:
            self.acked.submitted.append(job.name)
        while not self._stop_event.is_set():
            try:
                response = self.client.call(
                    "POST", "/v1/jobs", json=job.body(), headers={"Idempotency-Key": job.name}
                )
            except Unavailable:
                self.unavailable += 1
                continue
            if response.status_code == 409:  # the same key still in flight elsewhere: again
                time.sleep(0.2)
                continue
            if response.status_code != 201:
                self.errors.append(f"submit {job.name}: {response.status_code} {response.text}")
                return
            with self._lock:
                self.acked.jobs[job.name] = response.json()["id"]
            return

    def _scale(self, seq: int) -> None:
        """A scaling event (same batch size) to a random acknowledged job; a finished job
        answers 409 and the event is simply not acknowledged."""
        with self._lock:
            ids = sorted(self.acked.jobs.values())
        if not ids:
            return
        job_id = self.rng.choice(ids)
        body = {"seq": seq, "kind": "scaling", "batch_size": BATCH_SIZE, "epoch": 0}
        try:
            response = self.client.call(
                "POST",
                f"/v1/jobs/{job_id}/events",
                json=body,
                headers={"Idempotency-Key": f"scaling-{job_id}-{seq}"},
            )
        except Unavailable:
            self.unavailable += 1
            return
        if response.status_code in (200, 201):
            with self._lock:
                self.acked.events.append((job_id, seq, "scaling"))
        elif response.status_code != 409:
            self.errors.append(f"scaling {job_id}: {response.status_code} {response.text}")
