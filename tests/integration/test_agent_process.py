"""``shockwave agent`` as a real process against a real ``shockwave up`` (SQLite, short rounds),
running a stand-in training program (agent_fake_job.py) as the jobs' command.

One scenario, in the order a node lives through it: the agent registers with 2 slots; a job's
process starts with CUDA_VISIBLE_DEVICES and the SHOCKWAVE_* environment and the job becomes
RUNNING; the agent is killed with SIGKILL and started again: it re-attaches to the same process
and starts no second one; the API is frozen (SIGSTOP) for a few seconds within the lease: the
job runs on; a second job runs beside it and is cancelled: its process gets SIGTERM,
checkpoints, and the agent reports ``checkpointed``; the agent is stopped (SIGTERM): the first
job checkpoints and is SUSPENDED, and under a new agent it resumes from that checkpoint. Every
process is killed at the end, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.deployment import ROOT
from shockwave_cli.runtime.supervision import Supervised, free_port, shockwave_argv, wait_until
from tests.job_python import job_python

FAKE_JOB = Path(__file__).with_name("agent_fake_job.py")
ROUND_S = 5.0
OUTAGE_S = 3.0
GRACE_S = 5.0
LEASE_SLACK_S = 2.0
NODE = "n1"


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def create_token(database: Path, role: str, *args: str) -> str:
    done = subprocess.run(
        [*shockwave_argv(), "admin", "create-token", "--role", role, *args],
        env={**clean_env(), "SHOCKWAVE_DATABASE_URL": f"sqlite:///{database}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class Scene:
    """The running service, its tokens, the agent's work directory and the jobs' records."""

    tmp: Path
    base: str
    admin: str
    agent_token: str
    up: Supervised
    work_dir: Path
    out_dir: Path

    def get(self, path: str, token: str | None = None, **params: str) -> Any:
        response = httpx.get(
            f"{self.base}{path}",
            params=params,
            headers={"Authorization": f"Bearer {token or self.admin}"},
            timeout=5,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def submit(self, name: str) -> str:
        body = {
            "name": name,
            "gpus": 1,
            "epochs": 1000,
            "samples_per_epoch": 1000,
            "initial_batch_size": 32,
            "command": [job_python(), str(FAKE_JOB), str(self.out_dir)],
        }
        response = httpx.post(
            f"{self.base}/v1/jobs",
            json=body,
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=5,
        )
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    def post(self, path: str) -> Any:
        response = httpx.post(
            f"{self.base}{path}", headers={"Authorization": f"Bearer {self.admin}"}, timeout=5
        )
        assert response.status_code == 200, response.text
        return response.json()

    def lease_state(self, attempt_id: str) -> str | None:
        """The attempt's lease state, read from the database (no endpoint lists past leases)."""
        uri = f"file:{self.tmp / 'shockwave.db'}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as connection:
            row = connection.execute("SELECT state FROM leases WHERE id = ?", (attempt_id,))
            found = row.fetchone()
        return None if found is None else str(found[0])

    def state(self, job_id: str) -> str:
        state: str = self.get(f"/v1/jobs/{job_id}")["state"]
        return state

    def reasons(self, job_id: str) -> list[str]:
        events = self.get(f"/v1/jobs/{job_id}/events", kind="state")["items"]
        return [event["reason"] for event in events]

    def leases(self) -> dict[str, dict[str, Any]]:
        """The node's live leases by job id."""
        polled = self.get("/v1/agent/leases", node=NODE)["leases"]
        return {lease["job_id"]: lease for lease in polled}

    def records(self, job_id: str) -> list[dict[str, Any]]:
        """What the job's processes recorded: starts and SIGTERMs, in order."""
        path = self.out_dir / f"{job_id}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def starts(self, job_id: str) -> list[dict[str, Any]]:
        return [r for r in self.records(job_id) if r["event"] == "start"]

    def agent(self, name: str) -> Supervised:
        return Supervised(
            cwd=ROOT,
            name=name,
            argv=[
                *shockwave_argv(),
                "agent",
                "--api",
                self.base,
                "--gpus",
                "2",
                "--runtime",
                "process",
                "--work-dir",
                str(self.work_dir),
                "--poll-interval",
                "0.5",
                "--heartbeat-interval",
                "1",
                "--grace-seconds",
                str(GRACE_S),
                "--lease-slack",
                str(LEASE_SLACK_S),
                "--request-timeout",
                "1",
            ],
            env={**clean_env(), "SHOCKWAVE_AGENT_TOKEN": self.agent_token},
            log_path=self.tmp / f"{name}.log",
        ).start()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def fake_job_pids(out_dir: Path) -> list[int]:
    """The running processes of the stand-in training program that write to ``out_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ours = argv[1:3] == [str(FAKE_JOB).encode(), str(out_dir).encode()]
            if ours and alive(int(entry.name)):
                pids.append(int(entry.name))
    return pids


@contextmanager
def scene(tmp_path: Path, jobs_dir: Path) -> Iterator[Scene]:
    """``jobs_dir``: where the agent's work directory and the jobs' records go, a folder every
    uid may pass through (each job runs as a uid of its own)."""
    database = tmp_path / "shockwave.db"
    admin = create_token(database, "admin")
    agent_token = create_token(database, "agent", "--node", NODE, "--gpus", "2")
    port = free_port()
    up = Supervised(
        cwd=ROOT,
        name="up",
        argv=[
            *shockwave_argv(),
            "up",
            "--no-open",
            "--port",
            str(port),
            "--db",
            str(database),
            "--round-seconds",
            str(ROUND_S),
            "--policy",
            "fifo",
            "--log-level",
            "warning",
        ],
        env=clean_env(),
        log_path=tmp_path / "up.log",
    )
    out_dir = jobs_dir / "out"
    out_dir.mkdir()
    out_dir.chmod(0o1777)  # the jobs, each a uid of its own, write their records here
    current = Scene(
        tmp_path, f"http://127.0.0.1:{port}", admin, agent_token, up, jobs_dir / "work", out_dir
    )
    try:
        up.start()
        wait_until(lambda: "Shockwave is up" in up.log_tail(), 30, lambda: f"up:\n{up.log_tail()}")
        yield current
    finally:
        for name in ("agent", "agent-again", "agent-third"):
            path = tmp_path / f"{name}.log"
            if path.exists():
                print(f"--- {name}\n{path.read_text()[-6000:]}")
        for pid in fake_job_pids(out_dir):
            with suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        if up.process is not None:
            with suppress(ProcessLookupError):
                os.kill(up.process.pid, signal.SIGCONT)
        up.stop()


def test_agent_runs_reattaches_rides_out_an_outage_and_checkpoints(
    tmp_path: Path, passable_tmp_path: Path
) -> None:
    started = time.monotonic()
    with scene(tmp_path, passable_tmp_path) as s:
        agent = s.agent("agent")
        agents = [agent]
        try:
            # 1. It registers the node with its 2 declared slots.
            wait_until(
                lambda: (
                    [(n["id"], n["gpus"], n["state"]) for n in s.get("/v1/nodes")["items"]]
                    == [(NODE, 2, "READY")]
                ),
                15,
                lambda: f"node {NODE} to register:\n{agent.log_tail()}",
            )

            # 2. A job's process starts with the lease's GPUs and the SHOCKWAVE_* environment.
            first = s.submit("first")
            wait_until(
                lambda: s.starts(first) != [], 20, lambda: f"the job to start:\n{agent.log_tail()}"
            )
            wait_until(lambda: s.state(first) == "RUNNING", 10, "the job to be RUNNING")
            (start,) = s.starts(first)
            env, pid = start["env"], start["pid"]
            lease = s.leases()[first]
            attempt = lease["attempt_id"]
            assert start["resumed_from"] is None
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in lease["gpus"])
            assert env["SHOCKWAVE_JOB_ID"] == first
            assert env["SHOCKWAVE_ATTEMPT_ID"] == attempt
            assert env["SHOCKWAVE_API_URL"] == s.base
            assert env["SHOCKWAVE_BATCH_SIZE"] == "32"
            assert env["SHOCKWAVE_CHECKPOINT_DIR"] == str(
                (s.work_dir / "checkpoints" / first).resolve()
            )
            assert datetime.fromisoformat(env["SHOCKWAVE_ROUND_ENDS_AT"]).tzinfo is not None
            assert "SHOCKWAVE_AGENT_TOKEN" not in env
            assert env["SHOCKWAVE_TOKEN"] != s.agent_token
            assert s.get(f"/v1/jobs/{first}", token=env["SHOCKWAVE_TOKEN"])["id"] == first
            assert f"attempt {attempt} started on {NODE}" in s.reasons(first)

            # 3. Killed and started again, the agent re-attaches: same process, no second one.
            agent.kill()
            assert alive(pid)
            agent = s.agent("agent-again")
            agents.append(agent)
            wait_until(
                lambda: f"re-attached to attempt {attempt}" in agent.log_tail(),
                15,
                lambda: f"the agent to re-attach:\n{agent.log_tail()}",
            )
            ends_at = s.leases()[first]["ends_at"]
            wait_until(lambda: s.leases()[first]["ends_at"] != ends_at, 2 * ROUND_S, "an extension")
            assert s.leases()[first]["attempt_id"] == attempt
            assert alive(pid) and len(s.starts(first)) == 1
            assert fake_job_pids(s.out_dir) == [pid]

            # 4. The API freezes for a few seconds, inside the lease: the job runs on.
            wait_until(
                lambda: fresh_lease_known(s, first, OUTAGE_S + 0.3),
                2 * ROUND_S,
                "a fresh round that the agent knows of",
                poll_s=0.05,
            )
            assert s.up.process is not None
            os.kill(s.up.process.pid, signal.SIGSTOP)
            time.sleep(OUTAGE_S)
            os.kill(s.up.process.pid, signal.SIGCONT)
            wait_until(
                lambda: "answers again" in agent.log_tail(),
                10,
                lambda: f"the agent to notice the outage and the recovery:\n{agent.log_tail()}",
            )
            assert "cannot reach the server" in agent.log_tail()
            assert alive(pid) and [r["event"] for r in s.records(first)] == ["start"]
            assert s.state(first) == "RUNNING" and s.leases()[first]["attempt_id"] == attempt

            # 5. A second job runs beside it; cancelled, its attempt must stop: SIGTERM, it
            #    checkpoints and exits 0, and the agent reports `checkpointed`.
            second = s.submit("second")
            wait_until(lambda: s.starts(second) != [], 3 * ROUND_S, "the second job to start")
            other = s.starts(second)[0]
            assert {env["CUDA_VISIBLE_DEVICES"], other["env"]["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
            cancelled = s.post(f"/v1/jobs/{second}/cancel")
            assert cancelled["state"] == "CANCELLED"
            wait_until(
                lambda: s.lease_state(other["env"]["SHOCKWAVE_ATTEMPT_ID"]) == "CHECKPOINTED",
                10,
                lambda: f"the cancelled job's checkpoint to be reported:\n{agent.log_tail()}",
            )
            assert [r["event"] for r in s.records(second)] == ["start", "sigterm"]
            assert not alive(other["pid"]) and alive(pid)

            # 6. The agent stops (SIGTERM): the first job checkpoints and is SUSPENDED; a new
            #    agent runs its next attempt, which resumes from the checkpoint.
            agent.stop()
            assert agent.process is not None and agent.process.returncode == 0
            stopped = s.records(first)[-1]
            assert (stopped["event"], stopped["pid"]) == ("sigterm", pid)
            assert s.state(first) == "SUSPENDED"
            assert f"attempt {attempt} on {NODE} checkpointed" in s.reasons(first)
            agent = s.agent("agent-third")
            agents.append(agent)
            wait_until(
                lambda: len(s.starts(first)) == 2,
                4 * ROUND_S,
                lambda: f"the first job to resume:\n{agent.log_tail()}",
            )
            resumed = s.starts(first)[1]
            assert resumed["resumed_from"] == stopped["step"] > 0
            assert resumed["env"]["SHOCKWAVE_ATTEMPT_ID"] != attempt
            assert resumed["env"]["SHOCKWAVE_CHECKPOINT_DIR"] == env["SHOCKWAVE_CHECKPOINT_DIR"]
            wait_until(lambda: s.state(first) == "RUNNING", 10, "the first job to run again")
        finally:
            for each in agents:
                each.kill()
    assert time.monotonic() - started < 90


def fresh_lease_known(s: Scene, job_id: str, at_least_s: float) -> bool:
    """Whether the job's lease has ``at_least_s`` seconds left and the agent knows its end
    (its state file holds it)."""
    ends_at = datetime.fromisoformat(s.leases()[job_id]["ends_at"]).timestamp()
    state = json.loads((s.work_dir / "agent-state.json").read_text())
    known = [a["ends_at"] for a in state["attempts"] if a["job_id"] == job_id]
    return ends_at - time.time() > at_least_s and known == [ends_at]
