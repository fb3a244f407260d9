"""``shockwave agent``'s entry point: check the options against the machine, take the work
directory, and run the loop until SIGTERM or Ctrl-C.

The first SIGTERM or SIGINT drains: every job is asked to checkpoint and stop (SIGTERM, the
grace period, SIGKILL) and the reports are delivered. A second one exits at once, leaving the
jobs running for the next agent on the same work directory to re-attach to (so does kill -9),
for the orphan grace period: then each job's wrapper stops it (:mod:`agent.liveness`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent.client import AgentClient
from agent.config import (
    AgentConfig,
    ContainerLimits,
    RuntimeKind,
    default_node_name,
    docker_answers,
    machine_for,
)
from agent.isolation import (
    DEFAULT_LOCK_DIR,
    DEFAULT_UIDS,
    can_switch_users,
    isolation_warning,
    parse_uids,
    reachable_by_others,
)
from agent.loop import Agent
from agent.runtime import DockerRuntime, ProcessRuntime, Runtime
from agent.state import WorkDirBusy, lock_work_dir

log = logging.getLogger("agent")


class UsageError(Exception):
    """An option the machine cannot honour (exit 2)."""


@dataclass(frozen=True, slots=True)
class Options:
    """The command line, as given (``gpus`` None: auto)."""

    api_url: str
    token: str | None
    node: str | None
    gpus: int | None
    runtime: Literal["auto", "process", "docker"]
    work_dir: Path
    poll_interval_s: float
    heartbeat_interval_s: float
    grace_s: float
    lease_slack_s: float
    request_timeout_s: float = 3.0
    orphan_grace_s: float = 10.0
    job_uids: str = "auto"
    """``auto`` (a pool of :data:`~agent.isolation.DEFAULT_UIDS` when the agent is root, else
    none), ``off``, or ``FIRST-LAST``."""
    uid_lock_dir: Path = DEFAULT_LOCK_DIR
    containers: ContainerLimits = field(default_factory=ContainerLimits)


def job_uids(text: str) -> tuple[int, int] | None:
    """The uid pool ``--job-uids`` asks for; :class:`UsageError` if it is malformed or the
    agent cannot switch users to honour an explicit range."""
    if text == "auto":
        return DEFAULT_UIDS if can_switch_users() else None
    try:
        uids = parse_uids(text)
    except ValueError as error:
        raise UsageError(f"--job-uids: {error}") from None
    if uids is not None and not can_switch_users():
        raise UsageError("--job-uids: only an agent running as root can run jobs as other uids")
    return uids


def configure(options: Options) -> AgentConfig:
    """The agent's settings from ``options`` and the machine; :class:`UsageError` if the
    machine cannot honour them."""
    machine = machine_for(options.gpus)
    if machine is None:
        raise UsageError("no NVIDIA GPU found (nvidia-smi): declare the slots with --gpus N")
    runtime: RuntimeKind
    if options.runtime == "auto":
        runtime = "docker" if docker_answers() else "process"
    elif options.runtime == "docker" and not docker_answers():
        raise UsageError("--runtime docker: no Docker engine answers `docker info`")
    else:
        runtime = options.runtime
    hostname = default_node_name()
    node = options.node if options.node or options.token else hostname
    return AgentConfig(
        api_url=options.api_url.rstrip("/"),
        token=options.token,
        node=node,
        hostname=hostname,
        machine=machine,
        runtime=runtime,
        work_dir=options.work_dir.resolve(),
        poll_interval_s=options.poll_interval_s,
        heartbeat_interval_s=options.heartbeat_interval_s,
        grace_s=options.grace_s,
        lease_slack_s=options.lease_slack_s,
        request_timeout_s=options.request_timeout_s,
        orphan_grace_s=options.orphan_grace_s,
        job_uids=job_uids(options.job_uids),
        uid_lock_dir=options.uid_lock_dir,
        containers=options.containers,
    )


def serve(config: AgentConfig) -> None:
    """Run the agent on ``config`` until a signal; :class:`WorkDirBusy` if another agent
    holds the work directory."""
    config.work_dir.mkdir(parents=True, exist_ok=True)
    if config.job_uids is not None:
        closed = reachable_by_others(config.work_dir.parent)
        if closed is not None:
            log.error(
                "--work-dir %s: jobs run as uids of their own and cannot pass through %s to "
                "their checkpoint directories (give it o+x, or use another work directory)",
                config.work_dir,
                closed,
            )
    with lock_work_dir(config.lock_file):
        runtimes: dict[RuntimeKind, Runtime] = {
            "process": ProcessRuntime(),
            "docker": DockerRuntime(  # for re-attaching too
                nvidia=config.machine.nvidia, limits=config.containers
            ),
        }
        client = AgentClient(config.api_url, config.token, config.node, config.request_timeout_s)
        stop = threading.Event()

        def on_signal(signum: int, _frame: object) -> None:
            if stop.is_set():
                log.warning("second signal: exiting now; the jobs keep running")
                os._exit(128 + signum)
            log.info("stopping: checkpointing and stopping every job (again to exit now)")
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
        log.info(
            "agent for node %s: %d %s (%s), %s runtime, work dir %s, API %s",
            config.node or "(the token's)",
            config.machine.gpus,
            "GPUs" if config.machine.nvidia else "slots",
            config.machine.gpu_type,
            config.runtime,
            config.work_dir,
            config.api_url,
        )
        warning = isolation_warning(config.runtime, config.job_uids)
        if warning is not None:
            log.warning(warning)
        else:
            first, last = config.job_uids or (0, 0)
            log.info("each job runs as a uid of its own, from %d to %d", first, last)
        try:
            Agent(config, client, runtimes).run(stop)
        finally:
            client.close()


__all__ = ["Options", "UsageError", "WorkDirBusy", "configure", "serve"]
