"""The embedded deployment (``shockwave up``): the API, the round driver and the solver in one
process, on one SQLite file, with no Redis and no Postgres.

The pieces are the distributed service's own, wired in-process:

- the solver runs inline (:class:`solver_service.enqueue.InlineRequester`): a plan request from
  an API route or the driver plans in a background thread of this process, one at a time;
- the round driver (:class:`solver_service.driver.RoundDriver`) runs its loop in a thread; on
  SQLite it takes no advisory lock, so a file lock next to the database makes sure that only
  one process drives a given file;
- the API (uvicorn) serves in a thread on a socket bound by :func:`claim`, so "port in use"
  (like "database in use") is reported before anything starts;
- they wake each other instead of waiting for a timer: a change the API commits (a job
  finished or submitted, a node joined: what asks for a plan) wakes the driver, which fills the
  freed GPUs at once, and the driver's commits of leases wake the agents' long polls
  (store.lease_signal), which answer with the new leases at once.

:meth:`Embedded.start` starts them, :meth:`Embedded.wait` blocks until asked to stop (or until
a piece dies, which it reports), :meth:`Embedded.close` stops the API first (no new requests),
then the driver, then the solver (it finishes the plan in progress), then the database engine.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import uvicorn
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.app import create_app
from api.http_limits import configure
from api.settings import Settings
from solver_service import enqueue
from solver_service.driver import DriverSettings, RoundDriver
from solver_service.settings import SolverSettings
from store.cluster_version import DEFAULT_CLUSTER, bump_state_version, ensure_cluster
from store.db import make_engine
from store.lease_signal import LeaseSignal, Wakeup
from store.tables import ClusterRow, utcnow

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
SOLVER_WARM_TIMEOUT_S = 60.0
"""How long ``start`` waits for a solver child to import the planner before it serves anyway."""
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    """``database``: the SQLite file (created and migrated if new). ``open_mode``: requests
    without a token act as admin; only on a loopback ``host``. ``log_level``: uvicorn's and
    the service's loggers."""

    database: Path
    host: str = "127.0.0.1"
    port: int = 8000
    round_seconds: float = 120.0
    policy: str = "shockwave"
    open_mode: bool = True
    log_level: str = "info"
    solver: Literal["inline", "process"] = "inline"
    """Where plans are solved: a thread of this process, or one child process."""

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.database.resolve()}"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class CannotStart(RuntimeError):
    """The embedded service cannot start: its database or its port is taken."""


class DatabaseInUse(CannotStart):
    """Another process already runs the embedded service on this database file."""

    def __init__(self, lock_path: Path) -> None:
        super().__init__(
            f"another `shockwave up` is already using this database (lock {lock_path})"
        )
        self.lock_path = lock_path


