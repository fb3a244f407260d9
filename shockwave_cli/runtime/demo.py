"""``shockwave up --demo``: the embedded service with local node agents and a small workload of
real training jobs, shown in a live table until every job is done.

:class:`Demo` starts ``agents`` ``shockwave agent`` processes (``slots`` GPUs each, declared
slots where there is no NVIDIA GPU; process runtime; nodes ``demo-1``, ``demo-2``, ...) against
the embedded API in open mode, submits :data:`DEMO_JOBS` (``examples/numpy_linear.py`` with GNS,
Accordion and a static batch size, each step paced so that an epoch lasts a second or two) and
renders, every second, each job's state, epochs, batch sizes, node, attempts and last loss, with
a feed of what just happened (started, preempted, rescaled, finished). The agents share one
checkpoint directory (each agent's ``checkpoints`` links to it), so a job resumes from its
checkpoint on whichever agent it lands.

Everything lives in ``work_dir``: the agents' work directories and logs, the jobs' checkpoints
and loss curves (``checkpoints/<job id>/loss.jsonl``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from shockwave.domain.lifecycle import LIVE_LEASES, STARTED_LEASES, TERMINAL, JobState, LeaseState
from shockwave_cli.runtime.supervision import Supervisor, stop_together
from store.tables import ClusterRow, JobEventRow, JobRow, LeaseRow

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "numpy_linear.py"
RAN = (*STARTED_LEASES, LeaseState.LOST)
"""Attempts counted as tries: started (or lost, maybe while starting)."""
AGENT_GRACE_S = 5.0
FEED_LINES = 8
STATE_STYLE: dict[str, str] = {
    JobState.PENDING: "yellow",
    JobState.RUNNING: "bold green",
    JobState.SUSPENDED: "magenta",
    JobState.SUCCEEDED: "blue",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "red",
}
FEED_WORDS: dict[str, str] = {
    JobState.PENDING: "queued",
    JobState.RUNNING: "running",
    JobState.SUSPENDED: "preempted (checkpointed)",
    JobState.SUCCEEDED: "finished",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
}
"""How the feed says that a job entered a state."""


class DemoError(RuntimeError):
    """The demo cannot start (the example program is missing, a job was refused)."""


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One job of the workload: ``examples/numpy_linear.py`` in ``mode`` over ``ladder``."""

    name: str
    mode: str
    epochs: int
    samples: int
    ladder: tuple[int, ...]
    seed: int
    arrival_round: int = 0
    """Submitted this many rounds after the demo starts (late arrivals preempt)."""
    step_seconds: float = 0.02

    def body(self, python: str = sys.executable) -> dict[str, Any]:
        """The job's ``POST /v1/jobs`` body."""
        return {
            "name": self.name,
            "gpus": 1,
            "epochs": self.epochs,
            "samples_per_epoch": self.samples,
            "initial_batch_size": self.ladder[0],
            "mode": self.mode,
            "batch_sizes": list(self.ladder),
            "model": "logistic-regression",
            "command": [
                python,
                str(EXAMPLE),
                "--min-step-seconds",
                str(self.step_seconds),
                "--seed",
                str(self.seed),
            ],
        }


DEMO_JOBS: tuple[DemoJob, ...] = (
    DemoJob("gns-a", "gns", 10, 8192, (16, 32, 64, 128), seed=1),
    DemoJob("acc-a", "accordion", 10, 8192, (16, 128), seed=2),
    DemoJob("static", "static", 6, 8192, (32,), seed=3),
    DemoJob("gns-b", "gns", 10, 8192, (16, 32, 64, 128), seed=4),
    DemoJob("gns-late", "gns", 8, 8192, (16, 32, 64, 128), seed=5, arrival_round=4),
    DemoJob("acc-late", "accordion", 8, 8192, (16, 128), seed=6, arrival_round=7),
)
"""About 20 to 30 seconds of work each on one slot (8192 samples an epoch, 20 ms a step: 10 s
an epoch at batch size 16, 1.3 s at 128), two of them arriving later; on two slots the workload
takes about two minutes with rounds of 4 s."""


@dataclass
class JobView:
    """What the table shows of one job."""

    id: str
    name: str
    mode: str
    state: str
    epochs: int
    epochs_done: float
    batch_size: int
    sizes: list[int]
    node: str = ""
    attempts: int = 0
    preempted: int = 0
    loss: float | None = None


@dataclass
class Snapshot:
    round_index: int
    jobs: list[JobView]
    feed: list[str]


