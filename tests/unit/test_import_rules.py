"""The import rules of docs/architecture.md hold, and `make lint` would catch a break of each.

``lint-imports`` (import-linter, configured in pyproject.toml) runs on a copy of the project's
packages: as they are it must keep every contract; with one deliberate violation added it must
fail and name the contract that broke.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "shockwave",
    "store",
    "api",
    "solver_service",
    "agent",
    "shockwave_sdk",
    "shockwave_fleet",
    "shockwave_cli",
    "bench",
    "tests",
)
LAYERS = "Layers: tests > bench > shockwave_cli > the shells > store > shockwave (the core)"
CORE = "The core imports no service package, no shell and no I/O library"
AGENT = (
    "The agent, the SDK and the simulated fleet speak HTTP only: they import no server-side package"
)
CORE_LAYERS = (
    "The core's layers: simulation > policies > rounds > market > prediction > workloads > domain"
)
CLI_LAYERS = "The command line's layers: reference > main > commands > reports | runtime | client"
STORE = "The data layer raises domain errors: no HTTP, no broker, no terminal"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on ``tree`` (a copy of the project), as ``make lint`` runs it."""
    command = Path(sys.executable).with_name("lint-imports")
    assert command.is_file(), "import-linter is not installed: pip install -e '.[dev]'"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(command), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The project's packages and its pyproject.toml, copied."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_project_keeps_every_import_rule(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert broken_contracts(result.stdout) == set()


@pytest.mark.parametrize(
    ("module", "violation", "broken"),
    [
        pytest.param(
            "shockwave/simulation/metrics.py",
            "import api.app",
            {LAYERS, CORE},
            id="core-imports-api",
        ),
        pytest.param(
            "shockwave/market/planner.py", "import sqlalchemy", {CORE}, id="core-imports-sqlalchemy"
        ),
        pytest.param(
            "shockwave/domain/snapshot.py",
            "import shockwave.prediction.predictor",
            {CORE_LAYERS},
            id="domain-imports-prediction",
        ),
        pytest.param(
            "shockwave/market/planner.py",
            "import shockwave.policies.policy",
            {CORE_LAYERS},
            id="market-imports-policies",
        ),
        pytest.param(
            "shockwave_fleet/fleet.py", "import store.tables", {AGENT}, id="fleet-imports-store"
        ),
        pytest.param(
            "shockwave_cli/runtime/demo.py",
            "import shockwave_cli.commands.jobs_commands",
            {CLI_LAYERS},
            id="runtime-imports-commands",
        ),
        pytest.param(
            "shockwave_cli/client/jobs_render.py",
            "import shockwave_cli.reports.plots",
            {CLI_LAYERS},
            id="client-imports-reports",
        ),
        pytest.param(
            "api/app.py", "from solver_service import enqueue", {LAYERS}, id="api-imports-solver"
        ),
        pytest.param(
            "solver_service/planning.py", "import api.errors", {LAYERS}, id="solver-imports-api"
        ),
        pytest.param("store/jobs.py", "import api.errors", {LAYERS, STORE}, id="store-imports-api"),
        pytest.param("agent/loop.py", "import store.tables", {AGENT}, id="agent-imports-store"),
        pytest.param(
            "shockwave_sdk/client.py",
            "import solver_service",
            {LAYERS, AGENT},
            id="sdk-imports-solver",
        ),
        pytest.param(
            "bench/servers.py", "import tests.builders", {LAYERS}, id="bench-imports-tests"
        ),
        pytest.param(
            "store/events.py",
            "import shockwave_cli.main",
            {LAYERS, STORE, CLI_LAYERS},  # the runtime imports the store: now it reaches the app
            id="store-imports-cli",
        ),
    ],
)
def test_a_deliberate_violation_fails_the_lint(
    tree: Path, module: str, violation: str, broken: set[str]
) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{violation}  # deliberate violation\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert broken_contracts(result.stdout) == broken, result.stdout


def broken_contracts(report: str) -> set[str]:
    """The names of the contracts ``lint-imports`` reported as BROKEN (its lines wrap)."""
    text = " ".join(report.split())
    names = {LAYERS, CORE_LAYERS, CLI_LAYERS, CORE, AGENT, STORE}
    found = {name for name in names if f"{name} BROKEN" in text}
    kept = {name for name in names if f"{name} KEPT" in text}
    assert found | kept == names, "a contract is missing from the report"
    return found
