"""Fixtures shared by every test tier."""

from __future__ import annotations

from pathlib import Path

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
