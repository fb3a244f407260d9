"""Database and broker servers for runs of the whole service: a throwaway database on the shared
Postgres, and private Postgres and Redis servers that a fault run may restart or crash.

Used by the chaos run (:mod:`bench.chaos`) and the end-to-end tests. Nothing here skips: a
server that cannot be reached or started raises :class:`ServerUnavailable` saying how to get
one (``scripts/services.sh`` starts the shared ones).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from shockwave_cli.runtime.databases import (
    POSTGRES_URL,
    REDIS_URL,
    ServerUnavailable,
    throwaway_database,
)
from shockwave_cli.runtime.supervision import LOOPBACK, STOP_GRACE_S, free_port, wait_until

__all__ = ["POSTGRES_URL", "REDIS_URL", "ServerUnavailable", "throwaway_database"]


def database_engine(url: str) -> Engine:
    return create_engine(url, pool_pre_ping=True)


def redis_answers(host: str, port: int) -> bool:
    """Whether a Redis server answers PING at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def require_shared_redis() -> None:
    """Fail (never skip) when the shared test Redis does not answer."""
    url = urlsplit(REDIS_URL)
    host, port = url.hostname or LOOPBACK, url.port or 6379
    if not redis_answers(host, port):
        raise ServerUnavailable(
            f"Redis is not answering at {REDIS_URL}. Runs of the whole service need it: run "
            "scripts/services.sh (CI does), or point SHOCKWAVE_TEST_REDIS_URL at a server."
        )


@dataclass
class RedisServer:
    """A private ``redis-server`` on a free loopback port (no persistence), for fault tests
    that stop and restart the broker without touching the shared one."""

    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerUnavailable(
                "redis-server is not installed; fault runs start one of their own"
            )
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                LOOPBACK,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers, 10, f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_GRACE_S)
        self.process = None

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"redis-server on port {self.port} exited")
        return redis_answers(LOOPBACK, self.port)


@contextmanager
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def postgres_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: SHOCKWAVE_TEST_PG_BINDIR, the PATH, or the newest
    /usr/lib/postgresql/<version>/bin (Debian keeps them off the PATH)."""
    configured = os.environ.get("SHOCKWAVE_TEST_PG_BINDIR")
    if configured:
        return Path(configured)
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3])
    )
    if not versions:
        raise ServerUnavailable(
            "PostgreSQL's initdb/pg_ctl are not installed; set SHOCKWAVE_TEST_PG_BINDIR"
        )
    return versions[-1].parent


@dataclass
class PostgresServer:
    """A private Postgres cluster in ``directory`` on a free loopback port: trust auth, fsync on,
    for fault tests that restart it or crash it (kill -9) without touching the shared server.

    Run as the ``postgres`` user when this process is root (Postgres refuses root). The data
    directory and the server's log live in ``directory``; :meth:`crash` SIGKILLs the postmaster
    and every backend, as a power cut would, and :meth:`start` then does crash recovery."""

    directory: Path
    port: int = field(default_factory=free_port)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def url(self) -> str:
        """The server's ``postgres`` database (for :func:`throwaway_database`)."""
        return f"postgresql+psycopg://postgres@{LOOPBACK}:{self.port}/postgres"

    def init(self) -> None:
        """initdb, with the settings written to postgresql.conf (so a plain pg_ctl start or
        restart keeps them)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._own(self.directory)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        settings = {
            "port": str(self.port),
            "listen_addresses": f"'{LOOPBACK}'",
            "unix_socket_directories": f"'{self.directory}'",
            "fsync": "on",
            "max_connections": "300",
            "shared_buffers": "'64MB'",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def start(self, attempts: int = 10) -> None:
        """pg_ctl start, waiting until it accepts connections; retried while the remains of
        a crashed server still hold its shared memory."""
        for attempt in range(attempts):
            result = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "start", check=False
            )
            if result.returncode == 0:
                return
            if attempt == attempts - 1:
                raise AssertionError(f"pg_ctl start failed: {result.stderr}\n{self.log_tail()}")
            time.sleep(0.5)

    def restart(self) -> None:
        """A clean, fast restart (pg_ctl restart -m fast): connections are cut."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", "fast", "-w", "restart"
        )

    def crash(self) -> None:
        """SIGKILL the postmaster and every process it started; returns once all are gone."""
        postmaster = self.postmaster_pid()
        if postmaster is None:
            return
        victims = [postmaster, *_children(postmaster)]
        for pid in victims:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: not any(_running(pid) for pid in victims), 10, "the killed Postgres to exit"
        )

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (from postmaster.pid), or None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _running(pid) else None

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(postgres_bindir() / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            cwd=self.directory,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{tool} failed: {result.stderr}\n{self.log_tail()}")
        return result

    @staticmethod
    def _own(path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(parent: int) -> list[int]:
    """Direct children of ``parent``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


@contextmanager
def private_postgres() -> Iterator[PostgresServer]:
    """A :class:`PostgresServer` in a fresh directory under the system's temporary directory
    (which the ``postgres`` user can reach, unlike pytest's private ``tmp_path``), initialized
    and started; stopped and removed on exit."""
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="shockwave-pg-")))
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)