@dataclass
class DatabaseLock:
    """An exclusive, non-blocking lock on ``<database>.lock``, held until :meth:`release` (or
    until the process dies: the kernel drops it)."""

    path: Path
    _file: IO[bytes] | None = field(default=None, repr=False)

    def acquire(self) -> None:
        handle = self.path.open("ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise DatabaseInUse(self.path) from None
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def lock_database(database: Path) -> DatabaseLock:
    """Hold the database's lock file; :class:`DatabaseInUse` when another process does."""
    lock = DatabaseLock(database.with_name(database.name + ".lock"))
    lock.acquire()
    return lock


@contextmanager
def claim(config: EmbeddedConfig) -> Iterator[socket.socket]:
    """Hold the database's lock and a socket bound to the API's address for the duration;
    :class:`CannotStart` when either is taken, before anything else has started."""
    lock = lock_database(config.database)
    try:
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((config.host.strip("[]"), config.port))
            except OSError as error:
                raise CannotStart(
                    f"cannot listen on {config.host}:{config.port}: {error.strerror or error}"
                ) from None
            yield listener
        finally:
            listener.close()
    finally:
        lock.release()


def banner(config: EmbeddedConfig) -> list[str]:
    """What ``shockwave up`` prints once the API answers: where it is and what runs."""
    base = config.base_url
    auth = (
        "open mode, requests without a token act as admin (loopback only)"
        if config.open_mode
        else "bearer tokens (`shockwave admin create-token` with SHOCKWAVE_DATABASE_URL="
        f"{config.database_url})"
    )
    return [
        f"Shockwave is up: API {base}  (docs: {base}/docs, OpenAPI: {base}/openapi.json)",
        f"Database: {config.database.resolve()} (SQLite, its lock file beside it); solver and "
        "round driver in-process",
        f"Policy: {config.policy}; rounds of {config.round_seconds:g} s; auth: {auth}",
        "Stop with Ctrl-C.",
    ]


def configure_cluster(
    engine: Engine, policy: str, round_seconds: float, cluster_id: str = DEFAULT_CLUSTER
) -> None:
    """Give the cluster ``policy`` and ``round_seconds``. A change of policy forgets the old
    policy's memory and bumps the state version, so no plan of the old policy counts as fresh."""
    with Session(engine) as session:
        ensure_cluster(session, cluster_id)
        cluster = session.get(ClusterRow, cluster_id, populate_existing=True)
        assert cluster is not None
        if cluster.policy != policy:
            log.info("cluster %s: policy %s -> %s", cluster_id, cluster.policy, policy)
            cluster.policy = policy
            cluster.policy_state = None
            session.add(cluster)
            session.flush()
            bump_state_version(session, cluster_id)
        cluster.round_seconds = round_seconds
        cluster.updated_at = utcnow()
        session.add(cluster)
        session.commit()


class Embedded:
    """The API, the round driver and the inline solver of one SQLite database, in threads."""

    def __init__(self, config: EmbeddedConfig) -> None:
        self.config = config
        self.engine = make_engine(config.database_url)
        self.stop = threading.Event()
        self._server: uvicorn.Server | None = None
        self._threads: list[threading.Thread] = []
        self._driver: RoundDriver | None = None
        self._closed = False

    def start(self, listener: socket.socket) -> None:
        """Start the solver, the driver and the API (on ``listener``, already bound); returns
        once the API accepts connections. Raises RuntimeError if it does not come up."""
        url = self.config.database_url
        configure_cluster(self.engine, self.config.policy, self.config.round_seconds)
        requester = enqueue.configure(
            SolverSettings(database_url=url, database_schema=None, solver_mode=self.config.solver),
            engine=self.engine,
        )
        # Up means ready to plan: a solver child still importing the planner (seconds on a
        # loaded machine) would leave the first jobs' rounds first in, first out (at a replay's
        # 120x, each second of it is a round the simulator plans).
        if isinstance(requester, enqueue.ProcessRequester) and not requester.warm(
            SOLVER_WARM_TIMEOUT_S
        ):
            log.warning(
                "the solver process is not ready after %.0f s; rounds go first in, first out "
                "until its first plan",
                SOLVER_WARM_TIMEOUT_S,
            )
        settings = Settings(
            database_url=url,
            open_mode=self.config.open_mode,
            host=self.config.host,
            port=self.config.port,
        )
        # The driver wakes the agents' long polls as soon as it commits leases, and a change
        # the API commits (a job finished, submitted or cancelled, a node joined) wakes the
        # driver at once: the GPUs it freed are filled without waiting for the driver's tick.
        signal = LeaseSignal()
        changed = Wakeup()

        def request_plan(cluster_id: str, state_version: int) -> None:
            enqueue.request_plan(cluster_id, state_version)
            changed.set()

        app = create_app(
            settings, engine=self.engine, request_plan=request_plan, lease_signal=signal
        )
        # One process, one /metrics: the driver's metrics go on the API's registry.
        self._driver = RoundDriver(
            self.engine,
            DriverSettings(
                database_url=url, database_schema=None, round_seconds=self.config.round_seconds
            ),
            sleep=changed.sleep,
            request_plan=enqueue.request_plan,
            registry=app.state.metrics.registry,
            leases_changed=signal.notify,
        )
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                http=configure(settings),
                log_level=self.config.log_level,
                access_log=self.config.log_level == "debug",
                lifespan="off",
            )
        )
        self._spawn("shockwave-round-driver", self._driver.run, self.stop)
        self._spawn("shockwave-api", self._server.run, [listener])
        if not self._wait_started():
            raise RuntimeError("the API did not start")

    def wait(self) -> str | None:
        """Block until :attr:`stop` is set; None then, or the name of a piece that died."""
        while not self.stop.wait(0.5):
            for thread in self._threads:
                if not thread.is_alive():
                    self.stop.set()
                    return thread.name
        return None

    def close(self) -> None:
        """Stop the API, then the driver, then the solver; release the database. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stop.set()
        if self._server is not None:
            self._server.should_exit = True
        for thread in self._threads:
            thread.join(timeout=STOP_TIMEOUT_S)
            if thread.is_alive():
                log.warning("%s did not stop within %.0f s", thread.name, STOP_TIMEOUT_S)
        enqueue.shutdown()
        self.engine.dispose()

    def _spawn(self, name: str, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _wait_started(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._server is not None and not self._server.started:
            if time.monotonic() > deadline or not all(t.is_alive() for t in self._threads):
                return False
            self.stop.wait(0.02)
        return True
