"""Keeping the jobs on a node apart: a pool of unprivileged uids, one per running attempt, and
private directories owned by that uid.

Each attempt of an agent running as root runs as a uid of its own from :class:`UidPool` (its
group the same number, no supplementary groups). The kernel then keeps the jobs apart: a
process cannot read ``/proc/<pid>/environ`` of another uid (nor ptrace or signal it), and a
directory of mode 0700 is closed to every uid but its owner. A uid is taken under a lock file
(``flock``, in a directory only root may write) and only when no process runs as it, so two
agents on one machine never hand out the same uid, and one whose last job left a process
behind is not reused until that process is gone; when an attempt ends, every process still
running as its uid is killed (:func:`reap`) before the uid goes back to the pool.

An agent that is not root cannot switch users: its jobs run as its own uid, and none of this
applies (the agent says so at start, :func:`isolation_warning`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

DEFAULT_UIDS = (60000, 60999)
"""The pool an agent running as root uses unless told otherwise (``--job-uids``)."""
DEFAULT_LOCK_DIR = Path("/run/shockwave/job-uids")
PRIVATE = 0o700
PASSAGE = 0o711
"""A directory others may pass through to what they own below it, but not list."""


class PoolExhausted(Exception):
    """Every uid of the pool is taken (by this agent, another agent or a lingering process)."""


def can_switch_users() -> bool:
    """Whether this process may run its jobs as other uids (it is root)."""
    return os.geteuid() == 0


def parse_uids(text: str) -> tuple[int, int] | None:
    """``--job-uids``: ``FIRST-LAST`` (inclusive, unprivileged: 1000 to 2^31-2), or ``off``
    (None). ValueError for anything else."""
    if text == "off":
        return None
    first, dash, last = text.partition("-")
    if not dash or not first.isdigit() or not last.isdigit():
        raise ValueError(f"expected FIRST-LAST (e.g. 60000-60999) or off, got {text!r}")
    low, high = int(first), int(last)
    if not 1000 <= low <= high < 2**31 - 1:
        raise ValueError(f"a uid range from 1000 up, first <= last, got {text!r}")
    return low, high


def processes_of(uid: int) -> list[int]:
    """The pids of the live processes (zombies aside) whose real or effective uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                for line in status:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break
                    if line.startswith("Uid:"):
                        real, effective = line.split()[1:3]
                        if uid in (int(real), int(effective)):
                            found.append(int(entry.name))
                        break
        except (OSError, ValueError):
            continue
    return found


def reap(uid: int) -> int:
    """Kill (SIGKILL) every process running as ``uid``; how many were signalled. Repeated
    until none is left (a process may fork while its siblings are killed), a few times."""
    signalled = 0
    for _ in range(5):
        pids = processes_of(uid)
        if not pids:
            break
        for pid in pids:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                signalled += 1
    return signalled


def owner_of(pid: int) -> int | None:
    """The real uid of process ``pid``; None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@dataclass
class UidPool:
    """The uids ``first`` to ``last`` (inclusive), handed out one per attempt. ``lock_dir``
    holds one lock file per uid (``flock`` held while this agent uses it)."""

    first: int
    last: int
    lock_dir: Path = DEFAULT_LOCK_DIR
    _held: dict[int, IO[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        secure_dir(self.lock_dir)

    def take(self) -> int:
        """A free uid, locked for this agent; :class:`PoolExhausted` if none is."""
        for uid in range(self.first, self.last + 1):
            if uid in self._held:
                continue
            if self.claim(uid):
                if not processes_of(uid):
                    return uid
                self.release(uid)
        raise PoolExhausted(f"every uid from {self.first} to {self.last} is in use")

    def claim(self, uid: int) -> bool:
        """Lock ``uid`` for this agent (an agent restarted re-claims its attempts' uids);
        whether it got it."""
        if uid in self._held:
            return True
        path = self.lock_dir / str(uid)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        handle = os.fdopen(descriptor, "rb+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            handle.close()
            if error.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._held[uid] = handle
        return True

    def holds(self, uid: int) -> bool:
        """Whether this agent holds ``uid`` (its processes are this agent's to end)."""
        return uid in self._held

    def release(self, uid: int) -> None:
        handle = self._held.pop(uid, None)
        if handle is not None:
            handle.close()


def secure_dir(path: Path, mode: int = PRIVATE) -> None:
    """Make ``path`` (and its missing parents) a directory of this process's user with
    ``mode``; OSError if it is a symbolic link or belongs to another user (someone else could
    change what is in it)."""
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise OSError(f"{path} must be a directory of uid {os.geteuid()}, not a link or another's")
    os.chmod(path, mode)


def private_dir(path: Path, uid: int | None) -> None:
    """``path`` made a directory only ``uid`` may enter (mode 0700, owned by ``uid`` and its
    group of the same number); with ``uid`` None, only this process's user. Never follows a
    symbolic link at ``path``."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode):
        raise OSError(f"{path} is not a directory")
    if uid is not None:
        os.chown(path, uid, uid, follow_symlinks=False)
    os.chmod(path, PRIVATE)


def hand_over(path: Path, uid: int) -> None:
    """Give ``path`` and everything below it to ``uid`` (a checkpoint directory that an
    earlier attempt of the same job, under another uid, wrote), mode 0700 at the top.
    Walks by file descriptor and never follows a symbolic link, so nothing a job left there
    (a link to ``/etc``, a directory swapped for a link) makes the agent change a file
    outside it."""
    private_dir(path, uid)
    for _, dirs, files, parent in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            with suppress(FileNotFoundError):
                os.chown(name, uid, uid, dir_fd=parent, follow_symlinks=False)


def reachable_by_others(path: Path) -> Path | None:
    """The first directory from ``/`` down to ``path`` that other users cannot pass through
    (no execute bit for others), None if they can reach ``path``: a job running as a pool uid
    must reach its directories under the agent's work directory."""
    current = Path(path).resolve()
    for folder in (*reversed(current.parents), current):
        try:
            mode = folder.stat().st_mode
        except OSError:
            return folder
        if not mode & stat.S_IXOTH:
            return folder
    return None


def isolation_warning(runtime: str, uids: tuple[int, int] | None) -> str | None:
    """What the agent says at start when its jobs are not kept apart by uid; None when they
    are."""
    if uids is not None and can_switch_users():
        return None
    if can_switch_users():
        why = "--job-uids off"
    else:
        why = f"the agent runs as uid {os.geteuid()}, not root, and cannot switch users"
    if runtime == "docker":
        return (
            f"job isolation reduced ({why}): containers run as the agent's uid and share it; "
            "each still sees only its own checkpoint directory and environment"
        )
    return (
        f"job isolation OFF ({why}): every job runs as uid {os.geteuid()}, the agent's own, "
        "so a job can read the other jobs' environments (their job tokens), their checkpoint "
        "and working directories, and signal them; and read this agent's token from "
        "/proc/<agent pid>/environ unless it came from --token-file. Run the agent as root "
        "(with --job-uids) to run each job as a uid of its own"
    )
