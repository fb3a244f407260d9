"""The agent's sign of life for the jobs it started, so that no job outlives its agent for long.

A job runs in a session of its own (under :mod:`agent.wrap`), so that an agent killed and
started again re-attaches to it instead of losing its work. If the agent never comes back, the
server marks the node LOST after its TTL and runs the job elsewhere; a job still training here
then would run in two places at once. So the agent touches a file in its work directory every
fraction of a second, from a thread of its own (a slow request to the API never delays it), and
each wrapper watches that file: when it has not changed for the orphan grace period, the agent
is gone, and the wrapper stops the job itself (SIGTERM, the kill grace, SIGKILL) and records
that it asked for the stop. The orphan grace plus the kill grace must stay below the server's
node TTL: the job is then over, checkpoint written, before the server declares its attempt lost
and another attempt may start from that checkpoint.

Why this and not only the API's fencing (:mod:`store.events`): the wrapper acts on the node
itself, with no network and no cooperation from the training program, so it also stops a
program that does not use the SDK, that is stuck, or that cannot reach the API (a partition).
The fencing remains the second line: whatever still runs after its attempt is fenced cannot
report, and the SDK ends it at its next report.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

TOUCH_INTERVAL_S = 0.25


class Beacon:
    """Touches ``path`` every ``interval_s`` seconds while started, from a daemon thread (it
    dies with the agent, however the agent dies)."""

    def __init__(self, path: Path, interval_s: float = TOUCH_INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def touch(self) -> None:
        """Mark the agent alive now (creates the file if needed)."""
        try:
            os.utime(self.path)
        except FileNotFoundError:
            self.path.touch()

    def start(self) -> None:
        self.touch()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agent-beacon", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.touch()
            except OSError:
                continue
