"""What keeps the jobs on a node apart, without a server: image references, the ``docker run``
line the agent builds (a job's words never become options, the agent sets every limit), and,
run as root (CI is), the uid pool: each attempt a uid of its own, in directories only it may
enter, with nothing of the agent's environment, and no process of its uid left once it ends."""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig, ContainerLimits, Machine
from agent.isolation import (
    PoolExhausted,
    UidPool,
    hand_over,
    isolation_warning,
    owner_of,
    parse_uids,
    processes_of,
    reachable_by_others,
)
from agent.loop import Agent
from agent.runtime import DockerRuntime, Launch, ProcessRuntime, inherited_env
from shockwave.domain.image_reference import image_allowed, is_image_reference, repository
from tests.job_python import job_python
from tests.unit.test_agent import (
    Clock,
    FakeRuntime,
    FakeServer,
    launch_of,
    lease,
    run_for,
)

HOSTILE_IMAGES = [
    "--volume=/:/host:ro",
    "-v/:/host",
    "--privileged",
    "shockwave:latest --user=0:0",
    "shockwave:latest\t--network=host",
    "shockwave latest",
    "Shockwave:latest",
    "shockwave:",
    "shockwave:-tag",
    "/etc/passwd",
    "a=b",
    '"quoted"',
    "x" * 256,
    "",
]


