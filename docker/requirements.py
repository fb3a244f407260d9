"""Print the requirements of pyproject.toml, one a line, for the image's dependency layer.

``python3 docker/requirements.py [EXTRAS]``: the build requirements, the project's dependencies
and those of the optional groups named in EXTRAS (comma- or space-separated). Installing them
before the source is copied lets Docker keep that layer until pyproject.toml changes. Exit 2 for
an unknown group. Standard library only (it runs before anything is installed).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: dict[str, object], extras: list[str]) -> list[str]:
    """The build requirements, dependencies and ``extras``' dependencies of ``pyproject``;
    ValueError naming an unknown extra."""
    build = pyproject.get("build-system", {})
    project = pyproject["project"]
    assert isinstance(build, dict) and isinstance(project, dict)
    groups: dict[str, list[str]] = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in groups]
    if unknown:
        raise ValueError(
            f"EXTRAS: no optional dependency group {', '.join(unknown)} in pyproject.toml "
            f"(there are: {', '.join(groups) or 'none'})"
        )
    wanted = [*build.get("requires", []), *project.get("dependencies", [])]
    for extra in extras:
        wanted += groups[extra]
    return wanted


def main(argv: list[str]) -> int:
    extras = [e for e in " ".join(argv).replace(",", " ").split() if e]
    pyproject = tomllib.loads(Path("pyproject.toml").read_text())
    try:
        print("\n".join(requirements(pyproject, extras)))
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
