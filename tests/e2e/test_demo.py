"""``shockwave up --demo``: the embedded service, local agents and the demo workload of real
training jobs, run as a newcomer would (here with two agents and short rounds, so that it ends
within a minute or so), without a terminal: it prints one line per event and the final table,
and exits 0 once every demo job is done. Every process it started is gone afterwards.

Marked ``slow`` (about a minute): `make test-slow` runs it; `tests/e2e/test_embedded.py` covers
`shockwave up` in the default suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from contextlib import suppress
from pathlib import Path

import pytest

from bench.deployment import base_env
from shockwave_cli.runtime.demo import DEMO_JOBS
from shockwave_cli.runtime.supervision import free_port, shockwave_argv

NOWHERE_ENV = base_env("postgresql+psycopg://nobody@127.0.0.1:1/none", "redis://127.0.0.1:1/0")
TIMEOUT_S = 180


@pytest.mark.slow
def test_demo_runs_every_job_to_the_end(tmp_path: Path) -> None:
    env = {**NOWHERE_ENV, "TMPDIR": str(tmp_path)}
    argv = [*shockwave_argv(), "up", "--demo", "--agents", "2", "--slots", "2"]
    argv += ["--round-seconds", "2", "--port", str(free_port())]
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(
            f"the demo did not end within {TIMEOUT_S} s:\n{output[-5000:]}"
        ) from None
    finally:
        leftovers = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _mentions(entry, str(tmp_path))
        ]
        for pid in leftovers:  # its agents and jobs, if it could not stop them
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 0, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    total = len(DEMO_JOBS)
    assert f"Demo done: {total} of {total} jobs finished ({total} succeeded)" in output, output
    assert re.search(r"[1-9]\d* preemptions", output), output[-3000:]
    assert re.search(r"[1-9]\d* batch-size changes", output), output[-3000:]
    for job in DEMO_JOBS:
        assert f"{job.name}: finished" in output, (job.name, output[-3000:])
    assert "demo-1" in output and "demo-2" in output, output[-3000:]
    assert not leftovers, f"processes of the demo outlived it: {leftovers}"


def _mentions(entry: Path, marker: str) -> bool:
    """Whether the process's command line or environment names ``marker`` (this test's
    temporary directory, where the demo keeps its files)."""
    try:
        text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
    except OSError:
        return False
    return marker.encode() in text and int(entry.name) != os.getpid()
