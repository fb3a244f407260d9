"""Running a job: as a process (under :mod:`agent.wrap`, in a process group of its own) or as
a Docker container, and watching, stopping and re-attaching to it.

A :class:`Handle` is what the state file keeps of a running job: enough for an agent
restarted in between to find the same process again (pid and its start time from
``/proc/<pid>/stat``, so a recycled pid is never mistaken for it) or the same container (its
name), and to learn how it ended (the wrapper's status file, the container's exit code).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from agent import wrap
from agent.config import ContainerLimits, RuntimeKind, safe_name
from agent.isolation import owner_of
from shockwave.domain.image_reference import image_allowed, is_image_reference

DOCKER_TIMEOUT_S = 30.0
NO_SUCH_CONTAINER = ("no such object", "no such container")
"""What ``docker inspect`` says (lower-cased) of a container that does not exist; any other
failure (the engine busy, restarting or unreachable, the command timing out) says nothing of
the container."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Launch:
    """One attempt to start: ``argv`` (in ``image`` for a container) with ``env`` on the local
    ``gpus``; its output goes to ``log_file``, the wrapper's pid to ``pid_file`` and its exit
    status to ``status_file``. ``watch``: the agent's sign of life the wrapper watches, to stop
    the job once the agent is gone (processes only; None: never). ``uid``: the unprivileged
    uid (and gid) the job runs as (None: the agent's own); ``scratch_dir``: the job's private
    working directory, its ``HOME`` and ``TMPDIR`` (processes only; None: the agent's)."""

    attempt_id: str
    argv: tuple[str, ...]
    image: str | None
    env: dict[str, str]
    gpus: tuple[int, ...]
    log_file: Path
    pid_file: Path
    status_file: Path
    checkpoint_dir: Path
    watch: wrap.Watch | None = None
    uid: int | None = None
    scratch_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class Handle:
    """A started job. ``pid``/``start_ticks``: the wrapper process (the group leader, so
    ``pid`` is also the process group) and its start time in clock ticks since boot (0 where
    ``/proc`` is missing), ``pid`` 0 until known; ``container``: the container's name (Docker);
    ``uid``: the uid the job runs as (None: the agent's own).
    """

    kind: RuntimeKind
    pid: int
    start_ticks: int
    pid_file: str
    status_file: str
    log_file: str
    container: str | None = None
    uid: int | None = None

    @classmethod
    def planned(cls, kind: RuntimeKind, launch: Launch) -> Handle:
        """The handle of a job about to start (saved before it starts)."""
        container = f"shockwave-{safe_name(launch.attempt_id)}" if kind == "docker" else None
        return cls(
            kind=kind,
            pid=0,
            start_ticks=0,
            pid_file=str(launch.pid_file),
            status_file=str(launch.status_file),
            log_file=str(launch.log_file),
            container=container,
            uid=launch.uid,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Handle:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Ended:
    """A job that is over: ``code`` is its exit status (-S: killed by signal S), None when
    nothing recorded it (the wrapper itself was killed). ``stop_requested``: the wrapper
    stopped it because the agent was gone (a stop, not the job's own end)."""

    code: int | None
    stop_requested: bool = False


class Runtime(Protocol):
    def start(self, launch: Launch) -> Handle: ...

    def recover(self, handle: Handle) -> Handle:
        """``handle`` completed from what the job wrote itself (its pid), after a restart."""
        ...

    def poll(self, handle: Handle) -> Ended | None:
        """How the job ended; None while it runs."""
        ...

    def terminate(self, handle: Handle) -> None:
        """Ask the job to checkpoint and exit (SIGTERM)."""
        ...

    def kill(self, handle: Handle) -> None:
        """End the job now (SIGKILL)."""
        ...


def read_status(path: str | Path) -> int | None:
    """The exit code the wrapper recorded, None if it recorded none."""
    return read_ended(path).code


def read_ended(path: str | Path) -> Ended:
    """How the wrapper recorded the job's end (code None: it recorded nothing)."""
    try:
        document = json.loads(Path(path).read_text())
        code = document["exit_code"]
    except (OSError, ValueError, KeyError, TypeError):
        return Ended(None)
    if not isinstance(code, int):
        return Ended(None)
    return Ended(code, stop_requested=bool(document.get("stop_requested")))


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, field 22 of
    ``/proc/<pid>/stat``); None if it is gone or a zombie; 0 where ``/proc`` is missing and
    the process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        return 0 if _exists(pid) else None
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


