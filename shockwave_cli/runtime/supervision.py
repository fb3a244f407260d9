"""Supervising the service's processes: start one, see whether it answers, stop it for good.

One helper for everyone who starts processes of the service: ``shockwave up --demo`` (its node
agents), the benchmarks (API processes, solver workers, round drivers) and the end-to-end
tests. A :class:`Supervised` process runs in a session of its own with its output appended to
a log file; :meth:`Supervised.stop` sends SIGTERM to its whole process group, waits out a grace
period, then SIGKILLs what is left (a Celery worker's pool children die with it, as on a
crashed machine), and :meth:`Supervised.kill` is kill -9 at once. A :class:`Supervisor` starts
processes by name and stops every one of them at the end. Failures quote the log's tail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 5.0
"""How long a stopped process has to exit after SIGTERM before it is SIGKILLed."""


def shockwave_argv(from_cwd: bool = False) -> list[str]:
    """The ``shockwave`` command of this interpreter: its console script when installed next to
    it, else the same entry point through ``python -c``; ``from_cwd`` always takes the latter,
    which imports the project from the process's working directory first (a benchmark run on
    another source tree)."""
    script = Path(sys.executable).parent / "shockwave"
    if script.is_file() and not from_cwd:
        return [str(script)]
    return [sys.executable, "-c", "from shockwave_cli.main import app; app()"]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class NotReady(RuntimeError):
    """What was waited for did not happen in time, or a process died before it could."""


def wait_until(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str | Callable[[], str],
    poll_s: float = 0.1,
) -> None:
    """Poll ``condition`` until it holds; :class:`NotReady` naming ``what`` after
    ``timeout_s`` (``condition`` may raise to give up early). ``what`` may be a callable, called
    only on timeout: a message that carries log tails then shows them as they were when the wait
    gave up, not as they were when it began."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise NotReady(f"timed out after {timeout_s:.0f}s waiting for {said}")
        time.sleep(poll_s)


@dataclass
class Supervised:
    """One process: ``argv`` run in ``cwd`` with exactly ``env``, its output in ``log_path``."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    cwd: Path | None = None
    grace_s: float = STOP_GRACE_S
    process: subprocess.Popen[bytes] | None = None
    continues_log: bool = False
    """Whether its first start goes on with an existing log (a process of the same name that
    ran before it) instead of beginning a new one."""
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> Supervised:
        """Start it in a session of its own; again, after it stopped (its log then goes on:
        a first start begins a new log, unless ``continues_log``)."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        self._close_log()
        going_on = self.process is not None or self.continues_log
        self._log = self.log_path.open("ab" if going_on else "wb")
        self._log.write(f"\n=== start {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            list(self.argv),
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.cwd,
        )
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} never started")
        return self.process.pid

    def signal(self, number: signal.Signals) -> None:
        """Send ``number`` to the process's whole group (nothing if it is gone)."""
        if self.process is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, number)

    def kill(self) -> None:
        """SIGKILL the process and everything it started (kill -9, no chance to clean up)."""
        self.signal(signal.SIGKILL)
        self.wait(self.grace_s)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL whatever is left after the grace period."""
        self.signal(signal.SIGTERM)
        self.finish(time.monotonic() + self.grace_s)

    def finish(self, deadline: float) -> None:
        """Wait for a process asked to stop until ``deadline`` (monotonic), then SIGKILL its
        group; also SIGKILL children that outlived it."""
        if not self.wait(max(0.0, deadline - time.monotonic())):
            self.signal(signal.SIGKILL)
            self.wait(self.grace_s)
        self.signal(signal.SIGKILL)

    def wait(self, timeout_s: float) -> bool:
        """Whether the process exited (and was reaped) within ``timeout_s``."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        self._close_log()
        return True

    def log_tail(self, chars: int = 4000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def cpu_seconds(self) -> float:
        """User and system CPU seconds used so far by the processes of its group (Linux
        /proc; 0 for a process that is gone)."""
        return group_cpu_seconds([self.pid]).get(self.pid, 0.0) if self.process else 0.0

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_together(processes: Iterable[Supervised], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every process at once, give them ``grace_s`` together, then SIGKILL the rest
    (each stops its own work meanwhile: agents checkpoint their jobs)."""
    running = [p for p in processes if p.alive]
    for process in running:
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in running:
        process.finish(deadline)


def group_cpu_seconds(groups: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) used so far by the processes of each process group."""
    used = dict.fromkeys(groups, 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        group = int(fields[2])
        if group in used:
            used[group] += (int(fields[11]) + int(fields[12])) / tick
    return used


class Supervisor:
    """Starts processes by name (logs in ``log_dir``, environment ``env`` plus each one's own)
    and stops every one it started at the end, the last started first (use as a context
    manager)."""

    def __init__(self, log_dir: Path, env: Mapping[str, str], cwd: Path | None = None) -> None:
        self.log_dir = log_dir
        self.env = dict(env)
        self.cwd = cwd
        self.started: list[Supervised] = []

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        grace_s: float = STOP_GRACE_S,
    ) -> Supervised:
        """Start ``argv`` as the process ``name``; a name started before (an agent started
        again after a kill) goes on in the same log, so the log keeps every run of it."""
        process = Supervised(
            name=name,
            argv=list(argv),
            env={**self.env, **(env or {})},
            log_path=self.log_dir / f"{name}.log",
            cwd=self.cwd,
            grace_s=grace_s,
            continues_log=any(p.name == name for p in self.started),
        )
        self.started.append(process)
        return process.start()

    def shockwave(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Supervised:
        """Start ``shockwave <args>``."""
        return self.start(name, [*shockwave_argv(), *args], env)

    def module(
        self, name: str, module: str, *args: str, env: Mapping[str, str] | None = None
    ) -> Supervised:
        """Start ``python -m <module> <args>`` with this interpreter."""
        return self.start(name, [sys.executable, "-m", module, *args], env)

    def named(self, name: str) -> Supervised:
        """The last process started as ``name``."""
        return next(p for p in reversed(self.started) if p.name == name)

    def stop_all(self) -> None:
        """Stop every process started, the last first."""
        for process in reversed(self.started):
            process.stop()

    def logs(self) -> str:
        """Every process's log tail, for a failure message."""
        return "\n".join(f"--- {p.name} ({p.log_path})\n{p.log_tail()}" for p in self.started)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each process started (with its children), by name."""
        groups = {p.pid: p.name for p in self.started if p.process is not None}
        used = group_cpu_seconds(groups)
        return {groups[pid]: seconds for pid, seconds in used.items()}


def answers(url: str, process: Supervised | None = None, timeout_s: float = 1.0) -> bool:
    """Whether ``url`` answers 200 now; :class:`NotReady` with the log's tail if ``process``
    has exited (waiting for it is pointless)."""
    if process is not None and not process.alive:
        raise NotReady(f"{process.name} exited:\n{process.log_tail()}")
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http(
    url: str,
    process: Supervised,
    timeout_s: float,
    logs: Callable[[], str] | None = None,
) -> None:
    """Wait until ``url`` answers 200 (an API's /healthz or /readyz); fail if ``process``
    exits first or ``timeout_s`` passes, quoting ``logs()`` (default: its own log)."""
    wait_until(
        lambda: answers(url, process),
        timeout_s,
        f"{process.name} at {url}\n{logs() if logs else process.log_tail()}",
    )
