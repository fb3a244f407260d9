"""``python -I agent/wrap.py [--alive FILE ORPHAN_GRACE_S KILL_GRACE_S] [--user UID]
[--env-file FILE] PID_FILE STATUS_FILE ARGV...``: run ARGV, record how it ended, and stop it if
its agent is gone.

Every process the agent starts runs under this wrapper, as the leader of its own process
group. It writes its own pid and start time to PID_FILE first (so an agent killed before it
saved the pid still finds the process), and the child's exit status to STATUS_FILE
(``{"exit_code": N}``, N = -S for death by signal S, 127 when ARGV cannot be started) before
exiting with the same status: an agent restarted in between, which is not the wrapper's parent
and cannot wait for it, still learns how the job ended.

SIGTERM and SIGINT reach the whole group: the child decides what to do (checkpoint and exit);
the wrapper only keeps waiting for it.

With ``--alive``, the wrapper also watches the agent's sign of life (:mod:`agent.liveness`):
FILE, which the agent touches several times a second. When it has not been touched for
ORPHAN_GRACE_S (counted from the wrapper's start at the earliest), the agent is gone: the
wrapper sends the group SIGTERM, SIGKILL to the child KILL_GRACE_S later, and records
``"stop_requested": 1`` with the exit code, so that a restarted agent reports the stop it asked
for (the job goes back to the queue) rather than a failure or a success.

With ``--user``, ARGV runs as that uid, its group the same number and no supplementary group,
with umask 077, while the wrapper itself keeps the agent's user: the job cannot signal or read
its wrapper, nor forge PID_FILE and STATUS_FILE (which live in a directory of the agent's). With
``--env-file``, ARGV's environment is the JSON object in FILE (read, then removed) instead of the
wrapper's own: what the job set (``LD_PRELOAD``, ``PYTHONPATH``...) never reaches the wrapper.

Only the standard library is imported, so this file runs as a script (``python -I``: isolated,
its folder not put on the path and no ``PYTHON*`` variable read) without the agent package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NOT_STARTED = 127
ALIVE_OPTION = "--alive"
USER_OPTION = "--user"
ENV_OPTION = "--env-file"
JOB_UMASK = 0o077
WATCH_TICK_S = 0.25


@dataclass(frozen=True, slots=True)
class Watch:
    """The agent's sign of life to watch: ``alive_file``, and how long it may stay untouched
    (``orphan_grace_s``) before the job is stopped, with ``kill_grace_s`` from SIGTERM to
    SIGKILL."""

    alive_file: Path
    orphan_grace_s: float
    kill_grace_s: float

    def argv(self) -> list[str]:
        """The wrapper's options for this watch."""
        return [
            ALIVE_OPTION,
            str(self.alive_file),
            str(self.orphan_grace_s),
            str(self.kill_grace_s),
        ]


def write_status(path: Path, exit_code: int, *, stop_requested: bool = False) -> None:
    """Record ``exit_code`` in the status file ``path`` (and that the wrapper itself asked the
    process to stop, its agent being gone)."""
    document = {"exit_code": exit_code}
    if stop_requested:
        document["stop_requested"] = 1
    write_json(path, document)


def write_json(path: Path, document: dict[str, int]) -> None:
    """Write ``document`` to ``path`` atomically (rename) and durably."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def own_start_ticks() -> int:
    """This process's start time in clock ticks since boot (0 without ``/proc``)."""
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def seconds_since_alive(path: Path, since: float, now: float) -> float:
    """Seconds at ``now`` since the agent last touched ``path``, counted from ``since`` at the
    earliest (the wrapper's start: a file left by an earlier agent does not count against it)."""
    try:
        touched = path.stat().st_mtime
    except OSError:
        touched = since
    return now - max(touched, since)


@dataclass(frozen=True, slots=True)
class Job:
    """How to run ARGV: as ``uid`` (None: the wrapper's own user), with the environment in
    ``env_file`` (None: the wrapper's own)."""

    uid: int | None = None
    env_file: Path | None = None


