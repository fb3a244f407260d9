"""The agent's settings, read once by ``shockwave agent``, and what it finds out about the
machine it runs on: its NVIDIA GPUs (``nvidia-smi``) and whether a Docker engine answers."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.isolation import DEFAULT_LOCK_DIR

RuntimeKind = Literal["process", "docker"]

PROBE_TIMEOUT_S = 10.0
SLOT_TYPE = "slot"
"""The GPU type a node without NVIDIA GPUs registers: its GPUs are declared slots."""


@dataclass(frozen=True, slots=True)
class Machine:
    """What the agent registers: ``gpus`` of ``gpu_type``; ``nvidia``: whether they are real
    NVIDIA GPUs (found by nvidia-smi) rather than declared slots."""

    gpus: int
    gpu_type: str
    nvidia: bool


@dataclass(frozen=True, slots=True)
class ContainerLimits:
    """What the agent imposes on every job container (the Docker runtime), its operator's
    settings and never a job's. ``network``: the Docker network containers join (``host``
    only where the operator allows jobs the host's network); ``memory``: a ``docker run
    --memory`` size (None: no limit); ``pids``: the most processes and threads in one
    container; ``tmp_size``: the size of its private ``/tmp``; ``allowed_images``: the images
    jobs may name (empty: any image reference; see
    :func:`shockwave.domain.image_reference.image_allowed`)."""

    network: str = "bridge"
    memory: str | None = None
    pids: int = 4096
    tmp_size: str = "1g"
    allowed_images: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent loop needs, fixed at start.

    ``token``: an agent token (acting for its node), an admin token, or None in open mode.
    ``node``: the node to act for, sent with every call when set (an admin or open mode must
    name it; an agent token's node is its own). ``work_dir``: holds the state file, one folder
    per attempt (its output log and exit status) and ``checkpoints/<job id>``.
    ``lease_slack_s``: how long past its ``ends_at`` a lease may run when no word of an
    extension came (the server was unreachable), to absorb the poll delay and clock skew.
    ``orphan_grace_s``: how long a job outlives its agent before its wrapper stops it
    (:mod:`agent.liveness`; 0: never). With ``grace_s`` it must stay below the server's node
    TTL (30 s by default), so that an orphan is gone before its job may run elsewhere; an agent
    restarted within it re-attaches to its jobs.
    ``boundary_wait_s``: once the round its last poll named has ended, the agent's next poll
    asks the server to hold the answer up to this long until the next round is out (a bounded
    long poll, ``wait_s``): the new round's leases start when the server commits them, not at
    the next poll interval. 0: never ask. The loop does not supervise while a poll is held.
    ``job_uids``: the uids (first, last) each attempt runs as one of (:mod:`agent.isolation`;
    None: every job runs as the agent's own user); ``uid_lock_dir``: where the pool's lock
    files are. ``containers``: what every job container is held to.
    """

    api_url: str
    token: str | None
    node: str | None
    hostname: str
    machine: Machine
    runtime: RuntimeKind
    work_dir: Path
    poll_interval_s: float = 1.0
    heartbeat_interval_s: float = 3.0
    grace_s: float = 10.0
    request_timeout_s: float = 3.0
    max_backoff_s: float = 10.0
    lease_slack_s: float = 3.0
    orphan_grace_s: float = 10.0
    boundary_wait_s: float = 1.0
    job_uids: tuple[int, int] | None = None
    uid_lock_dir: Path = DEFAULT_LOCK_DIR
    containers: ContainerLimits = ContainerLimits()

    @property
    def state_file(self) -> Path:
        return self.work_dir / "agent-state.json"

    @property
    def lock_file(self) -> Path:
        return self.work_dir / "agent.lock"

    @property
    def alive_file(self) -> Path:
        """The file the agent touches while it lives (:mod:`agent.liveness`)."""
        return self.work_dir / "agent.alive"

    def attempt_dir(self, attempt_id: str) -> Path:
        """The attempt's log, exit status and wrapper files: the agent's alone."""
        return self.work_dir / "attempts" / safe_name(attempt_id)

    def scratch_dir(self, attempt_id: str) -> Path:
        """The attempt's private working directory (its job's ``HOME`` and ``TMPDIR``)."""
        return self.work_dir / "scratch" / safe_name(attempt_id)


def safe_name(text: str) -> str:
    """``text`` as one path segment: anything but letters, digits, ``. _ -`` becomes ``_``."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".")
    return cleaned or "_"


def default_node_name() -> str:
    """This machine's hostname as a node id (letters, digits and ``. _ : @ -``)."""
    name = re.sub(r"[^A-Za-z0-9._:@-]", "-", socket.gethostname()).lstrip("._:@-")
    return name[:128] or "node"


def detect_nvidia() -> Machine | None:
    """The machine's NVIDIA GPUs from ``nvidia-smi --query-gpu=name``; None without nvidia-smi
    or when it lists none (or fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    if listed.returncode != 0 or not names:
        return None
    return Machine(gpus=len(names), gpu_type=_label(names[0]), nvidia=True)


def machine_for(declared: int | None) -> Machine | None:
    """The GPUs to register: ``declared`` slots when given (of the NVIDIA type when nvidia-smi
    finds GPUs), else every NVIDIA GPU; None for ``auto`` on a machine without one."""
    found = detect_nvidia()
    if declared is None:
        return found
    if found is not None:
        return Machine(gpus=declared, gpu_type=found.gpu_type, nvidia=True)
    return Machine(gpus=declared, gpu_type=SLOT_TYPE, nvidia=False)


def docker_answers() -> bool:
    """Whether a Docker engine answers ``docker info``."""
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _label(name: str) -> str:
    """A GPU name as the API's ``gpu_type``: printable and at most 64 characters."""
    return re.sub(r"[\x00-\x1f\x7f]", "", name)[:64]
