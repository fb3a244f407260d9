"""Test clients acting as node agents, and as the training programs they would start.

A :class:`SimulatedAgent` speaks the agent protocol of /v1/agent (register, heartbeat, poll
leases, report attempts) over HTTP. Instead of starting a process for a lease it simulates one:
each round a job holds a lease it "trains" one epoch, posted as a progress event with the job's
own token (from ``POST /v1/agent/leases/{attempt}/token``, as a real training program would),
and once the job's epochs are done the attempt reports ``exited`` with code 0. An attempt the
server says must stop reports ``checkpointed``. :meth:`Fleet.tick` does one step of every
agent; tests call it in their own bounded loops.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.deployment import Deployment

HEARTBEAT_EVERY_S = 1.0
EPOCH_SECONDS = 2.0
"""The wall time a simulated epoch reports (the test's round length)."""


@dataclass
class Job:
    """What the agents know of a submitted job: its id, length and batch size."""

    id: str
    gpus: int
    epochs: int
    samples_per_epoch: int
    batch_size: int
    epochs_done: int = 0
    token: str | None = None
    seq: int = 0


@dataclass
class Attempt:
    attempt_id: str
    job_id: str
    rounds: set[int] = field(default_factory=set)


@dataclass
class SimulatedAgent:
    """One node: ``gpus`` GPUs, acting with ``token`` (an agent token for ``node``)."""

    node: str
    token: str
    base_url: str
    gpus: int = 2
    running: dict[str, Attempt] = field(default_factory=dict)
    last_heartbeat: float = 0.0
    observed: dict[int, dict[str, list[int]]] = field(default_factory=lambda: defaultdict(dict))
    """round index -> job id -> local GPUs, for every lease this node was given."""

    def __post_init__(self) -> None:
        self.client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10.0,
        )

    def close(self) -> None:
        self.client.close()

    def register(self) -> dict[str, Any]:
        response = self.client.post(
            "/v1/agent/register", json={"gpus": self.gpus, "hostname": f"{self.node}.local"}
        )
        assert response.status_code == 200, response.text
        self.last_heartbeat = time.monotonic()
        body: dict[str, Any] = response.json()
        return body

    def heartbeat(self) -> None:
        response = self.client.post("/v1/agent/heartbeat")
        assert response.status_code == 200, response.text
        self.last_heartbeat = time.monotonic()

    def tick(self, jobs: dict[str, Job]) -> None:
        """Heartbeat when due, poll leases, start new attempts, train one epoch per new round
        of a lease, finish jobs whose epochs are done, checkpoint what must stop."""
        if time.monotonic() - self.last_heartbeat >= HEARTBEAT_EVERY_S:
            self.heartbeat()
        response = self.client.get(
            "/v1/agent/leases", params={"running": ",".join(sorted(self.running))}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        for attempt_id in body["stop"]:
            if attempt_id in self.running:
                self._report(attempt_id, {"state": "checkpointed"})
                del self.running[attempt_id]
        for lease in body["leases"]:
            self._follow(lease, jobs)

    def _follow(self, lease: dict[str, Any], jobs: dict[str, Job]) -> None:
        attempt_id, job_id, round_index = lease["attempt_id"], lease["job_id"], lease["round_index"]
        assert len(lease["gpus"]) == len(set(lease["gpus"])), lease
        assert all(0 <= g < self.gpus for g in lease["gpus"]), lease
        self.observed[round_index][job_id] = sorted(lease["gpus"])
        job = jobs[job_id]
        attempt = self.running.get(attempt_id)
        if attempt is None:
            attempt = self.running[attempt_id] = Attempt(attempt_id, job_id)
            response = self.client.post(f"/v1/agent/leases/{attempt_id}/token")
            assert response.status_code == 201, response.text
            job.token = response.json()["token"]  # scoped to this attempt: older ones are fenced
            if not self._report(attempt_id, {"state": "started"}):
                return
        if round_index in attempt.rounds:
            return
        attempt.rounds.add(round_index)
        if not self._report(attempt_id, {"state": "running"}):
            return
        if job.epochs_done < job.epochs:
            self._train_epoch(job)
        if job.epochs_done >= job.epochs:
            self._report(attempt_id, {"state": "exited", "exit_code": 0})
            del self.running[attempt_id]

    def _train_epoch(self, job: Job) -> None:
        job.seq += 1
        event = {
            "seq": job.seq,
            "kind": "progress",
            "epoch": job.epochs_done + 1,
            "samples": job.samples_per_epoch,
            "seconds": EPOCH_SECONDS,
            "batch_size": job.batch_size,
        }
        response = httpx.post(
            f"{self.base_url}/v1/jobs/{job.id}/events",
            json=event,
            headers={"Authorization": f"Bearer {job.token}"},
            timeout=10.0,
        )
        assert response.status_code == 201, response.text
        job.epochs_done += 1

    def _report(self, attempt_id: str, report: dict[str, Any]) -> bool:
        """Report on an attempt; False (and the attempt dropped) when the server says stop."""
        response = self.client.post(f"/v1/agent/leases/{attempt_id}/status", json=report)
        if response.status_code == 409:
            self.running.pop(attempt_id, None)
            return False
        assert response.status_code == 200, response.text
        return True


@dataclass
class Fleet:
    """The agents of a test and the jobs they run."""

    agents: list[SimulatedAgent]
    jobs: dict[str, Job] = field(default_factory=dict)

    def tick(self) -> None:
        for agent in self.agents:
            agent.tick(self.jobs)

    def leases_of_round(self, round_index: int) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
        """job id -> [(node, local GPUs)] for the leases the agents saw in ``round_index``."""
        seen: dict[str, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
        for agent in self.agents:
            for job_id, gpus in agent.observed.get(round_index, {}).items():
                seen[job_id].append((agent.node, tuple(gpus)))
        return dict(seen)

    def close(self) -> None:
        for agent in self.agents:
            agent.close()


def register_fleet(stack: Deployment, api_url: str, nodes: Mapping[str, int]) -> Fleet:
    """Registered agents of ``stack``: node id -> GPUs."""
    tokens = stack.agent_tokens(list(nodes))
    agents = [
        SimulatedAgent(node, token, api_url, gpus)
        for (node, gpus), token in zip(nodes.items(), tokens, strict=True)
    ]
    for agent in agents:
        agent.register()
    return Fleet(agents)


def submit_job(stack: Deployment, api_url: str, fleet: Fleet, **body: Any) -> Job:
    """Submit a job (``body``: its fields, small defaults for the rest) for ``fleet`` to run."""
    spec = {"samples_per_epoch": 1000, "initial_batch_size": 32, **body}
    response = httpx.post(
        f"{api_url}/v1/jobs",
        json=spec,
        headers={"Authorization": f"Bearer {stack.admin_token}"},
        timeout=10.0,
    )
    assert response.status_code == 201, response.text
    created = response.json()
    job = Job(
        id=created["id"],
        gpus=spec["gpus"],
        epochs=spec["epochs"],
        samples_per_epoch=spec["samples_per_epoch"],
        batch_size=spec["initial_batch_size"],
    )
    fleet.jobs[job.id] = job
    return job
