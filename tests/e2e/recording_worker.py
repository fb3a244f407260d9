"""``shockwave worker``, with the inputs and output of every policy decision recorded.

The end-to-end test checks that the rounds the service issues are what the core decides for the
same inputs. A plan row does not keep the snapshot it was made from (``now``, the jobs' progress
and the policy's memory have all moved on by the time the test reads it), so this wrapper runs
the real worker command in-process with one change: the policy that
:func:`solver_service.planning.plan_cluster` looks up is wrapped so that each ``decide`` writes
``{state_version, snapshot, params, jobs}`` (shockwave.domain.state_codec JSON) to a file in
``SHOCKWAVE_E2E_RECORD_DIR``. The test then decides again, in its own process, from each recorded
snapshot and params, and compares with the stored plans and rounds.

Fault tests also need a solve that is still running when they kill the worker:
``SHOCKWAVE_E2E_DECIDE_DELAY_S`` (default 0) makes every decision wait that long after writing a
``solving-<pid>-<ns>`` marker file, before it runs the policy.

Run as ``python -m tests.e2e.recording_worker [worker options]``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlmodel import Session

from bench.deployment import Deployment
from shockwave.domain import state_codec
from shockwave.domain.snapshot import Snapshot
from shockwave.policies.policy import Decision, Policy

RECORD_DIR_ENV = "SHOCKWAVE_E2E_RECORD_DIR"
DELAY_ENV = "SHOCKWAVE_E2E_DECIDE_DELAY_S"


class RecordingPolicy:
    """Delegates to ``policy``; writes each decision's inputs and output to ``directory``."""

    Params: ClassVar[type[Any]]

    def __init__(
        self, policy: Policy, directory: Path, versions: dict[int, int], delay_s: float
    ) -> None:
        self.policy = policy
        self.delay_s = delay_s
        self.name = policy.name
        self.Params = policy.Params  # type: ignore[misc]
        self.directory = directory
        self.versions = versions

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        if self.delay_s > 0:
            (self.directory / f"solving-{os.getpid()}-{time.time_ns()}").touch()
            time.sleep(self.delay_s)
        decision = self.policy.decide(snapshot, params)
        record = {
            "state_version": self.versions.get(os.getpid()),
            "policy": self.name,
            "snapshot": state_codec.encode(snapshot),
            "params": state_codec.encode(params),
            "jobs": list(decision.jobs),
        }
        name = f"{snapshot.round_index}-{os.getpid()}-{time.time_ns()}.json"
        partial = self.directory / f".{name}"
        partial.write_text(json.dumps(record))
        partial.rename(self.directory / name)
        return decision


def install(directory: Path, delay_s: float = 0.0) -> None:
    """Wrap the policy lookup and snapshot loading of :mod:`solver_service.planning`."""
    from shockwave.policies.policy import get_policy as lookup
    from solver_service import planning
    from store.snapshot import KnownSpecs
    from store.snapshot import load_snapshot as load

    versions: dict[int, int] = {}

    def get_policy(name: str) -> Policy:
        return RecordingPolicy(  # type: ignore[return-value]
            lookup(name), directory, versions, delay_s
        )

    def load_snapshot(
        session: Session,
        cluster_id: str,
        round_index: int,
        now: datetime,
        priority_classes: Mapping[str, float] | None = None,
        known: KnownSpecs | None = None,
    ) -> tuple[Snapshot, int]:
        snapshot, version = load(session, cluster_id, round_index, now, priority_classes, known)
        versions[os.getpid()] = version
        return snapshot, version

    setattr(planning, "get_policy", get_policy)  # noqa: B010  (a test hook, on purpose)
    setattr(planning, "load_snapshot", load_snapshot)  # noqa: B010


def start(
    stack: Deployment, name: str = "worker", *, record_dir: Path | None = None, delay_s: float = 0.0
) -> None:
    """Start this wrapper as ``stack``'s solver worker ``name``, recording into ``record_dir``
    (default: ``<name>-decisions`` in the stack's log directory), each decision ``delay_s``
    late."""
    record_dir = record_dir or stack.log_dir / f"{name}-decisions"
    stack.services.module(
        name,
        __name__,
        "--concurrency",
        "1",
        env={RECORD_DIR_ENV: str(record_dir), DELAY_ENV: str(delay_s)},
    )


def main() -> None:
    directory = Path(os.environ[RECORD_DIR_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    install(directory, float(os.environ.get(DELAY_ENV, "0")))
    from shockwave_cli.main import app

    app(["worker", *sys.argv[1:]], prog_name="shockwave")


if __name__ == "__main__":
    main()