def read_env(path: Path) -> dict[str, str]:
    """The job's environment from ``path`` (a JSON object of strings), then ``path`` removed."""
    try:
        document = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
    if not isinstance(document, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in document.items()
    ):
        raise ValueError(f"{path}: not a JSON object of strings")
    return document


def run(
    pid_file: Path,
    status_file: Path,
    argv: list[str],
    watch: Watch | None = None,
    job: Job = Job(),
) -> int:
    """Run ``argv`` to its end, record its status; the wrapper's own exit status."""
    write_json(pid_file, {"pid": os.getpid(), "start_ticks": own_start_ticks()})
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)  # caught, not ignored: exec resets it for ARGV
    started = time.time()
    try:
        env = read_env(job.env_file) if job.env_file is not None else None
        if job.uid is None:
            child = subprocess.Popen(argv, env=env)
        else:
            child = subprocess.Popen(
                argv,
                env=env,
                user=job.uid,
                group=job.uid,
                extra_groups=[],
                umask=JOB_UMASK,
            )
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        say(f"cannot start {argv[0]!r}: {error}")
        write_status(status_file, NOT_STARTED)
        return NOT_STARTED
    code, orphaned = wait(child, watch, started)
    write_status(status_file, code, stop_requested=orphaned)
    return code if code >= 0 else 128 - code


def wait(child: subprocess.Popen[bytes], watch: Watch | None, started: float) -> tuple[int, bool]:
    """Wait for ``child``; with a ``watch``, stop it once the agent is gone. Its exit status
    and whether the wrapper asked it to stop."""
    if watch is None:
        return child.wait(), False
    terminated_at: float | None = None
    killed = False
    while True:
        try:
            return child.wait(timeout=WATCH_TICK_S), terminated_at is not None
        except subprocess.TimeoutExpired:
            pass
        now = time.time()
        if terminated_at is None:
            silent = seconds_since_alive(watch.alive_file, started, now)
            if silent > watch.orphan_grace_s:
                say(f"no sign of the agent for {silent:.1f} s: stopping the job (SIGTERM)")
                terminated_at = now
                terminate(child)
        elif not killed and now - terminated_at > watch.kill_grace_s:
            say("the job outlived the grace period: SIGKILL")
            killed = True
            child.kill()


def terminate(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the wrapper's process group (the job and all it started) when the wrapper
    leads one, as under the agent; else to the child alone."""
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGTERM)
    else:
        child.terminate()


def say(message: str) -> None:
    print(f"agent.wrap: {message}", file=sys.stderr, flush=True)


def parse(args: list[str]) -> tuple[Path, Path, list[str], Watch | None, Job] | None:
    """``(pid_file, status_file, argv, watch, job)`` from the command line; None if
    malformed."""
    watch = None
    uid: int | None = None
    env_file: Path | None = None
    try:
        while args[:1] in ([ALIVE_OPTION], [USER_OPTION], [ENV_OPTION]):
            if args[0] == ALIVE_OPTION:
                watch = Watch(Path(args[1]), float(args[2]), float(args[3]))
                args = args[4:]
            elif args[0] == USER_OPTION:
                uid = int(args[1])
                args = args[2:]
            else:
                env_file = Path(args[1])
                args = args[2:]
    except (IndexError, ValueError):
        return None
    if len(args) < 3:
        return None
    return Path(args[0]), Path(args[1]), args[2:], watch, Job(uid, env_file)


def main(args: list[str]) -> int:
    parsed = parse(args)
    if parsed is None:
        print(
            "usage: wrap.py [--alive FILE ORPHAN_GRACE_S KILL_GRACE_S] [--user UID] "
            "[--env-file FILE] PID_FILE STATUS_FILE ARGV...",
            file=sys.stderr,
        )
        return 2
    pid_file, status_file, argv, watch, job = parsed
    return run(pid_file, status_file, argv, watch, job)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
