"""The Docker engine and the project's image for the end-to-end tests, made ready by the
project's own scripts (the same ones `make test` and `make compose-check` run): nothing here
skips, a machine that cannot run them fails with the scripts' own words.

- :func:`engine_ready`: ``scripts/docker_engine.sh`` (installs Debian's docker.io, docker-compose
  and debootstrap when missing and this runs as root; starts ``dockerd`` when no engine
  answers).
- :func:`project_image`: ``scripts/images.sh`` (the debootstrap base image once, then the project
  image; Docker's cache makes an unchanged rebuild take seconds), so the image holds the code
  under test.
"""

from __future__ import annotations

import subprocess

import pytest

from bench.deployment import ROOT

IMAGE = "shockwave:latest"
BUILD_TIMEOUT_S = 900.0


def run_script(name: str, *args: str) -> None:
    """Run ``scripts/<name>``; fail the test with its output if it fails."""
    try:
        done = subprocess.run(
            [str(ROOT / "scripts" / name), *args],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/{name} ran past {BUILD_TIMEOUT_S:.0f} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"scripts/{name} {' '.join(args)} failed ({done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}",
            pytrace=False,
        )


def engine_ready() -> None:
    run_script("docker_engine.sh")


def project_image() -> str:
    """The project's image, built from the working tree."""
    run_script("images.sh")
    return IMAGE


def docker(*args: str, check: bool = True) -> str:
    """``docker ARGS``' output; fails the test when it fails and ``check``."""
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout


def containers(names: set[str]) -> dict[str, str]:
    """The containers among ``names`` that exist, running or not: name -> status."""
    listed = docker(
        "ps", "--all", "--filter", "label=shockwave.attempt", "--format", "{{.Names}} {{.State}}"
    )
    found = dict(line.split(" ", 1) for line in listed.splitlines() if line.strip())
    return {name: status for name, status in found.items() if name in names}


def remove(names: set[str]) -> None:
    """Remove the containers ``names`` (those that exist), running or not."""
    existing = containers(names)
    if existing:
        docker("rm", "--force", *sorted(existing), check=False)
