"""The scripts that run the GPU check on a lent machine with no network: which wheels they
carry there (scripts/gpu_wheels.sh --list, no download) and how the device side fails."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    run = subprocess.run(
        [str(ROOT / "scripts" / "gpu_wheels.sh"), "--list"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    pins = dict(line.split("==") for line in run.stdout.split())
    assert pins, run.stderr
    return pins


def test_the_wheels_are_the_runtime_closure_at_the_tested_versions() -> None:
    pins = _pins()
    # direct dependencies, their own (fastapi's opentelemetry-api) and the extras the project
    # asks for (uvicorn[standard], psycopg[binary], celery[redis])
    for name in ("pyscipopt", "fastapi", "sqlmodel", "celery", "opentelemetry-api"):
        assert name in pins
    for name in ("httptools", "psycopg-binary", "redis"):
        assert name in pins, f"{name}: an extra the project names is not followed"
    # the large ones the device image holds stay behind, and nothing of the dev/torch groups
    for name in ("numpy", "matplotlib", "torch", "pytest", "mypy"):
        assert name not in pins
    for name, pinned in pins.items():
        assert pinned == version(name), name


def test_the_skip_list_is_a_setting() -> None:
    run = subprocess.run(
        [str(ROOT / "scripts" / "gpu_wheels.sh"), "--list"],
        env={**os.environ, "PYTHON": sys.executable, "SKIP_WHEELS": "numpy pyscipopt"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = {line.split("==")[0] for line in run.stdout.split()}
    assert "pyscipopt" not in names
    assert "matplotlib" in names  # no longer skipped


def test_without_a_venv_it_says_so() -> None:
    run = subprocess.run(
        [str(ROOT / "scripts" / "gpu_wheels.sh"), "--list"],
        env={**os.environ, "PYTHON": "/nonexistent/python"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2
    assert "make venv" in run.stderr


def test_the_device_side_refuses_to_run_without_wheels(tmp_path: Path) -> None:
    run = subprocess.run(
        [str(ROOT / "scripts" / "device_gpu_check.sh")],
        env={**os.environ, "WHEELS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2
    assert "no wheels in" in run.stderr and "gpu_wheels.sh" in run.stderr
