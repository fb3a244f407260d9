"""docker-compose.yml as the compose CLI resolves it: the services the distributed deployment
needs, each with a health check, waiting for healthy dependencies, secrets from the env file
only, the same commands as by hand, and the GPU override.

The validator is Debian's ``docker-compose`` (v1.29; ``scripts/docker_engine.sh`` installs it
with the engine, through the ``docker_engine`` fixture); ``docker compose`` (v2) is used as well
where it exists. That the stack really runs jobs is ``make compose-check``
(scripts/compose_check.sh; docs/service.md records its latest run).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from shockwave_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
GPU_FILE = ROOT / "docker-compose.gpu.yml"
SHOCKWAVE = {"api", "worker", "driver", "driver-standby", "agent-token", "agent"}
SERVICES = {"postgres", "redis", *SHOCKWAVE}
ONE_SHOT = {"agent-token"}


def compose_cli() -> list[str]:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail("docker-compose is not installed (scripts/docker_engine.sh installs it)")
    return [path]


@pytest.fixture
def env_file(tmp_path: Path, docker_engine: None) -> Path:
    path = tmp_path / "compose.env"
    path.write_text("POSTGRES_PASSWORD=first-secret\nSHOCKWAVE_ROUND_SECONDS=7\n")
    return path


def resolve(env_file: Path, *files: Path, cli: list[str] | None = None) -> dict[str, Any]:
    """The compose files as the CLI resolves them with ``env_file`` (anchors merged, variables
    interpolated, defaults filled in)."""
    result = run_compose(env_file, *files, "config", cli=cli)
    assert result.returncode == 0, result.stderr
    resolved: dict[str, Any] = yaml.safe_load(result.stdout)
    return resolved


def run_compose(
    env_file: Path, *args: str | Path, cli: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    files = [a for a in args if isinstance(a, Path)] or [COMPOSE_FILE]
    rest = [a for a in args if isinstance(a, str)]
    command = [*(cli or compose_cli()), "--env-file", str(env_file)]
    for file in files:
        command += ["-f", str(file)]
    return subprocess.run(
        [*command, *rest],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "SHOCKWAVE_ENV_FILE": str(env_file)},
        check=False,
    )


def test_docker_compose_v2_accepts_the_file_where_it_exists(env_file: Path) -> None:
    docker = shutil.which("docker")
    v2 = docker is not None and (
        subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode
        == 0
    )
    if not v2:
        return  # Nothing more to check on this machine: v1 resolves the file in every test.
    assert docker is not None
    assert resolve(env_file, cli=[docker, "compose"])["services"].keys() == SERVICES


def test_the_password_comes_from_the_env_file_and_is_required(
    env_file: Path, tmp_path: Path
) -> None:
    services = resolve(env_file)["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "first-secret"
    for name in SHOCKWAVE - {"agent"}:
        url = services[name]["environment"]["SHOCKWAVE_DATABASE_URL"]
        assert url == "postgresql+psycopg://shockwave:first-secret@postgres:5432/shockwave", name
        assert services[name]["environment"]["SHOCKWAVE_ROUND_SECONDS"] == "7", name
    assert "secret" not in COMPOSE_FILE.read_text()
    agent_env = services["agent"].get("environment", {})
    assert not any("PASSWORD" in k or "DATABASE" in k for k in agent_env), agent_env

    other = tmp_path / "other.env"
    other.write_text("POSTGRES_PASSWORD=second-secret\n")
    resolved = resolve(other)["services"]
    assert resolved["postgres"]["environment"]["POSTGRES_PASSWORD"] == "second-secret"

    empty = tmp_path / "empty.env"
    empty.write_text("POSTGRES_PASSWORD=\n")
    refused = run_compose(empty, "config")
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr, refused.stderr


def test_every_service_has_a_health_check_and_waits_for_healthy_dependencies(
    env_file: Path,
) -> None:
    services = resolve(env_file)["services"]
    assert set(services) == SERVICES
    for name in SERVICES - ONE_SHOT:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    needs = {
        "api": {"postgres", "redis"},
        "worker": {"redis", "api"},
        "driver": {"postgres", "redis", "api"},
        "driver-standby": {"postgres", "redis", "api"},
        "agent-token": {"api"},
        "agent": {"api", "agent-token"},
    }
    for name, dependencies in needs.items():
        depends_on = services[name]["depends_on"]
        assert set(depends_on) == dependencies, name
        for dependency, condition in depends_on.items():
            wanted = (
                "service_completed_successfully" if dependency in ONE_SHOT else "service_healthy"
            )
            assert condition["condition"] == wanted, (name, dependency)
    assert services["agent-token"]["restart"] == "no"


def test_shockwave_services_share_one_image_and_point_at_postgres_and_redis(
    env_file: Path,
) -> None:
    services = resolve(env_file)["services"]
    for name in SHOCKWAVE:
        assert services[name]["image"] == "shockwave:latest", name
    assert Path(services["api"]["build"]["context"]) == ROOT
    assert (ROOT / services["api"]["build"].get("dockerfile", "Dockerfile")).is_file()
    for name in SHOCKWAVE - {"agent"}:
        env = services[name]["environment"]
        assert env["SHOCKWAVE_BROKER_URL"] == "redis://redis:6379/0", name
        assert env["SHOCKWAVE_SOLVER_MODE"] == "celery", name
    assert services["postgres"]["image"] == "postgres:15"
    assert services["redis"]["image"] == "redis:7"


def test_commands_are_the_shockwave_commands_run_by_hand(env_file: Path) -> None:
    services = resolve(env_file)["services"]
    commands = {name: services[name]["command"] for name in SHOCKWAVE - ONE_SHOT}
    assert commands["api"][:2] == ["shockwave", "api"]
    assert commands["api"][commands["api"].index("--host") + 1] == "0.0.0.0"
    assert commands["worker"] == ["shockwave", "worker"]
    assert commands["driver"] == commands["driver-standby"]
    assert commands["driver"][:2] == ["shockwave", "driver"]
    agent = commands["agent"]
    assert agent[:2] == ["shockwave", "agent"]
    assert agent[agent.index("--api") + 1] == "http://api:8000"
    assert agent[agent.index("--gpus") + 1] == "2"
    assert agent[agent.index("--runtime") + 1] == "process"
    token_file = agent[agent.index("--token-file") + 1]
    mounts = [mount_of(m) for m in services["agent"]["volumes"]]
    assert any(
        source == "agent-token" and token_file.startswith(f"{target}/") for source, target in mounts
    )
    runner = CliRunner()
    for command in commands.values():
        result = runner.invoke(app, [command[1], "--help"])
        assert result.exit_code == 0, (command, result.output)
        for option in (word for word in command[2:] if word.startswith("--")):
            assert option in result.output, (command, option)
    assert "shockwave admin create-token --role agent" in " ".join(
        services["agent-token"]["command"]
    )


def test_the_gpu_override_reserves_the_nvidia_gpus_for_the_agent(env_file: Path) -> None:
    services = resolve(env_file, COMPOSE_FILE, GPU_FILE)["services"]
    (device,) = services["agent"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], device
    assert device["count"] in ("all", -1), device
    agent = services["agent"]["command"]
    assert agent[agent.index("--gpus") + 1] == "auto"
    assert set(services) == SERVICES


def mount_of(volume: str | dict[str, str]) -> tuple[str, str]:
    """(source, target) of a service's volume, in the short (v1) or long (v2) form."""
    if isinstance(volume, str):
        source, target = volume.split(":")[:2]
        return source, target
    return volume["source"], volume["target"]
