"""Fixtures of the end-to-end tests that need Docker (see :mod:`tests.e2e.engine`)."""

from __future__ import annotations

import pytest

from tests.e2e import engine


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine answers (and docker-compose and debootstrap are installed)."""
    engine.engine_ready()


@pytest.fixture(scope="session")
def project_image(docker_engine: None) -> str:
    """The project's image, built from this working tree; its name."""
    return engine.project_image()
