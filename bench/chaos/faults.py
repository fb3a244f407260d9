"""The faults: a seeded schedule, and what each kind does to the running :class:`Cluster`.

Kinds (each followed by a restart of what it hit after a short, seeded downtime):

- ``api``: kill -9 one API process (its clients move on to the others);
- ``worker``: kill -9 the solver worker and its pool (a solve in progress is lost);
- ``driver``: kill -9 a round driver, the active one three times in four (the standby takes
  over on the advisory lock), then start it again (as the new standby);
- ``agent``: kill -9 one simulated agent; it restarts from its state file, re-registers the
  same node and re-attaches to its attempts. Every other agent fault keeps it down past the
  node TTL, so the driver marks the node LOST and requeues its jobs first (the restarted agent
  then learns that its attempts must stop);
- ``redis``: kill -9 the broker and start it empty (plan requests in it are lost);
- ``postgres``: restart Postgres, alternately ``pg_ctl restart -m fast`` and a crash (kill -9
  of the postmaster and every backend, then a start that runs crash recovery).

One fault at a time: a fault's component is back (an API answers /healthz, Postgres accepts
connections) before the next is injected.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from bench.chaos.cluster import NODE_TTL_S, Cluster

KINDS = ("api", "worker", "driver", "agent", "redis", "postgres")


@dataclass
class Fault:
    """One injected fault: when (seconds into the run), what, for how long it was down and
    how long the restart took until the component answered again."""

    index: int
    kind: str
    target: str
    at_s: float
    down_s: float
    restart_s: float = 0.0
    detail: str = ""
    wall: float = 0.0
    """When it was injected (seconds since the epoch)."""

    @property
    def recovered(self) -> float:
        """When what it hit was back (seconds since the epoch)."""
        return self.wall + self.down_s + self.restart_s


def schedule(rng: random.Random, count: int) -> list[str]:
    """``count`` fault kinds in a seeded random order, as evenly spread over the kinds as
    ``count`` allows (every kind at least once from six faults on; which kinds get one more
    is drawn)."""
    extra = list(KINDS)
    rng.shuffle(extra)
    kinds = [*KINDS * (count // len(KINDS)), *extra[: count % len(KINDS)]]
    rng.shuffle(kinds)
    return kinds


class Injector:
    """Injects faults into ``cluster`` with seeded choices of target and downtime."""

    def __init__(self, cluster: Cluster, rng: random.Random, max_down_s: float) -> None:
        self.cluster = cluster
        self.rng = rng
        self.max_down_s = max_down_s
        self.down: set[str] = set()
        """Services killed on purpose and not yet restarted."""
        self._postgres_crash = False
        self._agent_long = False
        self.injected = 0
        """Faults injected so far (the workload keeps in step with it)."""

    def inject(self, index: int, kind: str, at_s: float) -> Fault:
        down_s = round(self.rng.uniform(0.5, self.max_down_s), 2)
        fault = Fault(index, kind, "", at_s, down_s, wall=time.time())
        if kind == "redis":
            fault.target = "redis"
            fault.detail = "kill -9, started empty"
            self.cluster.redis.stop()
            time.sleep(down_s)
            began = time.monotonic()
            self.cluster.redis.start()
        elif kind == "postgres":
            crash, self._postgres_crash = self._postgres_crash, not self._postgres_crash
            if crash:
                fault.target = "pg-crash"
                fault.detail = "kill -9 postmaster and backends, then start (crash recovery)"
                self.cluster.postgres.crash()
                time.sleep(down_s)
                began = time.monotonic()
                self.cluster.postgres.start()
            else:
                fault.target = "pg-restart"
                fault.detail = "pg_ctl restart -m fast"
                fault.down_s = 0.0
                began = time.monotonic()
                self.cluster.postgres.restart()
        else:
            fault.target = self._target(kind)
            service = self.cluster.service(fault.target)
            fault.detail = f"kill -9 pid {service.pid}"
            if kind == "agent":
                long, self._agent_long = self._agent_long, not self._agent_long
                if long:
                    fault.down_s = NODE_TTL_S + 2.0
                    fault.detail += ", down past the node TTL"
            self.down.add(fault.target)
            service.kill()
            time.sleep(fault.down_s)
            began = time.monotonic()
            self.cluster.restart(fault.target)
            self.down.discard(fault.target)
        fault.restart_s = round(time.monotonic() - began, 2)
        self.injected += 1
        return fault

    def _target(self, kind: str) -> str:
        if kind == "api":
            return self.rng.choice(sorted(self.cluster.api_urls))
        if kind == "worker":
            return "worker"
        if kind == "agent":
            return self.rng.choice(sorted(self.cluster.agents))
        if kind == "driver":
            drivers = sorted(self.cluster.drivers)
            leader = self.cluster.leader()
            if leader is not None and self.rng.random() < 0.75:
                return leader
            return self.rng.choice(drivers)
        raise ValueError(f"unknown fault kind {kind!r}")