@pytest.mark.parametrize(
    "image",
    [
        "shockwave:latest",
        "ubuntu",
        "library/ubuntu:22.04",
        "registry.example.com:5000/team/trainer:v2.1-rc_3",
        "localhost/trainer",
        "[::1]:5000/trainer:1",
        "ubuntu@sha256:" + "a" * 64,
        "ghcr.io/org/trainer:v1@sha256:" + "0" * 64,
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    assert is_image_reference(image)


@pytest.mark.parametrize("image", HOSTILE_IMAGES)
def test_anything_else_is_not_an_image_reference(image: str) -> None:
    assert not is_image_reference(image)


def test_the_allow_list_admits_registries_repositories_and_exact_references() -> None:
    allowed = ["registry.example.com/team/", "shockwave", "ubuntu:22.04"]
    assert repository("host:5000/team/trainer:v2") == "host:5000/team/trainer"
    assert image_allowed("registry.example.com/team/trainer:v1", allowed)
    assert image_allowed("shockwave:latest", allowed)
    assert image_allowed("shockwave@sha256:" + "a" * 64, allowed)
    assert image_allowed("ubuntu:22.04", allowed)
    assert not image_allowed("ubuntu:24.04", allowed)
    assert not image_allowed("ubuntu", allowed)
    assert not image_allowed("registry.example.com/other/trainer:v1", allowed)
    assert not image_allowed("registry.example.com.evil.io/team/x", allowed)
    assert not image_allowed("shockwave-evil:latest", allowed)
    assert not image_allowed("--volume=/:/host", ["--volume=/:/host"])


def docker_launch(tmp_path: Path, image: str, argv: tuple[str, ...]) -> Launch:
    return replace(launch_of(tmp_path, argv), image=image, gpus=(1,), uid=60123)


def test_the_container_is_held_to_the_agents_limits_and_the_job_adds_no_option(
    tmp_path: Path,
) -> None:
    """The image is the last word before the job's command; the job's command, however much
    it looks like options, comes after it (where ``docker run`` reads it as the container's
    command); every limit is the agent's."""
    runtime = DockerRuntime(nvidia=True, limits=ContainerLimits(memory="8g", pids=512))
    hostile = ("--user=0:0", "--volume=/:/host", "--privileged", "sh", "-c", "id")
    argv = runtime.run_argv("c1", docker_launch(tmp_path, "shockwave:latest", hostile), Path("e"))
    image_at = argv.index("shockwave:latest")
    assert argv[image_at + 1 :] == list(hostile)
    options = argv[:image_at]
    assert options[options.index("--user") + 1] == "60123:60123"
    assert options.count("--user") == 1
    assert {"--cap-drop", "ALL", "--read-only", "--init"} <= set(options)
    assert options[options.index("--security-opt") + 1] == "no-new-privileges"
    assert options[options.index("--tmpfs") + 1].startswith("/tmp:rw,nosuid,nodev,")
    assert options[options.index("--network") + 1] == "bridge"
    assert options[options.index("--memory") + 1] == "8g"
    assert options[options.index("--memory-swap") + 1] == "8g"
    assert options[options.index("--pids-limit") + 1] == "512"
    assert options[options.index("--gpus") + 1] == '"device=1"', "only the leased GPU"
    mount = options[options.index("--mount") + 1]
    assert mount == f"type=bind,source={tmp_path}/checkpoints,target={tmp_path}/checkpoints"
    assert "--privileged" not in options and "--volume" not in options


def test_the_host_network_only_where_the_operator_allows_it(tmp_path: Path) -> None:
    launch = docker_launch(tmp_path, "shockwave:latest", ("true",))
    default = DockerRuntime(nvidia=False).run_argv("c1", launch, Path("e"))
    assert default[default.index("--network") + 1] == "bridge"
    assert "--gpus" not in default, "no GPUs on a node without NVIDIA GPUs"
    host = DockerRuntime(nvidia=False, limits=ContainerLimits(network="host"))
    argv = host.run_argv("c1", launch, Path("e"))
    assert argv[argv.index("--network") + 1] == "host"


@pytest.mark.parametrize("image", HOSTILE_IMAGES)
def test_an_image_that_is_no_reference_never_reaches_docker(tmp_path: Path, image: str) -> None:
    runtime = DockerRuntime(nvidia=False)
    with pytest.raises(ValueError, match="not a Docker image reference"):
        runtime.start(docker_launch(tmp_path, image, ("true",)))


def test_an_image_the_operator_did_not_allow_is_refused(tmp_path: Path) -> None:
    runtime = DockerRuntime(nvidia=False, limits=ContainerLimits(allowed_images=("shockwave",)))
    runtime.run_argv("c1", docker_launch(tmp_path, "shockwave:latest", ("true",)), Path("e"))
    with pytest.raises(ValueError, match="not among this node's allowed images"):
        runtime.run_argv("c1", docker_launch(tmp_path, "ubuntu:22.04", ("true",)), Path("e"))


def test_a_job_inherits_nothing_of_the_agents_environment_but_where_programs_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHOCKWAVE_AGENT_TOKEN", "sw_agent_secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    monkeypatch.setenv("DATABASE_URL", "postgresql://operator:pw@db/prod")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    inherited = inherited_env()
    assert "SHOCKWAVE_AGENT_TOKEN" not in inherited
    assert "AWS_SECRET_ACCESS_KEY" not in inherited and "DATABASE_URL" not in inherited
    assert inherited["PATH"] == os.environ["PATH"] and inherited["LC_ALL"] == "C.UTF-8"


def test_uid_ranges() -> None:
    assert parse_uids("60000-60999") == (60000, 60999)
    assert parse_uids("off") is None
    for bad in ("0-10", "60000", "60999-60000", "a-b", "-1-5"):
        with pytest.raises(ValueError):
            parse_uids(bad)


# --- run as root: the uid pool --------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("CI"),
    reason="switching users needs root (CI runs as root, where this runs)",
)
"""CI runs as root, so these run there; set CI and they fail rather than skip elsewhere."""

POOL = (61000, 61009)


def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@needs_root
def test_the_pool_hands_out_free_uids_once_and_skips_uids_in_use(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    first = UidPool(*POOL, lock_dir=locks)
    second = UidPool(*POOL, lock_dir=locks)  # another agent on the same machine
    taken = first.take()
    assert taken == POOL[0]
    assert second.take() == POOL[0] + 1, "a uid another agent holds is not handed out"
    assert stat.S_IMODE(locks.stat().st_mode) == 0o700
    first.release(taken)
    assert second.take() == POOL[0]
    tiny = UidPool(POOL[1], POOL[1], lock_dir=tmp_path / "tiny")
    tiny.take()
    with pytest.raises(PoolExhausted):
        tiny.take()


@needs_root
def test_hand_over_never_follows_a_link_a_job_left(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("the agent's")
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "sub" / "model.bin").write_text("weights")
    (checkpoint / "link").symlink_to(outside)
    hand_over(checkpoint, POOL[0])
    assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o700
    for path in (checkpoint, checkpoint / "sub", checkpoint / "sub" / "model.bin"):
        assert path.stat().st_uid == POOL[0]
    assert os.lstat(checkpoint / "link").st_uid == POOL[0]
    assert outside.stat().st_uid == 0, "the file the link points to is not handed over"


PROBE = (
    "import json, os, sys, pathlib\n"
    "other = sys.argv[1]\n"
    "found = {}\n"
    "try:\n"
    "    found['environ'] = open(f'/proc/{other}/environ').read()\n"
    "except OSError as e:\n"
    "    found['environ'] = type(e).__name__\n"
    "found['uid'] = os.getuid(); found['gid'] = os.getgid(); found['groups'] = os.getgroups()\n"
    "found['cwd'] = os.getcwd(); found['env'] = dict(os.environ)\n"
    "print(json.dumps(found), flush=True)\n"
)


@needs_root
def test_a_process_job_runs_as_its_uid_and_cannot_read_another_jobs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOCKWAVE_AGENT_TOKEN", "sw_agent_secret")
    monkeypatch.setenv("OPERATOR_SECRET", "operator-secret")
    runtime = ProcessRuntime()
    sleeper_dir = tmp_path / "sleeper"
    sleeper = replace(
        launch_of(sleeper_dir, (job_python(), "-c", "import time; time.sleep(30)")),
        env={"SHOCKWAVE_TOKEN": "token-of-a", "SECRET": "tenant-a-secret"},
        uid=POOL[0],
    )
    handle = runtime.start(sleeper)
    try:
        wait_for(lambda: processes_of(POOL[0]))
        (victim,) = processes_of(POOL[0])
        assert owner_of(handle.pid) == 0, "the wrapper keeps the agent's user"
        scratch = tmp_path / "scratch"
        scratch.mkdir(mode=0o700)
        os.chown(scratch, POOL[1], POOL[1])
        probe = replace(
            launch_of(tmp_path / "probe", (job_python(), "-c", PROBE, str(victim))),
            attempt_id="a2",
            env={"SHOCKWAVE_TOKEN": "token-of-b", "LD_PRELOAD": "/nonexistent.so"},
            uid=POOL[1],
            scratch_dir=scratch,
        )
        ended = runtime.start(probe)
        wait_for(lambda: runtime.poll(ended) is not None)
        found = json.loads(Path(ended.log_file).read_text().splitlines()[-1])
    finally:
        runtime.kill(handle)
        wait_for(lambda: not processes_of(POOL[0]))
    assert found["environ"] == "PermissionError", "another uid's environment is closed"
    assert (found["uid"], found["gid"], found["groups"]) == (POOL[1], POOL[1], [])
    assert found["cwd"] == str(scratch)
    env = found["env"]
    assert env["SHOCKWAVE_TOKEN"] == "token-of-b" and env["HOME"] == str(scratch)
    assert "SHOCKWAVE_AGENT_TOKEN" not in env and "OPERATOR_SECRET" not in env
    assert stat.S_IMODE(Path(ended.log_file).stat().st_mode) == 0o600
    assert not (tmp_path / "probe" / "a1" / "job.env.json").exists(), "read, then removed"


def pool_agent(tmp_path: Path, server: FakeServer, runtime: Any, clock: Clock) -> Agent:
    config = AgentConfig(
        api_url="http://api",
        token=None,
        node="n1",
        hostname="host",
        machine=Machine(gpus=2, gpu_type="slot", nvidia=False),
        runtime="process",
        work_dir=tmp_path / "work",
        poll_interval_s=1.0,
        job_uids=POOL,
        uid_lock_dir=tmp_path / "locks",
    )
    agent = Agent(config, server, {"process": runtime}, clock=clock)
    agent.reattach()
    return agent


@needs_root
def test_each_attempt_gets_a_uid_and_directories_of_its_own(passable_tmp_path: Path) -> None:
    tmp_path = passable_tmp_path
    server, runtime, clock = FakeServer(), FakeRuntime(), Clock()
    server.leased = {
        "a1": lease("a1", "j1", (0,), clock.now + 60),
        "a2": lease("a2", "j2", (1,), clock.now + 60),
    }
    agent = pool_agent(tmp_path, server, runtime, clock)
    run_for(agent, clock, 2)
    first, second = runtime.started
    assert {first.uid, second.uid} == {POOL[0], POOL[0] + 1}
    work = tmp_path / "work"
    assert stat.S_IMODE(work.stat().st_mode) == 0o711, "jobs pass through, cannot list"
    assert stat.S_IMODE((work / "attempts").stat().st_mode) == 0o700, "the agent's alone"
    for launch in (first, second):
        for folder in (launch.checkpoint_dir, launch.scratch_dir):
            assert folder is not None
            found = folder.stat()
            assert (found.st_uid, found.st_gid) == (launch.uid, launch.uid), folder
            assert stat.S_IMODE(found.st_mode) == 0o700, folder
        assert launch.log_file.parent.stat().st_uid == 0
    assert reachable_by_others(work) is None

    # The attempt ends: its uid goes back to the pool, its working directory is removed, and
    # the next attempt of the job gets the checkpoint directory under its own uid.
    (first.checkpoint_dir / "model.bin").write_text("weights")
    os.chown(first.checkpoint_dir / "model.bin", first.uid or 0, first.uid or 0)
    runtime.ended[1] = 0
    server.leased = {"a2": server.leased["a2"], "a3": lease("a3", "j1", (0,), clock.now + 60)}
    run_for(agent, clock, 2)
    assert first.scratch_dir is not None and not first.scratch_dir.exists()
    third = runtime.started[2]
    assert third.uid == first.uid, "the freed uid is handed out again"
    assert third.checkpoint_dir == first.checkpoint_dir
    assert (third.checkpoint_dir / "model.bin").stat().st_uid == third.uid


@needs_root
def test_a_process_an_attempt_left_behind_is_killed_when_it_ends(
    passable_tmp_path: Path,
) -> None:
    """A job that daemonizes (leaves its process group) does not outlive its attempt: when the
    attempt ends, every process of its uid is killed before the uid is handed out again."""
    server, clock = FakeServer(), Clock()
    runtime = ProcessRuntime()
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\n"
    server.leased = {
        "a1": replace(lease("a1", "j1", (0,), clock.now + 60), command=(job_python(), "-c", escape))
    }
    agent = pool_agent(passable_tmp_path, server, runtime, clock)
    agent.step()
    uid = agent.state.attempts["a1"].handle.uid
    assert uid == POOL[0]
    deadline = time.monotonic() + 10
    while "a1" in agent.state.attempts:
        assert time.monotonic() < deadline, "the attempt never ended"
        agent.step()
        time.sleep(0.05)
    assert processes_of(POOL[0]) == [], "the process it left was killed"
    assert ("a1", "exited", 0) in server.reports or agent.state.outbox


def test_an_agent_that_cannot_switch_users_says_what_isolation_remains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    said = isolation_warning("process", None) or ""
    assert "isolation OFF" in said and "uid 1000" in said and "not root" in said
    assert "environments" in said and "token" in said
    containers = isolation_warning("docker", None) or ""
    assert "only its own checkpoint directory" in containers
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert isolation_warning("process", (60000, 60999)) is None
    assert "--job-uids off" in (isolation_warning("process", None) or "")
