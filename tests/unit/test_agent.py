"""The node agent's pieces without a server: backoff, the exit-status wrapper, re-attaching to a
process another runtime started, and the loop's decisions (driven by a fake server, a fake
runtime and a fake clock): errors never stop a job before its lease ends, a stop is SIGTERM then
SIGKILL after the grace period, an extension keeps the attempt, a new lease waits for the GPUs
of a stopping one, and a restarted agent starts nothing twice."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agent import wrap
from agent.client import (
    AgentClient,
    ApiUnavailable,
    Lease,
    LeasePoll,
    Report,
    Wait,
    parse_time,
)
from agent.config import AgentConfig, Machine
from agent.loop import LOG_TAIL_BYTES, NOT_RUN, Agent
from agent.runtime import (
    DockerRuntime,
    Ended,
    Handle,
    Launch,
    ProcessRuntime,
    read_ended,
    read_status,
    start_ticks,
)
from agent.state import load
from api.schemas import JobCreate
from shockwave.domain.backoff import Backoff

GRACE_S = 10.0
SLACK_S = 3.0


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(base_s=0.5, cap_s=4.0, rng=random.Random(1))
    delays = [backoff.failure() for _ in range(6)]
    for delay, ceiling in zip(delays, [0.5, 1, 2, 4, 4, 4], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert backoff.failure() <= 0.5


def test_lease_parse_reads_times_and_the_command() -> None:
    lease = Lease.parse(
        {
            "attempt_id": "a1",
            "job_id": "j1",
            "round_index": 3,
            "gpus": [0, 1],
            "ends_at": "2026-01-01T00:00:10Z",
            "batch_size": 64,
            "checkpoint_dir": "checkpoints/j1",
            "env": {"SHOCKWAVE_JOB_ID": "j1"},
            "command": ["python", "train.py"],
            "image": None,
        }
    )
    assert lease.ends_at == 1767225610.0
    assert (lease.gpus, lease.command, lease.image) == ((0, 1), ("python", "train.py"), None)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        ([sys.executable, "-c", "raise SystemExit(3)"], 3),
        ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], -15),
        (["/nonexistent/program"], 127),
    ],
)
def test_the_wrapper_records_how_its_child_ended(
    tmp_path: Path, argv: list[str], code: int
) -> None:
    status, pid_file = tmp_path / "status.json", tmp_path / "pid.json"
    done = subprocess.run(
        [sys.executable, "-P", wrap.__file__, str(pid_file), str(status), *argv],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert json.loads(status.read_text()) == {"exit_code": code}
    assert done.returncode == (code if code >= 0 else 128 - code)
    assert json.loads(pid_file.read_text())["pid"] > 0


def launch_of(tmp_path: Path, argv: tuple[str, ...]) -> Launch:
    return Launch(
        attempt_id="a1",
        argv=argv,
        image=None,
        env={"SHOCKWAVE_JOB_ID": "j1"},
        gpus=(0,),
        log_file=tmp_path / "a1" / "output.log",
        pid_file=tmp_path / "a1" / "wrapper.json",
        status_file=tmp_path / "a1" / "exit-status.json",
        checkpoint_dir=tmp_path / "checkpoints",
    )


def test_a_fresh_runtime_reattaches_to_a_process_it_did_not_start(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(15, lambda *_: sys.exit(0))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)"
    )
    first = ProcessRuntime()
    handle = first.start(launch_of(tmp_path, (sys.executable, "-c", script)))
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        second = ProcessRuntime()
        stored = Handle.from_json(json.loads(json.dumps(handle.to_json())))
        assert second.poll(stored) is None
        recycled = replace(stored, start_ticks=stored.start_ticks + 1)
        assert second.poll(recycled) == Ended(None), "a recycled pid is not the same process"
        planned = replace(stored, pid=0, start_ticks=0)
        assert second.recover(planned) == stored, "the pid the wrapper wrote is found"

        second.terminate(stored)
        first.poll(handle)  # reap the zombie, as init would for an orphan
        deadline = time.monotonic() + 10
        while (ended := second.poll(stored)) is None and time.monotonic() < deadline:
            time.sleep(0.02)
            first.poll(handle)
        assert ended == Ended(0)
        assert start_ticks(stored.pid) is None
    finally:
        first.kill(handle)


def test_a_job_command_is_bounded_argv() -> None:
    base = {"gpus": 1, "epochs": 1, "samples_per_epoch": 10, "initial_batch_size": 1}
    assert JobCreate.model_validate(base).command == []
    job = JobCreate.model_validate({**base, "command": ["python", "-c", "print(1)\n"]})
    assert job.command == ["python", "-c", "print(1)\n"]
    for bad in (["", "x"], ["a\x00b"], ["x"] * 257, "python train.py"):
        with pytest.raises(ValidationError):
            JobCreate.model_validate({**base, "command": bad})
    with pytest.raises(ValidationError):
        JobCreate.model_validate({**base, "image": "has space"})


# --- the loop, against fakes --------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeServer:
    """Answers like /v1/agent; ``down`` makes every call fail as unreachable."""

    leased: dict[str, Lease] = field(default_factory=dict)
    stop: set[str] = field(default_factory=set)
    down: bool = False
    reports: list[tuple[str, str, int | None]] = field(default_factory=list)
    stop_requested: list[str] = field(default_factory=list)
    """The attempts reported ``exited`` with ``stop_requested``."""
    polls: list[list[str]] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    """The latest output tail shipped for each attempt."""
    mint: bool = True
    """Whether a poll asking for tokens gets them (else the agent asks one at a time)."""
    asked_tokens: list[str] = field(default_factory=list)
    round: tuple[int, float] | None = None
    """The current round and its end, as a poll answer names them (None: not said)."""
    waits: list[Wait | None] = field(default_factory=list)
    """The long-poll request of each poll (None: answer at once)."""
    busy: set[str] = field(default_factory=set)
    """Attempts whose reports are answered 503 (their job busy: nothing applied)."""

    def _call(self) -> None:
        if self.down:
            raise ApiUnavailable("connection refused")

    def register(self, machine: Machine, hostname: str) -> dict[str, Any]:
        self._call()
        return {"id": "n1", "gpus": machine.gpus, "gpu_type": machine.gpu_type}

    def poll(
        self,
        running: list[str],
        reports: list[Report],
        heartbeat: bool,
        tokens: bool,
        logs: dict[str, str] | None = None,
        wait: Wait | None = None,
    ) -> LeasePoll:
        self._call()
        self.waits.append(wait)
        self.logs.update(logs or {})
        answers = []
        for r in reports:
            if r.attempt_id in self.busy:
                answers.append({"attempt_id": r.attempt_id, "status": 503, "stop": False})
                continue
            self.reports.append((r.attempt_id, r.state, r.exit_code))
            if r.stop_requested:
                self.stop_requested.append(r.attempt_id)
            answers.append({"attempt_id": r.attempt_id, "status": 200, "stop": False})
        self.polls.append(running)
        minted = {}
        if tokens and self.mint:
            minted = {a: f"token-{a}" for a in self.leased if a not in running}
        return LeasePoll(
            leases=dict(self.leased),
            stop=frozenset(self.stop),
            reports=tuple(answers),
            tokens=minted,
            current_round=None if self.round is None else self.round[0],
            round_ends_at=None if self.round is None else self.round[1],
        )

    def job_token(self, attempt_id: str) -> str:
        self._call()
        self.asked_tokens.append(attempt_id)
        return f"token-{attempt_id}"


@dataclass
class FakeRuntime:
    """Jobs that run until signalled: SIGTERM ends one with ``on_term`` (None: it ignores
    SIGTERM), SIGKILL with -9."""

    on_term: int | None = 0
    started: list[Launch] = field(default_factory=list)
    signals: list[tuple[int, str]] = field(default_factory=list)
    ended: dict[int, int] = field(default_factory=dict)

    def start(self, launch: Launch) -> Handle:
        self.started.append(launch)
        return replace(Handle.planned("process", launch), pid=len(self.started))

    def recover(self, handle: Handle) -> Handle:
        return handle

    def poll(self, handle: Handle) -> Ended | None:
        return Ended(self.ended[handle.pid]) if handle.pid in self.ended else None

    def terminate(self, handle: Handle) -> None:
        self.signals.append((handle.pid, "TERM"))
        if self.on_term is not None:
            self.ended[handle.pid] = self.on_term

    def kill(self, handle: Handle) -> None:
        self.signals.append((handle.pid, "KILL"))
        self.ended[handle.pid] = -int(signal.SIGKILL)


def make_agent(tmp_path: Path, server: FakeServer, runtime: FakeRuntime, clock: Clock) -> Agent:
    config = AgentConfig(
        api_url="http://api",
        token=None,
        node="n1",
        hostname="host",
        machine=Machine(gpus=2, gpu_type="slot", nvidia=False),
        runtime="process",
        work_dir=tmp_path,
        poll_interval_s=1.0,
        grace_s=GRACE_S,
        lease_slack_s=SLACK_S,
    )
    agent = Agent(config, server, {"process": runtime}, clock=clock)
    agent.reattach()
    return agent


def lease(attempt: str, job: str, gpus: tuple[int, ...], ends_at: float) -> Lease:
    return Lease(
        attempt_id=attempt,
        job_id=job,
        round_index=1,
        gpus=gpus,
        ends_at=ends_at,
        batch_size=32,
        checkpoint_dir=f"checkpoints/{job}",
        env={"SHOCKWAVE_JOB_ID": job},
        command=("train",),
        image=None,
    )


def run_for(agent: Agent, clock: Clock, seconds: float, tick: float = 0.5) -> None:
    end = clock.now + seconds
    while clock.now < end:
        agent.step()
        clock.now += tick


@pytest.fixture
def world(tmp_path: Path) -> tuple[FakeServer, FakeRuntime, Clock]:
    return FakeServer(), FakeRuntime(), Clock()


def test_a_lease_starts_with_its_environment_and_reports(tmp_path: Path, world: Any) -> None:
    server, runtime, clock = world
    server.leased = {"a1": lease("a1", "j1", (1,), clock.now + 60)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 2)
    (launch,) = runtime.started
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert launch.env["SHOCKWAVE_TOKEN"] == "token-a1"
    assert launch.env["SHOCKWAVE_API_URL"] == "http://api"
    assert launch.env["SHOCKWAVE_CHECKPOINT_DIR"] == str(tmp_path.resolve() / "checkpoints/j1")
    assert server.reports == [], "a start needs no report: the poll that follows lists it"
    assert server.polls[:2] == [[], ["a1"]], "the second poll of the contact, at once"
    assert server.asked_tokens == [], "the token came with the poll"
    assert server.polls[-1] == ["a1"]


def test_the_output_tail_goes_with_heartbeat_polls_and_once_more_at_the_end(
    tmp_path: Path, world: Any
) -> None:
    server, runtime, clock = world
    server.leased = {"a1": lease("a1", "j1", (0,), clock.now + 60)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 1)
    (launch,) = runtime.started
    launch.log_file.write_bytes(b"x" * 9000 + b"epoch 1\n")
    run_for(agent, clock, 12)
    tail = server.logs["a1"]
    assert tail.endswith("epoch 1\n") and len(tail) == LOG_TAIL_BYTES
    with launch.log_file.open("ab") as log:
        log.write(b"done\n")
    runtime.ended[1] = 0
    run_for(agent, clock, 2)
    assert server.logs["a1"].endswith("epoch 1\ndone\n"), "the last words of an ended attempt"
    assert agent.final_logs == {}


def test_a_lease_whose_poll_brought_no_token_asks_for_one(tmp_path: Path, world: Any) -> None:
    server, runtime, clock = world
    server.mint = False
    server.leased = {"a1": lease("a1", "j1", (1,), clock.now + 60)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 2)
    (launch,) = runtime.started
    assert launch.env["SHOCKWAVE_TOKEN"] == "token-a1"
    assert server.asked_tokens == ["a1"]


def test_an_error_storm_never_stops_a_job_before_its_lease_ends(tmp_path: Path, world: Any) -> None:
    server, runtime, clock = world
    ends_at = clock.now + 30
    server.leased = {"a1": lease("a1", "j1", (0,), ends_at)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 1)
    server.down = True
    run_for(agent, clock, ends_at + SLACK_S - clock.now - 0.5)
    assert runtime.signals == [], "no stop before the lease (and its slack) ends"
    run_for(agent, clock, 2)
    assert runtime.signals == [(1, "TERM")]
    assert load(tmp_path / "agent-state.json").outbox[-1].state == "checkpointed"

    server.down = False
    server.leased = {}
    run_for(agent, clock, 12)
    assert server.reports[-1] == ("a1", "checkpointed", None)
    assert len(runtime.started) == 1


def test_a_stop_is_sigterm_then_sigkill_after_the_grace_period(tmp_path: Path, world: Any) -> None:
    server, _, clock = world
    runtime = FakeRuntime(on_term=None)
    server.leased = {"a1": lease("a1", "j1", (0,), clock.now + 600)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 1)
    server.stop, server.leased = {"a1"}, {}
    run_for(agent, clock, GRACE_S - 1)
    assert runtime.signals == [(1, "TERM")]
    run_for(agent, clock, 2)
    assert runtime.signals == [(1, "TERM"), (1, "KILL")]
    run_for(agent, clock, 2)
    assert server.reports[-1] == ("a1", "exited", -9)
    assert server.stop_requested == ["a1"], "the stop that was asked for, not a failure"


def test_an_extension_keeps_the_attempt_without_a_report(tmp_path: Path, world: Any) -> None:
    """The attempt runs on past each old end; every poll lists it (that is the
    acknowledgement), and no report is sent."""
    server, runtime, clock = world
    server.leased = {"a1": lease("a1", "j1", (0,), clock.now + 5)}
    agent = make_agent(tmp_path, server, runtime, clock)
    for _ in range(3):
        run_for(agent, clock, 4)
        server.leased = {"a1": replace(server.leased["a1"], ends_at=clock.now + 5)}
    run_for(agent, clock, 2)
    assert len(runtime.started) == 1 and runtime.signals == []
    assert agent.state.attempts["a1"].ends_at == server.leased["a1"].ends_at
    assert server.reports == [] and all(p == ["a1"] for p in server.polls[1:])


def test_a_new_lease_waits_for_the_gpus_of_a_stopping_attempt(tmp_path: Path, world: Any) -> None:
    server, _, clock = world
    runtime = FakeRuntime(on_term=None)
    server.leased = {"a1": lease("a1", "j1", (0, 1), clock.now + 600)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 1)
    server.leased = {"b1": lease("b1", "j2", (1,), clock.now + 600)}
    run_for(agent, clock, 3)
    assert [launch.attempt_id for launch in runtime.started] == ["a1"]
    runtime.ended[1] = 0
    run_for(agent, clock, 2)
    assert [launch.attempt_id for launch in runtime.started] == ["a1", "b1"]
    assert ("a1", "checkpointed", None) in server.reports


def test_a_report_answered_503_stays_owed_until_the_server_applies_it(
    tmp_path: Path, world: Any
) -> None:
    server, runtime, clock = world
    server.leased = {"a1": lease("a1", "j1", (0,), clock.now + 600)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 2)
    server.busy = {"a1"}
    runtime.ended[1] = 0
    run_for(agent, clock, 3)
    assert server.reports == [] and [r.attempt_id for r in agent.state.outbox] == ["a1"]
    server.busy = set()
    run_for(agent, clock, 2)
    assert server.reports == [("a1", "exited", 0)] and agent.state.outbox == []


def test_a_restarted_agent_reattaches_and_starts_nothing_twice(tmp_path: Path, world: Any) -> None:
    server, runtime, clock = world
    server.leased = {"a1": lease("a1", "j1", (0,), clock.now + 600)}
    run_for(make_agent(tmp_path, server, runtime, clock), clock, 2)
    again = make_agent(tmp_path, server, runtime, clock)
    run_for(again, clock, 3)
    assert len(runtime.started) == 1 and server.polls[-1] == ["a1"]

    runtime.ended[1] = 0
    third = make_agent(tmp_path, server, runtime, clock)
    assert third.state.attempts == {}
    run_for(third, clock, 2)
    assert server.reports[-1] == ("a1", "exited", 0)
    assert server.stop_requested == []
    assert len(runtime.started) == 1, "an ended attempt the server still lists is not rerun"


def test_a_lease_without_a_command_is_reported_not_run(tmp_path: Path, world: Any) -> None:
    server, runtime, clock = world
    server.leased = {"a1": replace(lease("a1", "j1", (0,), clock.now + 60), command=())}
    run_for(make_agent(tmp_path, server, runtime, clock), clock, 3)
    assert runtime.started == [] and server.reports == [("a1", "exited", NOT_RUN)]


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A stand-in ``docker`` on the PATH (no engine here): ``script``, run by this Python."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\n{script}")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")


def test_the_docker_runtime_runs_a_container_on_the_lease_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a stand-in ``docker`` (no engine here): the command lines it is given."""
    calls = tmp_path / "calls.jsonl"
    fake_docker(
        tmp_path,
        monkeypatch,
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "if '--env-file' in args:\n"
        "    args.append(open(args[args.index('--env-file') + 1]).read())\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(args) + '\\n')\n"
        "if args[0] == 'inspect':\n"
        "    print('exited 3')\n",
    )
    runtime = DockerRuntime(nvidia=True)
    launch = replace(launch_of(tmp_path, ("python", "train.py")), image="trainer:1", gpus=(2, 3))
    handle = runtime.start(launch)
    assert runtime.poll(handle) == Ended(3)
    runtime.terminate(handle)
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    run = next(a for a in argvs if a[0] == "run")
    *run, env_file = run
    assert run[-3:] == ["trainer:1", "python", "train.py"]
    assert run[run.index("--gpus") + 1] == '"device=2,3"'
    assert run[run.index("--network") + 1] == "bridge"  # host: only where allowed
    assert run[run.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert "--init" in run and f"shockwave.attempt={handle.container}" in run
    env = dict(line.split("=", 1) for line in env_file.splitlines())
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["SHOCKWAVE_JOB_ID"] == "j1"
    assert not any("SHOCKWAVE_" in arg for arg in run), "the environment is not on the command line"
    assert not Path(run[run.index("--env-file") + 1]).exists(), "the env file is removed"
    assert ["kill", "--signal", "SIGTERM", handle.container] in argvs
    assert read_status(handle.status_file) == 3


def test_a_docker_inspect_that_fails_says_nothing_of_the_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an engine that says there is no such container ends the attempt; a busy or absent
    engine leaves it running (polled again), where it was taken for an end with no status."""
    said = tmp_path / "inspect-says.txt"
    fake_docker(
        tmp_path,
        monkeypatch,
        "import sys\n"
        "if sys.argv[1] == 'inspect':\n"
        f"    sys.stderr.write(open({str(said)!r}).read())\n"
        "    sys.exit(1)\n",
    )
    runtime = DockerRuntime(nvidia=False)
    handle = runtime.start(replace(launch_of(tmp_path, ("python", "train.py")), image="t:1"))
    said.write_text("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n")
    assert runtime.poll(handle) is None
    said.write_text("Error: No such object: " + (handle.container or "") + "\n")
    assert runtime.poll(handle) == Ended(None)  # gone, and no status was recorded
    wrap.write_status(Path(handle.status_file), 0)
    assert runtime.poll(handle) == Ended(0)


def test_an_attempt_asked_to_stop_that_dies_by_sigterm_is_a_stop_not_a_failure(
    tmp_path: Path, world: Any
) -> None:
    """SIGTERM before the program installed its handler: -15, reported with stop_requested."""
    server, _, clock = world
    runtime = FakeRuntime(on_term=-int(signal.SIGTERM))
    server.leased = {"a1": lease("a1", "j1", (0,), clock.now + 5)}
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 1)
    server.down = True  # no word of an extension: the agent stops the job itself
    run_for(agent, clock, 5 + SLACK_S)
    server.down = False
    run_for(agent, clock, 12)  # the backoff's delay, then the report
    assert runtime.signals == [(1, "TERM")]
    assert ("a1", "exited", -15) in server.reports and server.stop_requested == ["a1"]


def test_a_job_its_wrapper_stopped_with_the_agent_gone_is_reported_as_a_stop(
    tmp_path: Path, world: Any
) -> None:
    """A restarted agent finds that the wrapper stopped the job (exit 0: it checkpointed;
    SIGKILL after the grace period: a stop, not a failure)."""
    server, runtime, clock = world
    server.leased = {
        "a1": lease("a1", "j1", (0,), clock.now + 600),
        "b1": lease("b1", "j2", (1,), clock.now + 600),
    }
    run_for(make_agent(tmp_path, server, runtime, clock), clock, 2)

    class Orphaned(FakeRuntime):
        def poll(self, handle: Handle) -> Ended | None:
            return Ended(0 if handle.pid == 1 else -9, stop_requested=True)

    again = make_agent(tmp_path, server, Orphaned(started=runtime.started), clock)
    server.leased = {}
    run_for(again, clock, 2)
    assert ("a1", "checkpointed", None) in server.reports
    assert ("b1", "exited", -9) in server.reports and server.stop_requested == ["b1"]


def run_watched_wrapper(
    tmp_path: Path, script: str, orphan_grace_s: float
) -> subprocess.Popen[bytes]:
    """The wrapper, watching ``tmp_path/agent.alive`` with a 1 s kill grace, running ``script``
    (in a session of its own, as under the agent)."""
    watch = wrap.Watch(tmp_path / "agent.alive", orphan_grace_s, 1.0)
    return subprocess.Popen(
        [
            sys.executable,
            "-P",
            wrap.__file__,
            *watch.argv(),
            str(tmp_path / "pid.json"),
            str(tmp_path / "status.json"),
            sys.executable,
            "-c",
            script,
        ],
        start_new_session=True,
    )


TERM_AWARE = (
    "import pathlib, signal, sys, time\nsignal.signal(15, lambda *_: sys.exit(0))\ntime.sleep(60)\n"
)
TERM_DEAF = "import signal, time\nsignal.signal(15, signal.SIG_IGN)\ntime.sleep(60)\n"


def test_the_wrapper_leaves_the_job_alone_while_its_agent_lives(tmp_path: Path) -> None:
    alive = tmp_path / "agent.alive"
    alive.touch()
    wrapper = run_watched_wrapper(tmp_path, TERM_AWARE, orphan_grace_s=1.0)
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            alive.touch()
            time.sleep(0.1)
        assert wrapper.poll() is None, "the job runs on while the agent is alive"
        os.killpg(wrapper.pid, signal.SIGTERM)  # the agent's own stop, to the group
        assert wrapper.wait(timeout=10) == 0
        assert json.loads((tmp_path / "status.json").read_text()) == {"exit_code": 0}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(wrapper.pid, signal.SIGKILL)


@pytest.mark.parametrize(("script", "code"), [(TERM_AWARE, 0), (TERM_DEAF, -9)])
def test_the_wrapper_stops_a_job_whose_agent_is_gone(
    tmp_path: Path, script: str, code: int
) -> None:
    """No sign of life for the orphan grace period: SIGTERM (and SIGKILL after the kill grace
    for a job that ignores it), recorded as a stop that was asked for."""
    (tmp_path / "agent.alive").touch()
    began = time.monotonic()
    wrapper = run_watched_wrapper(tmp_path, script, orphan_grace_s=1.0)
    try:
        wrapper.wait(timeout=20)
        took = time.monotonic() - began
        status = json.loads((tmp_path / "status.json").read_text())
        assert status == {"exit_code": code, "stop_requested": 1}
        assert read_ended(tmp_path / "status.json") == Ended(code, stop_requested=True)
        assert 1.0 <= took < (3.0 if code == 0 else 5.0), took
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(wrapper.pid, signal.SIGKILL)


def test_the_agent_polls_at_the_rounds_end_and_asks_the_server_to_hold_it_for_the_next(
    tmp_path: Path, world: Any
) -> None:
    """Between boundaries: plain polls every poll interval. The contact after the round's end
    comes at the end (not a poll interval later) and is a bounded long poll from the round it
    saw, so the next round's leases start when the server has them; a round much later than
    due gets plain polls again."""
    server, runtime, clock = world
    server.round = (3, clock.now + 1.75)
    agent = make_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 1.5, tick=0.25)
    assert server.waits and all(wait is None for wait in server.waits), "mid-round: plain"
    polls = len(server.waits)
    run_for(agent, clock, 0.5, tick=0.25)  # 1.5 -> 2.0: the round ends at 1.75
    assert server.waits[polls:] == [Wait(1.0, 3)], "at the end, held for round 4"
    server.round = (3, clock.now - 10.0)  # the driver is far behind: no holding the loop
    run_for(agent, clock, 2.0, tick=0.25)
    assert server.waits[-1] is None


def test_the_client_sends_a_long_poll_and_falls_back_to_plain_polls_on_an_older_server() -> None:
    """An older server refuses the unknown ``wait_s`` (422): the poll is sent again plainly,
    and no later poll asks again. The answer's round is read."""
    bodies: list[dict[str, Any]] = []
    old_server = True

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if old_server and "wait_s" in body:
            return httpx.Response(422, json={"title": "Invalid input", "detail": "wait_s"})
        return httpx.Response(
            200,
            json={
                "leases": [],
                "stop": [],
                "reports": [],
                "tokens": {},
                "current_round": 4,
                "round_ends_at": "2026-11-27T10:00:00+00:00",
            },
        )

    client = AgentClient("http://api", None, "n1", 1.0, transport=httpx.MockTransport(answer))
    poll = client.poll([], [], True, True, wait=Wait(1.0, 3))
    assert (poll.current_round, poll.round_ends_at) == (4, parse_time("2026-11-27T10:00:00Z"))
    assert [("wait_s" in b, b.get("seen_round")) for b in bodies] == [(True, 3), (False, None)]
    client.poll([], [], True, True, wait=Wait(1.0, 4))
    assert "wait_s" not in bodies[-1] and len(bodies) == 3
    old_server = False
    fresh = AgentClient("http://api", None, "n1", 1.0, transport=httpx.MockTransport(answer))
    fresh.poll([], [], True, True, wait=Wait(1.0, 4))
    assert bodies[-1]["wait_s"] == 1.0 and bodies[-1]["seen_round"] == 4
