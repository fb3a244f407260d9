"""The documentation's generated references cover every command, option, setting and API
operation, and refuse to render one without a description; the hand-written pages carry no
development history."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import pytest
import typer
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.settings import Settings
from shockwave_cli import reference
from shockwave_cli.main import app
from solver_service.driver import DriverSettings
from solver_service.settings import SolverSettings
from store.settings import DatabaseSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference.pages()


def _command_paths(command: typer.core.TyperGroup, path: str) -> list[str]:
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            found += _command_paths(sub, f"{path} {name}")
    return found


def test_every_command_and_option_has_an_entry(pages: dict[str, str]) -> None:
    text = pages["reference/cli.md"]
    root = typer.main.get_command(app)
    paths = _command_paths(root, "shockwave")  # type: ignore[arg-type]
    assert {"shockwave jobs submit", "shockwave up", "shockwave agent"} <= set(paths)
    for path in paths:
        assert f"## `{path}`" in text, path
    up = text.split("## `shockwave up`", 1)[1].split("\n## ", 1)[0]
    for option in ("`--port`", "`--db`", "`--demo`", "`--open`, `--no-open`"):
        assert option in up


def test_every_setting_has_an_entry_with_its_default(pages: dict[str, str]) -> None:
    text = pages["reference/settings.md"]
    for cls in (DatabaseSettings, Settings, SolverSettings, DriverSettings):
        for name in cls.model_fields:
            assert f"`SHOCKWAVE_{name.upper()}`" in text, name
    row = next(line for line in text.splitlines() if "`SHOCKWAVE_NODE_TTL_S`" in line)
    assert "`30.0`" in row and "LOST" in row
    # A setting described only by its attribute docstring is found too.
    row = next(line for line in text.splitlines() if "`SHOCKWAVE_BOUNDARY_LEAD_S`" in line)
    assert "before a round's end" in row
    # Docstring markup becomes Markdown.
    assert "``" not in text and ":func:" not in text


def test_every_api_operation_has_an_entry(pages: dict[str, str]) -> None:
    text = pages["reference/api.md"]
    document = reference.service_openapi()
    operations = [
        f"### `{method.upper()} {path}`"
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]
    assert len(operations) > 10
    for heading in operations:
        assert heading in text


def test_a_command_without_help_is_refused() -> None:
    broken = typer.Typer()

    @broken.command("documented")
    def documented(count: Annotated[int, typer.Option(help="How many.")] = 1) -> None:
        """Do something."""

    @broken.command("bare")
    def bare() -> None:
        pass

    with pytest.raises(reference.MissingDocs, match="command `shockwave bare`"):
        reference.cli_reference(broken)


def test_an_option_without_help_is_refused() -> None:
    broken = typer.Typer()

    @broken.command("run")
    def run(
        fast: Annotated[bool, typer.Option(help="Go fast.")] = False,
        size: Annotated[int, typer.Option()] = 1,
    ) -> None:
        """Run."""

    @broken.command("other")
    def other() -> None:
        """Another, so that the app is a group."""

    with pytest.raises(reference.MissingDocs, match="`--size` of `shockwave run`"):
        reference.cli_reference(broken)


class _Undocumented(BaseSettings):
    """``known``: a setting with a meaning."""

    model_config = SettingsConfigDict(env_prefix="SHOCKWAVE_")

    known: int = 1
    forgotten: int = 2


class _Grouped(BaseSettings):
    """``low`` / ``high``: the range. ``other``: something else."""

    model_config = SettingsConfigDict(env_prefix="SHOCKWAVE_")

    low: int = 0
    high: int = 9
    other: str = "x"


def test_a_setting_without_a_meaning_is_refused() -> None:
    with pytest.raises(reference.MissingDocs, match="SHOCKWAVE_FORGOTTEN") as caught:
        reference.settings_reference([("Test", _Undocumented, "here")])
    assert "SHOCKWAVE_KNOWN" not in str(caught.value)


def test_grouped_entries_give_each_setting_the_shared_meaning() -> None:
    meanings = reference.setting_meanings(_Grouped)
    assert meanings == {"low": "the range.", "high": "the range.", "other": "something else."}


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f": {page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


HISTORY = re.compile(
    r"\bissue[ -]?\d+|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|"
    r"eleventh|twelfth) (session|pass|part)\b|\bthis branch\b|\bbranch [`']?issue|"
    r"\bmerged main\b|\bmain [0-9a-f]{7}\b|/work/main|\bSPEC section",
    re.IGNORECASE,
)
DATE = re.compile(
    r"\b20\d\d-\d\d-\d\d\b(?!T)|\b\d{1,2} (January|February|March|April|May|June|"
    r"July|August|September|October|November|December) 20\d\d"
)


def test_no_page_carries_development_history() -> None:
    """Pages are for users: no issue numbers, development rounds or branches anywhere, and dates
    only on the results page, beside the figures they date."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            assert not HISTORY.search(line), f"{page.name}:{number}: {line}"
            if page.name != "results.md":
                assert not DATE.search(line), f"{page.name}:{number}: {line}"
