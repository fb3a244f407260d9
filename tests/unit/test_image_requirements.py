"""docker/requirements.py: what the image's dependency layer installs, read from pyproject.toml."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "requirements.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_requirements", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PYPROJECT = {
    "build-system": {"requires": ["setuptools>=68"]},
    "project": {
        "dependencies": ["numpy>=1.26", "httpx"],
        "optional-dependencies": {"torch": ["torch>=2.1"], "dev": ["pytest"]},
    },
}


@pytest.mark.parametrize(
    ("extras", "expected"),
    [
        ([], ["setuptools>=68", "numpy>=1.26", "httpx"]),
        (["torch"], ["setuptools>=68", "numpy>=1.26", "httpx", "torch>=2.1"]),
        (["torch", "dev"], ["setuptools>=68", "numpy>=1.26", "httpx", "torch>=2.1", "pytest"]),
    ],
)
def test_build_requirements_dependencies_and_the_extras_asked_for(
    extras: list[str], expected: list[str]
) -> None:
    assert load().requirements(PYPROJECT, extras) == expected


def test_an_unknown_extra_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"no optional dependency group gpu .*there are: torch, dev"
    ):
        load().requirements(PYPROJECT, ["gpu"])


def test_the_project_s_own_pyproject_from_the_command_line() -> None:
    """As the Dockerfile runs it, in the project root: every dependency, and exit 2 with the
    group named for an unknown one."""
    listed = subprocess.run(
        [sys.executable, str(SCRIPT), "torch"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["torch"])
    assert wanted <= set(listed.stdout.splitlines())
    refused = subprocess.run(
        [sys.executable, str(SCRIPT), "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "nope" in refused.stderr
