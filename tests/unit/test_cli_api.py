"""``shockwave api``, ``shockwave admin`` and ``shockwave jobs`` against a real API process.

One ``shockwave api`` subprocess serves a throwaway SQLite database on a free loopback port for
the whole module; tokens come from ``shockwave admin create-token``; the ``jobs`` commands run
in-process (CliRunner) and talk to the server over HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from shockwave_cli.main import app
from shockwave_cli.runtime.supervision import Supervised, free_port, shockwave_argv, wait_http

runner = CliRunner()
START_TIMEOUT_S = 20.0
SHOCKWAVE = shockwave_argv(from_cwd=True)


@dataclass(frozen=True)
class Server:
    url: str
    database_url: str
    admin_token: str


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    env.update(extra)
    return env


def create_token(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHOCKWAVE, "admin", "create-token", *args],
        env=clean_env(SHOCKWAVE_DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("api")
    database_url = f"sqlite:///{directory / 'shockwave.db'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [*SHOCKWAVE, "api", "--port", str(port), "--log-level", "warning"]
    env = clean_env(SHOCKWAVE_DATABASE_URL=database_url)
    process = Supervised("`shockwave api`", argv, env, directory / "server.log", grace_s=10.0)
    process.start()
    try:
        wait_http(f"{url}/healthz", process, START_TIMEOUT_S)
        admin = create_token(database_url, "--role", "admin", "--name", "test-admin")
        assert admin.returncode == 0, admin.stderr
        yield Server(url, database_url, admin.stdout.strip())
    finally:
        process.stop()


@pytest.fixture(scope="module")
def alice(server: Server) -> str:
    """A user token for tenant alice, made by the real command: stdout is the token alone."""
    made = create_token(server.database_url, "--role", "user", "--tenant", "alice")
    assert made.returncode == 0, made.stderr
    assert made.stdout.count("\n") == 1
    token = made.stdout.strip()
    assert token.startswith("swk_")
    assert token not in made.stderr
    return token


def jobs(server: Server, token: str | None, *args: str) -> Result:
    env = {"SHOCKWAVE_API_URL": server.url, "SHOCKWAVE_TOKEN": token or ""}
    return runner.invoke(app, ["jobs", *args], env=env)


def submit(server: Server, token: str, name: str, *extra: str) -> dict[str, object]:
    result = jobs(
        server,
        token,
        "submit",
        *("--name", name, "--gpus", "1", "--epochs", "3"),
        *("--samples-per-epoch", "1000", "--batch-size", "32", "--output", "json", *extra),
    )
    assert result.exit_code == 0, result.output
    job: dict[str, object] = json.loads(result.stdout)
    return job


def test_submit_from_a_yaml_file_then_get_and_list(
    server: Server, alice: str, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: resnet-accordion\ngpus: 2\nepochs: 40\nsamples-per-epoch: 50000\n"
        "initial_batch_size: 64\nmode: accordion\nbatch_sizes: [64, 128, 256]\n"
    )
    made = jobs(server, alice, "submit", str(spec), "--output", "json")
    assert made.exit_code == 0, made.output
    job = json.loads(made.stdout)
    assert (job["tenant"], job["state"], job["gpus"], job["mode"]) == (
        "alice",
        "PENDING",
        2,
        "accordion",
    )

    got = jobs(server, alice, "get", job["id"], "--output", "yaml")
    assert got.exit_code == 0, got.output
    assert yaml.safe_load(got.stdout)["batch_sizes"] == [64, 128, 256]

    listed = jobs(server, alice, "ls", "--name", "resnet-accordion", "--output", "json")
    assert listed.exit_code == 0, listed.output
    assert [item["id"] for item in json.loads(listed.stdout)["items"]] == [job["id"]]

    table = jobs(server, alice, "ls", "--name", "resnet-accordion")
    assert table.exit_code == 0, table.output
    assert job["id"][:8] in table.stdout and "PENDING" in table.stdout


def test_cancel_moves_the_job_to_cancelled_and_twice_is_a_conflict(
    server: Server, alice: str
) -> None:
    job = submit(server, alice, "to-cancel")
    cancelled = jobs(server, alice, "cancel", str(job["id"]), "--output", "json")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["state"] == "CANCELLED"

    listed = jobs(server, alice, "ls", "--state", "cancelled", "--output", "json")
    assert job["id"] in [item["id"] for item in json.loads(listed.stdout)["items"]]

    again = jobs(server, alice, "cancel", str(job["id"]))
    assert again.exit_code == 1
    assert again.stderr.startswith("error: Illegal transition: ")
    assert "CANCELLED" in again.stderr


def test_a_bad_submission_names_the_field_and_exits_1(server: Server, alice: str) -> None:
    result = jobs(
        server,
        alice,
        "submit",
        *("--gpus", "3", "--epochs", "3", "--samples-per-epoch", "10", "--batch-size", "8"),
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert "gpus" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    missing = jobs(server, alice, "submit", "--gpus", "1")
    assert missing.exit_code == 1
    assert "epochs" in missing.stderr and "samples_per_epoch" in missing.stderr


def test_all_follows_pagination(server: Server, alice: str) -> None:
    made = [submit(server, alice, "paged")["id"] for _ in range(3)]
    one = jobs(server, alice, "ls", "--name", "paged", "--page-size", "1", "--output", "json")
    assert one.exit_code == 0, one.output
    page = json.loads(one.stdout)
    assert [item["id"] for item in page["items"]] == made[:1]
    assert page["next_page_token"]

    every = jobs(
        server, alice, "ls", "--name", "paged", "--page-size", "1", "--all", "--output", "json"
    )
    assert every.exit_code == 0, every.output
    document = json.loads(every.stdout)
    assert [item["id"] for item in document["items"]] == made
    assert document["next_page_token"] is None


def test_idempotency_key_replays_the_first_job(server: Server, alice: str) -> None:
    first = submit(server, alice, "retried", "--idempotency-key", "retry-1")
    second = submit(server, alice, "retried", "--idempotency-key", "retry-1")
    assert second["id"] == first["id"]
    other = jobs(
        server,
        alice,
        "submit",
        *("--name", "retried", "--gpus", "2", "--epochs", "3", "--samples-per-epoch", "1000"),
        *("--batch-size", "32", "--idempotency-key", "retry-1"),
    )
    assert other.exit_code == 1
    assert "Idempotency-Key" in other.stderr


def test_other_tenants_jobs_are_not_found(server: Server, alice: str) -> None:
    job = submit(server, alice, "private")
    bob = create_token(server.database_url, "--role", "user", "--tenant", "bob").stdout.strip()
    result = jobs(server, bob, "get", str(job["id"]))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: Not found")
    listed = jobs(server, bob, "ls", "--output", "json")
    assert json.loads(listed.stdout)["items"] == []


def test_missing_token_is_an_api_error_with_a_hint(server: Server) -> None:
    result = jobs(server, None, "ls")
    assert result.exit_code == 1
    assert "Unauthorized" in result.stderr and "SHOCKWAVE_TOKEN" in result.stderr


def test_events_show_the_history_or_say_the_api_lacks_them(server: Server, alice: str) -> None:
    job = submit(server, alice, "with-history")
    result = jobs(server, alice, "events", str(job["id"]), "--output", "json")
    if result.exit_code == 0:
        kinds = [event["kind"] for event in json.loads(result.stdout)]
        assert "state" in kinds
    else:
        assert result.exit_code == 1
        assert "does not serve job events" in result.stderr
    unknown = jobs(server, alice, "events", "no-such-job")
    assert unknown.exit_code == 1
    assert "no-such-job" in unknown.stderr


def test_watch_refreshes_count_times(server: Server, alice: str) -> None:
    submit(server, alice, "watched")
    result = jobs(
        server,
        alice,
        "watch",
        "--name",
        "watched",
        "--count",
        "2",
        "--interval",
        "0.1",
        "--output",
        "json",
    )
    assert result.exit_code == 0, result.output
    snapshots = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(snapshots) == 2
    assert all(len(s["items"]) == 1 for s in snapshots)


def test_cluster_fits_the_width_it_is_given(server: Server, alice: str) -> None:
    """The summary wraps its queue to the terminal's width: COLUMNS where the output is captured,
    100 columns without it (the list commands keep rows whole for scripts instead)."""
    for n in range(2):
        submit(server, alice, f"a-rather-long-job-name-that-needs-folding-{n}")
    cases: list[tuple[dict[str, str | None], int]] = [
        ({"COLUMNS": "100"}, 100),
        ({"COLUMNS": "72"}, 72),
        ({}, 100),
    ]
    for env, width in cases:
        result = runner.invoke(
            app,
            ["cluster", "--api-url", server.url, "--token", alice],
            env={"COLUMNS": None, **env},
        )
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert any("a-rather-long" in line for line in lines), result.stdout
        assert max(len(line) for line in lines) <= width, result.stdout


def test_admin_sees_every_tenant(server: Server, alice: str) -> None:
    submit(server, alice, "for-admin")
    result = jobs(server, server.admin_token, "ls", "--tenant", "alice", "--all", "-o", "json")
    assert result.exit_code == 0, result.output
    assert "for-admin" in [item["name"] for item in json.loads(result.stdout)["items"]]


def test_an_unreachable_api_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["jobs", "ls", "--api-url", url, "--token", "x"])
    assert result.exit_code == 1
    assert url in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jobs", "submit"], "give a job file"),
        (["jobs", "ls", "--state", "sleeping"], "--state"),
        (["jobs", "ls", "--api-url", "localhost:8000"], "--api-url"),
        (["api", "--open", "--host", "0.0.0.0"], "loopback"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args, env={"SHOCKWAVE_OPEN_MODE": "0"})
    assert result.exit_code == 2
    assert message in result.stderr


def test_open_mode_from_the_environment_is_refused_off_loopback() -> None:
    result = runner.invoke(app, ["api", "--host", "10.1.2.3"], env={"SHOCKWAVE_OPEN_MODE": "1"})
    assert result.exit_code == 2
    assert "loopback" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "user"], "needs --tenant"),
        (["--role", "agent"], "needs --node"),
        (["--role", "admin", "--tenant", "alice"], "does not apply"),
        (["--role", "job", "--job", "no-such-job"], "no job"),
        (["--role", "root"], "--role"),
        (["--role", "user", "--tenant", "bad tenant!"], "--tenant"),
    ],
)
def test_create_token_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    env = {"SHOCKWAVE_DATABASE_URL": f"sqlite:///{tmp_path / 'tokens.db'}"}
    result = runner.invoke(app, ["admin", "create-token", *args], env=env)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert message in result.stderr


def test_admin_token_lifecycle_lists_without_secrets_revokes_and_expires(tmp_path: Path) -> None:
    env = {"SHOCKWAVE_DATABASE_URL": f"sqlite:///{tmp_path / 'tokens.db'}", "COLUMNS": "200"}

    def admin(*args: str) -> Result:
        return runner.invoke(app, ["admin", *args], env=env)

    made = admin("create-token", "--role", "metrics", "--name", "prom", "--expires-in", "30d")
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip()
    assert "a metrics token" in made.stderr
    assert admin("create-token", "--role", "user", "--tenant", "a", "--name", "al").exit_code == 0

    listed = admin("list-tokens")
    assert listed.exit_code == 0, listed.output
    assert secret not in listed.stdout and "prom" in listed.stdout and "never" in listed.stdout
    revoked = admin("revoke-token", "2")
    assert revoked.exit_code == 0 and "within 10 s" in revoked.stderr
    assert "revoked" in admin("list-tokens").stdout
    assert "revocation is final" in admin("set-token-expiry", "2", "--never").stderr
    assert admin("set-token-expiry", "1", "--never").exit_code == 0
    bad = admin("set-token-expiry", "1", "--expires-in", "5x")
    assert bad.exit_code == 2 and "--expires-in" in bad.stderr
    assert admin("revoke-token", "99").exit_code == 2
    control = admin("create-token", "--role", "admin", "--name", "x\x1b[2Jy")
    assert control.exit_code == 2 and "control characters" in control.stderr


def cli(server: Server, token: str | None, *args: str) -> Result:
    env = {"SHOCKWAVE_API_URL": server.url, "SHOCKWAVE_TOKEN": token or ""}
    return runner.invoke(app, list(args), env=env)


def test_tenants_set_and_ls_show_the_tree_and_users_cannot_set(server: Server, alice: str) -> None:
    made = cli(server, server.admin_token, "tenants", "set", "org/vision", "--weight", "3",
               "--max-gpus", "8", "--max-jobs", "20")  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "org/vision" in made.stdout and "max_gpus 8" in made.stdout
    cleared = cli(server, server.admin_token, "tenants", "set", "org/vision", "--max-gpus", "none",
                  "--output", "json")  # fmt: skip
    assert cleared.exit_code == 0, cleared.output
    body = json.loads(cleared.stdout)
    assert (body["weight"], body["max_gpus"], body["max_jobs"], body["version"]) == (
        3.0,
        None,
        20,
        2,
    )

    listed = cli(server, server.admin_token, "tenants", "ls", "--output", "json")
    assert listed.exit_code == 0, listed.output
    paths = {t["path"] for t in json.loads(listed.stdout)["items"]}
    assert {"org", "org/vision"} <= paths
    table = cli(server, server.admin_token, "tenants", "ls")
    assert table.exit_code == 0 and "vision" in table.stdout

    refused = cli(server, alice, "tenants", "set", "alice", "--max-jobs", "1000")
    assert refused.exit_code == 1 and "admins" in refused.stderr
    bad = cli(server, server.admin_token, "tenants", "set", "org/vision", "--max-jobs", "lots")
    assert bad.exit_code != 0


def test_usage_prints_a_table_json_and_csv(server: Server, alice: str) -> None:
    submit(server, alice, "usage-job")
    as_json = cli(server, alice, "usage", "--group-by", "job", "--output", "json")
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)["rows"]
    assert rows and {row["tenant"] for row in rows} == {"alice"}
    as_csv = cli(server, alice, "usage", "--group-by", "job", "--csv")
    assert as_csv.exit_code == 0, as_csv.output
    header, *lines = as_csv.stdout.strip().splitlines()
    assert header.startswith("key,tenant,label,gpu_hours") and len(lines) == len(rows)
    assert cli(server, alice, "usage").exit_code == 0
    other = cli(server, alice, "usage", "--tenant", "bob")
    assert other.exit_code == 1 and "bob" in other.stderr
