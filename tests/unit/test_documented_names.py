"""Every Python name the documentation, the README and the examples give resolves in the code.

The pages name modules and functions as dotted paths (``shockwave.rounds.engine.boundary``) and
show imports (``from shockwave_sdk import JobEnvironment``); a module that moves or a name that
is renamed without its pages makes this test fail, naming the page and the name.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shockwave", "shockwave_sdk", "shockwave_cli", "shockwave_fleet")
NOT_CODE = {
    "shockwave.db",  # the embedded service's SQLite file
    "shockwave.attempt",  # the container label the agent sets on a job's container
}
"""Dotted words in the pages that look like the packages' names but are not Python."""

_ROOTS = "|".join(PACKAGES)
DOTTED = re.compile(rf"(?<![\w./-])((?:{_ROOTS})(?:\.[A-Za-z_]\w*)+)")
FROM_IMPORT = re.compile(rf"\bfrom\s+((?:{_ROOTS})(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]+)")


def pages() -> list[Path]:
    found = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    found += sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in (".md", ".py"))
    return found


def documented_names() -> set[tuple[str, str]]:
    """(page, dotted name) for every name a page gives: dotted paths and imported names."""
    names: set[tuple[str, str]] = set()
    for page in pages():
        text = page.read_text()
        where = page.relative_to(ROOT).as_posix()
        for dotted in DOTTED.findall(text):
            names.add((where, dotted))
        for module, imported in FROM_IMPORT.findall(text):
            for part in imported.strip("()").replace("\n", " ").split(","):
                name = part.split("#")[0].split(" as ")[0].strip()
                if name.isidentifier():
                    names.add((where, f"{module}.{name}"))
        if page.suffix == ".py":
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.module:
                    if node.module.split(".")[0] in PACKAGES:
                        names.update((where, f"{node.module}.{a.name}") for a in node.names)
                elif isinstance(node, ast.Import):
                    names.update(
                        (where, a.name) for a in node.names if a.name.split(".")[0] in PACKAGES
                    )
    return {(where, name) for where, name in names if name not in NOT_CODE}


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            target: object = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and module_name.startswith(error.name):
                continue  # this prefix is not a module; a shorter one may be
            raise
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


NAMES = sorted(documented_names())


def test_the_pages_name_code() -> None:
    """The scan finds the names the pages are known to give (so an empty scan cannot pass)."""
    found = {name for _, name in NAMES}
    assert "shockwave.rounds.engine.boundary" in found
    assert "shockwave_sdk.JobEnvironment" in found
    assert len(found) >= 20


@pytest.mark.parametrize(("page", "name"), NAMES, ids=[f"{p}:{n}" for p, n in NAMES])
def test_a_documented_name_resolves(page: str, name: str) -> None:
    try:
        resolve(name)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{page} names {name}, which does not resolve: {error}")
