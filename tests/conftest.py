"""Fixtures shared by every test tier."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _project_root() -> Path:
    here = Path(__file__).resolve()
    for directory in here.parents:
        if (directory / "pyproject.toml").is_file():
            return directory
    return here.parents[1]


REFERENCE_DIR = _project_root().parent / "shared" / "data" / "reference"
"""The reference Shockwave data, read in place from ``<project root>/../shared/data/reference``."""


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """Path of the reference data; fails (never skips) when it is missing."""
    if not (REFERENCE_DIR / "README.md").is_file():
        pytest.fail(
            f"reference data not found at {REFERENCE_DIR}: tests need the shared reference data "
            "(traces, trajectories, throughputs) next to the project, at ../shared/data/reference",
            pytrace=False,
        )
    return REFERENCE_DIR


E2E_TESTS = "tests/e2e/"
REST_NICENESS = 5
"""How much lower the priority of an xdist worker once it runs tests outside tests/e2e: the
end-to-end tests beside it wait on process starts and rounds under time bounds, the rest do
not (or with far wider bounds)."""
_reniced: list[bool] = []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``make test`` runs ``-n 2``): each test module is one unit of work,
    and all of ``tests/e2e`` is one, sent first. The end-to-end tests thus run one after another
    on one worker while the others run the rest: each starts a deployment of several processes
    and waits on them, and two at once on 2 cores would stretch the waits their time bounds were
    set for. (pytest-xdist's own ``--dist loadgroup`` marks do not take on pytest 9.2: it renames
    node ids through an attribute pytest no longer reads.)"""
    if config.getvalue("dist") not in ("load", "loadfile", "loadscope", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndApart(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return E2E_TESTS if module.startswith(E2E_TESTS) else module

    config.option.loadscopereorder = False  # collection order: tests/e2e first, the longest
    return EndToEndApart(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On an xdist worker, the first test outside tests/e2e lowers the worker's priority (and
    that of what it starts) by ``REST_NICENESS``: under load, the end-to-end tests' processes
    on the other worker come first (a start that takes 30 s instead of 5 fails their bounds)."""
    if _reniced or "PYTEST_XDIST_WORKER" not in os.environ:
        return
    if not item.nodeid.startswith(E2E_TESTS):
        os.nice(REST_NICENESS)
        _reniced.append(True)


@pytest.fixture
def passable_tmp_path() -> Iterator[Path]:
    """A fresh folder that every user may pass through (mode 0711, in the system's temporary
    folder), removed afterwards: an agent running as root (as the tests do) runs each job as a
    uid of its own, which must reach its directories below the agent's work directory, and
    pytest keeps its ``tmp_path`` folders closed to other users (0700)."""
    folder = Path(tempfile.mkdtemp(prefix="shockwave-passable-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
