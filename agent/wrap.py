"""``python -P agent/wrap.py PID_FILE STATUS_FILE ARGV...``: run ARGV, record how it ended.

Every process the agent starts runs under this wrapper, as the leader of its own process
group. It writes its own pid and start time to PID_FILE first (so an agent killed before it
saved the pid still finds the process), and the child's exit status to STATUS_FILE
(``{"exit_code": N}``, N = -S for death by signal S, 127 when ARGV cannot be started) before
exiting with the same status: an agent restarted in between, which is not the wrapper's parent
and cannot wait for it, still learns how the job ended.

SIGTERM and SIGINT reach the whole group: the child decides what to do (checkpoint and exit);
the wrapper only keeps waiting for it. Only the standard library is imported, so this file runs
as a script (``python -P``: its folder is not put on the path) without the agent package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

NOT_STARTED = 127


def write_status(path: Path, exit_code: int) -> None:
    """Record ``exit_code`` in the status file ``path``."""
    write_json(path, {"exit_code": exit_code})


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


def run(pid_file: Path, status_file: Path, argv: list[str]) -> int:
    """Run ``argv`` to its end, record its status; the wrapper's own exit status."""
    write_json(pid_file, {"pid": os.getpid(), "start_ticks": own_start_ticks()})
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)  # caught, not ignored: exec resets it for ARGV
    try:
        child = subprocess.Popen(argv)
    except OSError as error:
        print(f"agent.wrap: cannot start {argv[0]!r}: {error}", file=sys.stderr, flush=True)
        write_status(status_file, NOT_STARTED)
        return NOT_STARTED
    code = child.wait()
    write_status(status_file, code)
    return code if code >= 0 else 128 - code


def main(args: list[str]) -> int:
    if len(args) < 3:
        print("usage: wrap.py PID_FILE STATUS_FILE ARGV...", file=sys.stderr)
        return 2
    return run(Path(args[0]), Path(args[1]), args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