@dataclass
class Demo:
    """Local agents and the demo workload against the embedded API at ``api_url``; reads what
    it shows from ``engine`` (the embedded service's own)."""

    api_url: str
    engine: Engine
    work_dir: Path
    agents: int = 1
    slots: int = 2
    jobs: Sequence[DemoJob] = DEMO_JOBS
    console: Console = field(default_factory=Console)
    job_ids: dict[str, str] = field(default_factory=dict)
    """job id -> name"""
    round_seconds: float = 4.0
    error: str | None = None
    started_at: float = 0.0
    _agents: Supervisor = field(init=False)
    _seen_events: int = 0
    _submitted: set[str] = field(default_factory=set)
    _feed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
        self._agents = Supervisor(self.work_dir, env, cwd=ROOT)

    @property
    def checkpoints(self) -> Path:
        return self.work_dir / "checkpoints"

    # --- starting and stopping --------------------------------------------------------------

    def start(self) -> None:
        """Start the agents and submit the workload. :class:`DemoError` if it cannot."""
        if not EXAMPLE.is_file():
            raise DemoError(
                f"the demo runs {EXAMPLE}, which is missing: run it from a checkout of the "
                "project (installed with `pip install -e .`)"
            )
        self.started_at = time.monotonic()
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        for index in range(1, self.agents + 1):
            self._start_agent(f"demo-{index}")
        self.submit_due()

    def submit_due(self) -> None:
        """Submit the jobs whose arrival time has come and that are not submitted yet."""
        elapsed = time.monotonic() - self.started_at
        due = [
            job
            for job in self.jobs
            if job.name not in self._submitted and job.arrival_round * self.round_seconds <= elapsed
        ]
        if not due:
            return
        with httpx.Client(base_url=self.api_url, timeout=10.0) as client:
            for job in due:
                response = client.post("/v1/jobs", json=job.body())
                if response.status_code != 201:
                    raise DemoError(
                        f"job {job.name} refused: {response.status_code} {response.text}"
                    )
                self.job_ids[response.json()["id"]] = job.name
                self._submitted.add(job.name)

    def _start_agent(self, node: str) -> None:
        work = self.work_dir / node
        work.mkdir(parents=True, exist_ok=True)
        link = work / "checkpoints"
        if not link.exists():
            link.symlink_to(self.checkpoints, target_is_directory=True)
        self._agents.shockwave(
            node,
            "agent",
            "--api",
            self.api_url,
            "--gpus",
            str(self.slots),
            "--runtime",
            "process",
            "--node-name",
            node,
            "--work-dir",
            str(work),
            "--poll-interval",
            "0.5",
            "--heartbeat-interval",
            "2",
            "--grace-seconds",
            str(AGENT_GRACE_S),
            # The demo's jobs are one user's, on this interpreter (which another uid may not
            # reach): they run as that user.
            "--job-uids",
            "off",
            "--log-level",
            "warning",
        )

    def close(self) -> None:
        """Stop the agents together (SIGTERM: each checkpoints and stops its jobs and reports
        them, while the API still answers), then SIGKILL whatever is left. Idempotent."""
        stop_together(self._agents.started, AGENT_GRACE_S + 10.0)

    # --- watching -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Show the table every second until every demo job is done or ``stop`` is set; then
        set ``stop`` (the embedded service shuts down). Records an error instead of raising."""
        try:
            if self.console.is_terminal:
                self._run_live(stop)
            else:
                self._run_plain(stop)
        except Exception as error:  # reported by `shockwave up`, which then exits 1
            log.exception("the demo failed")
            self.error = f"the demo failed: {error}"
        finally:
            stop.set()

    def _run_live(self, stop: threading.Event) -> None:
        with Live(console=self.console, refresh_per_second=4, transient=False) as live:
            while True:
                snapshot = self.snapshot()
                live.update(self.render(snapshot))
                if self.done(snapshot) or stop.wait(1.0):
                    break
        self._summary(self.snapshot())

    def _run_plain(self, stop: threading.Event) -> None:
        """Without a terminal: one line per event, the table at the end."""
        while True:
            before = len(self._feed)
            snapshot = self.snapshot()
            for line in self._feed[before:]:
                self.console.print(line, highlight=False)
            if self.done(snapshot) or stop.wait(1.0):
                break
        self.console.print(self.table(snapshot))
        self._summary(snapshot)

    def done(self, snapshot: Snapshot) -> bool:
        """Every demo job submitted and finished."""
        return len(snapshot.jobs) == len(self.jobs) and all(
            j.state in TERMINAL for j in snapshot.jobs
        )

    def _summary(self, snapshot: Snapshot) -> None:
        elapsed = time.monotonic() - self.started_at
        counts = {s: sum(j.state == s for j in snapshot.jobs) for s in sorted(TERMINAL)}
        states = ", ".join(f"{n} {s.lower()}" for s, n in counts.items() if n) or "none"
        preempted = sum(j.preempted for j in snapshot.jobs)
        rescaled = sum(len(j.sizes) - 1 for j in snapshot.jobs)
        ended = "done" if self.done(snapshot) else "stopped early"
        self.console.print(
            f"Demo {ended}: {sum(counts.values())} of {len(self.jobs)} jobs finished ({states}) "
            f"in {elapsed:.0f} s, {preempted} preemptions, {rescaled} batch-size changes. "
            f"Loss curves: {self.checkpoints}/<job id>/loss.jsonl; logs: {self.work_dir}",
            highlight=False,
        )

    # --- reading the database -------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The demo's jobs, their leases and the events since the last call, read in one
        session from the service's database (late jobs are submitted first, when due)."""
        self.submit_due()
        with Session(self.engine) as session:
            cluster = session.get(ClusterRow, "default")
            rows = session.exec(select(JobRow).where(col(JobRow.id).in_(list(self.job_ids)))).all()
            leases = session.exec(
                select(LeaseRow)
                .where(col(LeaseRow.job_id).in_(list(self.job_ids)))
                .order_by(col(LeaseRow.issued_at))
            ).all()
            events = session.exec(
                select(JobEventRow)
                .where(col(JobEventRow.job_id).in_(list(self.job_ids)))
                .where(col(JobEventRow.kind).in_(("state", "scaling", "preemption")))
                .order_by(col(JobEventRow.id))
            ).all()
        by_job: dict[str, list[LeaseRow]] = defaultdict(list)
        for lease in leases:
            by_job[lease.job_id].append(lease)
        sizes: dict[str, list[int]] = defaultdict(list)
        for event in events:
            if event.kind == "scaling":
                sizes[event.job_id].append(int(event.payload.get("batch_size", 0)))
        views = [self._view(row, by_job[row.id], sizes[row.id]) for row in rows]
        order = {job_id: i for i, job_id in enumerate(self.job_ids)}
        views.sort(key=lambda v: order[v.id])
        for event in events[self._seen_events :]:
            self._feed.append(self._describe(event))
        self._seen_events = len(events)
        return Snapshot(cluster.current_round if cluster else -1, views, self._feed[-FEED_LINES:])

    def _view(self, row: JobRow, leases: list[LeaseRow], scaled: list[int]) -> JobView:
        live = [x for x in leases if x.state in LIVE_LEASES]
        history = [row.initial_batch_size]
        for size in scaled:
            if size != history[-1]:
                history.append(size)
        return JobView(
            id=row.id,
            name=row.name,
            mode=row.mode,
            state=row.state,
            epochs=row.epochs,
            epochs_done=row.epochs_done,
            batch_size=row.batch_size,
            sizes=history,
            node=", ".join(f"{x.node_id}:{','.join(map(str, x.gpus))}" for x in live),
            attempts=sum(x.state in RAN for x in leases),
            preempted=sum(x.state == LeaseState.CHECKPOINTED for x in leases),
            loss=self._last_loss(row.id),
        )

    def _last_loss(self, job_id: str) -> float | None:
        path = self.checkpoints / job_id / "loss.jsonl"
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "loss" in record:
                return float(record["loss"])
        return None

    def _describe(self, event: JobEventRow) -> str:
        name = self.job_ids.get(event.job_id, event.job_id[:8])
        at = event.created_at.astimezone().strftime("%H:%M:%S") if event.created_at else ""
        if event.kind == "scaling":
            size, epoch = event.payload.get("batch_size"), event.payload.get("epoch")
            return f"{at}  {name}: batch size → {size} from epoch {epoch} (rescaled)"
        if event.kind == "preemption":
            return f"{at}  {name}: asked to checkpoint and stop: {_short(event.reason)}"
        target = str(event.payload.get("to", ""))
        what = FEED_WORDS.get(target, target.lower())
        return f"{at}  {name}: {what} ({_short(event.reason)})"

    # --- drawing --------------------------------------------------------------------------------

    def render(self, snapshot: Snapshot) -> Group:
        elapsed = time.monotonic() - self.started_at
        done = sum(j.state in TERMINAL for j in snapshot.jobs)
        header = Text.assemble(
            ("Shockwave demo", "bold"),
            f"  round {max(snapshot.round_index, 0)}  ·  {elapsed:.0f} s  ·  "
            f"{self.agents} x {self.slots} slots  ·  {done}/{len(self.jobs)} done  ·  Ctrl-C stops",
        )
        feed = Text("\n".join(snapshot.feed) or "waiting for the first round ...", style="dim")
        return Group(header, self.table(snapshot), feed)

    def table(self, snapshot: Snapshot) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for column, justify in (
            ("job", "left"),
            ("state", "left"),
            ("epochs", "right"),
            ("batch size", "left"),
            ("node", "left"),
            ("tries", "right"),
            ("preempted", "right"),
            ("loss", "right"),
        ):
            table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for job in snapshot.jobs:
            table.add_row(
                job.name,
                Text(job.state, style=STATE_STYLE.get(job.state, "")),
                f"{job.epochs_done:g}/{job.epochs}",
                "→".join(str(size) for size in job.sizes),
                job.node or "-",
                str(job.attempts),
                str(job.preempted),
                "-" if job.loss is None else f"{job.loss:.4f}",
            )
        return table


def _short(reason: str) -> str:
    """A state event's reason with its uuids cut to 8 characters."""
    words = []
    for word in reason.split():
        if len(word) == 36 and word.count("-") == 4:
            word = word[:8]
        words.append(word)
    return " ".join(words)
