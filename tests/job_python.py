"""A Python interpreter that a job running as an unprivileged uid can execute, for tests whose
job commands need the standard library alone."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from agent.isolation import reachable_by_others


def executable_by_others(program: str) -> bool:
    """Whether a user other than its owner may run ``program`` (every folder on its real path
    passable, the file itself executable by others)."""
    real = Path(program).resolve()
    try:
        mode = real.stat().st_mode
    except OSError:
        return False
    return reachable_by_others(real.parent) is None and bool(mode & stat.S_IXOTH)


def job_python() -> str:
    """``sys.executable`` where any uid may run it, else the system's ``python3``; the test
    fails when neither is (a job under its own uid could run no Python here)."""
    if os.geteuid() != 0 or executable_by_others(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")):
        if candidate and executable_by_others(candidate):
            return candidate
    pytest.fail("no Python interpreter that an unprivileged uid may run", pytrace=False)
