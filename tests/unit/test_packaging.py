"""The installed project carries what it runs: a non-editable install (``pip install .``, as a
GPU host without the source tree does) must ship the Alembic migrations that ``shockwave up``
applies (store/migrate.py resolves them next to the installed packages)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from setuptools import find_namespace_packages  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    return table


def test_the_migrations_and_their_versions_are_packaged() -> None:
    found = set(
        find_namespace_packages(str(ROOT), include=_setuptools()["packages"]["find"]["include"])
    )
    assert {"migrations", "migrations.versions", "store"} <= found
    revisions = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("0*.py"))
    assert revisions, "no migration revisions found"


def test_the_migration_template_is_package_data() -> None:
    assert "script.py.mako" in _setuptools()["package-data"]["migrations"]
    assert (ROOT / "migrations" / "script.py.mako").is_file()


def test_the_dashboard_is_package_data() -> None:
    """The web dashboard (GET /) is served from files inside the api package."""
    assert "dashboard/*" in _setuptools()["package-data"]["api"]
    for name in ("index.html", "dashboard.js", "dashboard.css", "favicon.svg"):
        assert (ROOT / "api" / "dashboard" / name).is_file(), name