PASSED_ENV = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
    }
)
"""The agent's variables a job inherits (and those named ``LC_*``): where programs and
libraries are and how text is read. Nothing else of the agent's environment reaches a job:
the agent's own settings and token, and whatever secrets its operator's shell held, stay with
the agent."""


def inherited_env() -> dict[str, str]:
    """What of the agent's environment a job inherits (:data:`PASSED_ENV`, ``LC_*``)."""
    return {
        k: v
        for k, v in os.environ.items()
        if (k in PASSED_ENV or k.startswith("LC_")) and not k.startswith("SHOCKWAVE_")
    }


JOB_ENV_FILE = "job.env.json"
"""The file, next to the status file, that hands a job's environment to its wrapper."""


def write_private(path: Path, text: str) -> None:
    """``text`` to a new file ``path`` readable by its owner alone (an old one replaced)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ProcessRuntime:
    """Jobs as local processes, each under the wrapper, in a new session (so its own process
    group: a signal to the group reaches the job and everything it started). A job's
    environment is what it inherits of the agent's (:func:`inherited_env`), ``HOME`` and
    ``TMPDIR`` in its private working directory, and the launch's. The wrapper runs as the
    agent, with the inherited part alone; the job, as the launch's ``uid`` (the wrapper
    switches, :mod:`agent.wrap`), gets its environment through a file of the agent's that the
    wrapper reads and removes, so no variable the job set reaches a process of the agent's
    user."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, launch: Launch) -> Handle:
        launch.log_file.parent.mkdir(parents=True, exist_ok=True)
        launch.status_file.unlink(missing_ok=True)
        launch.pid_file.unlink(missing_ok=True)
        wrapper = [sys.executable, "-I", wrap.__file__]
        if launch.watch is not None:
            wrapper += launch.watch.argv()
        if launch.uid is not None:
            wrapper += [wrap.USER_OPTION, str(launch.uid)]
        env = inherited_env()
        if launch.scratch_dir is not None:
            env |= {"HOME": str(launch.scratch_dir), "TMPDIR": str(launch.scratch_dir)}
        env_file = launch.status_file.with_name(JOB_ENV_FILE)
        write_private(env_file, json.dumps(env | launch.env))
        wrapper += [wrap.ENV_OPTION, str(env_file)]
        wrapper += [str(launch.pid_file), str(launch.status_file)]
        descriptor = os.open(launch.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(descriptor, "ab") as log:
            child = subprocess.Popen(
                [*wrapper, *launch.argv],
                env=inherited_env(),
                cwd=launch.scratch_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._children[child.pid] = child
        planned = Handle.planned("process", launch)
        return replace(planned, pid=child.pid, start_ticks=start_ticks(child.pid) or 0)

    def recover(self, handle: Handle) -> Handle:
        if handle.pid:
            return handle
        try:
            written = json.loads(Path(handle.pid_file).read_text())
            pid, ticks = int(written["pid"]), int(written["start_ticks"])
        except (OSError, ValueError, KeyError, TypeError):
            return handle
        if owner_of(pid) not in (None, os.geteuid()):
            log.warning("%s names pid %d of another user: ignored", handle.pid_file, pid)
            return handle
        return replace(handle, pid=pid, start_ticks=ticks)

    def alive(self, handle: Handle) -> bool:
        """Whether ``handle``'s process still runs and is the one that was started."""
        if handle.pid <= 0:
            return False
        child = self._children.get(handle.pid)
        if child is not None:
            return child.poll() is None
        ticks = start_ticks(handle.pid)
        return ticks is not None and (handle.start_ticks in (0, ticks))

    def poll(self, handle: Handle) -> Ended | None:
        child = self._children.get(handle.pid)
        if child is not None:
            returncode = child.poll()
            if returncode is None:
                return None
            del self._children[handle.pid]
            recorded = read_ended(handle.status_file)
            return recorded if recorded.code is not None else Ended(returncode)
        if self.alive(handle):
            return None
        return read_ended(handle.status_file)

    def terminate(self, handle: Handle) -> None:
        self._signal(handle, signal.SIGTERM)

    def kill(self, handle: Handle) -> None:
        self._signal(handle, signal.SIGKILL)

    def _signal(self, handle: Handle, signum: signal.Signals) -> None:
        if not self.alive(handle):
            return
        with suppress(ProcessLookupError):
            os.killpg(handle.pid, signum)


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """``env`` as a Docker env file (``NAME=value`` a line), readable by its owner alone;
    ValueError for a name or value the format cannot carry (a newline, an ``=`` in a name)."""
    lines = []
    for key, value in sorted(env.items()):
        if not key or "=" in key or any(c in key + value for c in "\r\n\0"):
            raise ValueError(f"the environment variable {key!r} cannot be passed to a container")
        lines.append(f"{key}={value}\n")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.writelines(lines)


CONTAINER_LABEL = "shockwave.attempt"
"""The label every job container carries (its value: the container's name), to find them."""
LIVE_STATES = ("created", "running", "restarting", "paused")


class DockerRuntime:
    """Jobs as Docker containers named ``shockwave-<attempt>`` and labelled
    ``shockwave.attempt``. What a container may do is the agent's to set, never the job's:

    - the image must be a Docker image reference (:mod:`shockwave.domain.image_reference`) and,
      where the operator lists images (``limits.allowed_images``), one they allow; it is the last
      word before the job's command, and no reference can read as an option, so nothing the
      job names ever reaches ``docker run`` as one;
    - it runs as the launch's ``uid`` (its group the same; else the agent's own user), with
      every capability dropped, ``no-new-privileges``, a read-only root file system with a
      private ``/tmp`` (tmpfs, also its ``HOME``), the memory and process limits of
      ``limits``, on ``limits.network`` (the host's network only where the operator chose it),
      and only the lease's GPUs (``--gpus``; inside, numbered from 0);
    - it sees one directory of the host: its job's checkpoint directory, at the same path.

    It runs under Docker's init (signals reach the job, zombies are reaped). The job's
    environment goes to ``docker run`` in an ``--env-file`` readable by the agent alone and
    removed once the container is created, so that no token shows on a command line and
    nothing in it can redirect the ``docker`` command itself.

    A container outlives its agent: an agent restarted on the same work directory finds it by
    name and supervises it again (the process runtime's wrapper stops an orphaned job; a
    container of an agent that never comes back runs until it ends or is removed)."""

    def __init__(
        self, nvidia: bool, user: str | None = None, limits: ContainerLimits | None = None
    ) -> None:
        self.nvidia = nvidia
        self.user = user if user is not None else f"{os.getuid()}:{os.getgid()}"
        self.limits = limits if limits is not None else ContainerLimits()

    def run_argv(self, name: str, launch: Launch, env_file: Path) -> list[str]:
        """``docker run``'s arguments for ``launch`` in the container ``name``; ValueError
        for an image that is no reference or that the operator does not allow."""
        image = launch.image or ""
        if not is_image_reference(image):
            raise ValueError(f"{image!r} is not a Docker image reference")
        allowed = self.limits.allowed_images
        if allowed and not image_allowed(image, allowed):
            raise ValueError(f"the image {image!r} is not among this node's allowed images")
        user = f"{launch.uid}:{launch.uid}" if launch.uid is not None else self.user
        if any(c in str(launch.checkpoint_dir) for c in ',"'):
            raise ValueError(f"{launch.checkpoint_dir}: a comma or quote cannot be mounted")
        mount = f"type=bind,source={launch.checkpoint_dir},target={launch.checkpoint_dir}"
        argv = ["run", "--detach", "--init", "--name", name, "--label", f"{CONTAINER_LABEL}={name}"]
        argv += ["--user", user, "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        argv += ["--read-only", "--tmpfs", f"/tmp:rw,nosuid,nodev,size={self.limits.tmp_size}"]
        argv += ["--network", self.limits.network, "--mount", mount]
        argv += ["--pids-limit", str(self.limits.pids)]
        if self.limits.memory is not None:
            argv += ["--memory", self.limits.memory, "--memory-swap", self.limits.memory]
        if self.nvidia and launch.gpus:
            argv += ["--gpus", f'"device={",".join(str(g) for g in launch.gpus)}"']
        return [*argv, "--env-file", str(env_file), image, *launch.argv]

    def start(self, launch: Launch) -> Handle:
        if launch.image is None:
            raise ValueError("a container needs an image")
        launch.log_file.parent.mkdir(parents=True, exist_ok=True)
        launch.status_file.unlink(missing_ok=True)
        handle = Handle.planned("docker", launch)
        name = handle.container or ""
        env_file = launch.log_file.with_name("container.env")
        argv = self.run_argv(name, launch, env_file)
        self._docker("rm", "--force", name, check=False)
        env = {"HOME": "/tmp", "TMPDIR": "/tmp", **launch.env}
        if self.nvidia and launch.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(launch.gpus)))
        write_env_file(env_file, env)
        try:
            self._docker(*argv)
        except RuntimeError:
            self._docker("rm", "--force", name, check=False)  # created but not started
            raise
        finally:
            env_file.unlink(missing_ok=True)
        return handle

    def recover(self, handle: Handle) -> Handle:
        return handle

    def poll(self, handle: Handle) -> Ended | None:
        """None while the container lives; once it has ended: its exit code, recorded in the
        status file, its output appended to the log, and the container removed. A container
        that is gone (the engine says there is no such container) yields what the status file
        recorded (code None: nothing). When ``docker inspect`` fails otherwise (the engine
        busy or away, the command timing out), nothing is known: None, asked again at the
        next poll. Taking that for an end reported a job that was still training as ended,
        with no status, and left its container running unsupervised."""
        name = handle.container or ""
        inspected = self._docker(
            "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name, check=False
        )
        if inspected.returncode != 0:
            said = (inspected.stderr or inspected.stdout).strip()
            if not any(words in said.lower() for words in NO_SUCH_CONTAINER):
                log.warning("docker inspect %s failed (%s): asked again later", name, said)
                return None
            return Ended(read_status(handle.status_file))
        status, _, code = inspected.stdout.strip().partition(" ")
        if status in LIVE_STATES:
            return None
        logs = self._docker("logs", name, check=False)
        with Path(handle.log_file).open("a") as output:
            output.write(logs.stdout + logs.stderr)
        wrap.write_status(Path(handle.status_file), int(code))
        self._docker("rm", "--force", name, check=False)
        return Ended(int(code))

    def terminate(self, handle: Handle) -> None:
        self._docker("kill", "--signal", "SIGTERM", handle.container or "", check=False)

    def kill(self, handle: Handle) -> None:
        self._docker("kill", handle.container or "", check=False)

    def _docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``docker ARGS``; RuntimeError on failure when ``check``."""
        try:
            done = subprocess.run(
                ["docker", *args],
                capture_output=True,
                text=True,
                timeout=DOCKER_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            done = subprocess.CompletedProcess(["docker", *args], 127, "", str(error))
        if check and done.returncode != 0:
            raise RuntimeError(f"docker {args[0]}: {done.stderr.strip()}")
        return done
