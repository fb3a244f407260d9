"""``shockwave up``: the whole service in one process on a SQLite file, as a newcomer runs it.

The process gets an environment that points the broker and the database settings at addresses
where nothing listens, so the test also shows that the embedded service needs neither Redis nor
Postgres: everything it does goes to the SQLite file given with ``--db``.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx

from bench.deployment import ROOT, base_env
from shockwave_cli.runtime.supervision import Supervised, free_port, shockwave_argv, wait_until

NOWHERE_ENV = base_env("postgresql+psycopg://nobody@127.0.0.1:1/none", "redis://127.0.0.1:1/0")
STOP_TIMEOUT_S = 15.0


def up(tmp_path: Path, name: str, database: Path, port: int, *args: str) -> Supervised:
    return Supervised(
        cwd=ROOT,
        name=name,
        argv=[
            *shockwave_argv(),
            "up",
            "--port",
            str(port),
            "--db",
            str(database),
            "--round-seconds",
            "1",
            *args,
        ],
        env=NOWHERE_ENV,
        log_path=tmp_path / f"{name}.log",
    ).start()


def plan_rounds(database: Path, job_id: str) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        rows = connection.execute('SELECT "index", source, jobs FROM rounds ORDER BY 1').fetchall()
    return [(index, source) for index, source, jobs in rows if job_id in jobs]


def stop(service: Supervised, signum: signal.Signals) -> int:
    assert service.process is not None
    service.process.send_signal(signum)
    return service.process.wait(timeout=STOP_TIMEOUT_S)


def test_up_serves_plans_and_leases_from_one_process(tmp_path: Path) -> None:
    database = tmp_path / "shockwave.db"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    service = up(tmp_path, "up", database, port)
    try:
        wait_until(
            lambda: "Shockwave is up" in service.log_tail(),
            30,
            lambda: f"shockwave up to start:\n{service.log_tail()}",
        )
        banner = service.log_tail()
        assert f"API {base}" in banner and f"{base}/docs" in banner, banner
        assert httpx.get(f"{base}/docs", timeout=5).status_code == 200

        second = up(tmp_path, "second", database, free_port())
        assert second.process is not None
        assert second.process.wait(timeout=30) == 1
        assert "already using this database" in second.log_tail()

        node = httpx.post(
            f"{base}/v1/agent/register",
            json={"gpus": 2, "hostname": "local", "node": "n1"},
            timeout=5,
        )
        assert node.status_code == 200, node.text
        job = httpx.post(
            f"{base}/v1/jobs",
            json={"gpus": 1, "epochs": 5, "samples_per_epoch": 1000, "initial_batch_size": 32},
            timeout=5,
        )
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]

        wait_until(
            lambda: any(source == "plan" for _, source in plan_rounds(database, job_id)),
            20,
            lambda: f"a round from the in-process solver's plan:\n{service.log_tail()}",
        )
        leases = httpx.get(f"{base}/v1/agent/leases", params={"node": "n1"}, timeout=5)
        assert leases.status_code == 200, leases.text
        assert [lease["job_id"] for lease in leases.json()["leases"]] == [job_id]

        assert stop(service, signal.SIGINT) == 0
        assert "Stopped." in service.log_tail()
        assert "Traceback" not in service.log_tail(), service.log_tail()

        again = up(tmp_path, "again", database, port)
        wait_until(lambda: "Shockwave is up" in again.log_tail(), 30, "the restart")
        kept = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=5)
        assert kept.status_code == 200 and kept.json()["id"] == job_id
        began = time.monotonic()
        assert stop(again, signal.SIGTERM) == 0
        assert time.monotonic() - began < STOP_TIMEOUT_S
        assert "Traceback" not in again.log_tail(), again.log_tail()
    finally:
        service.stop()


def test_up_keeps_its_database_and_lock_in_a_data_directory(tmp_path: Path) -> None:
    """Without --db, `shockwave up` puts shockwave.db and its lock file in .shockwave/ of the
    directory it runs in (created), says where, and leaves nothing else there."""
    port = free_port()
    (tmp_path / "logs").mkdir()
    service = Supervised(
        cwd=tmp_path,
        name="up-default",
        argv=[*shockwave_argv(), "up", "--port", str(port), "--round-seconds", "1"],
        env=NOWHERE_ENV,
        log_path=tmp_path / "logs" / "up-default.log",
    ).start()
    try:
        wait_until(
            lambda: "Shockwave is up" in service.log_tail(),
            30,
            lambda: f"shockwave up to start:\n{service.log_tail()}",
        )
        data = (tmp_path / ".shockwave").resolve()
        assert f"Database: {data / 'shockwave.db'} (SQLite" in service.log_tail()
        assert (data / "shockwave.db").is_file() and (data / "shockwave.db.lock").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == [".shockwave", "logs"]
        assert stop(service, signal.SIGINT) == 0
    finally:
        service.stop()


def test_up_refuses_open_mode_off_loopback(tmp_path: Path) -> None:
    result = subprocess.run(
        [*shockwave_argv(), "up", "--host", "0.0.0.0", "--db", str(tmp_path / "x.db")],
        env=NOWHERE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "loopback" in result.stderr
    assert not (tmp_path / "x.db").exists()
