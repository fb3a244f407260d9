"""A simulated node agent as a process of its own, so the chaos run can kill -9 it and start it
again: ``python -m bench.chaos.agent --node n1 --gpus 2 --api URL,URL --state S --journal J``
(the agent token in SHOCKWAVE_CHAOS_TOKEN).

It speaks the agent protocol the real agent (:mod:`agent.loop`) speaks: register, then per
tick one ``POST /v1/agent/poll`` carrying the reports owed (``checkpointed`` for an attempt
the server says to stop, ``exited 0`` for one whose job is done), the attempts it runs, a
heartbeat every second, and asking for job tokens for new leases; when it started something
or owes reports, a second poll at once acknowledges the new attempts. It "trains" one epoch
per round a RUNNING lease holds: it reads the job's progress with the job's own token and
posts the next epoch as a progress event whose ``seq`` is the epoch number, so a retry, or a
second incarnation of the agent, posts the very same event. When the job's epochs are done the
attempt owes ``exited`` with code 0.

Like the real agent (:mod:`agent.state`) it keeps what it runs and the reports it owes in a
state file, rewritten atomically before it tells the server, so a restarted agent
re-registers the same node and re-attaches to its attempts (and delivers the reports a kill
interrupted) instead of starting them twice. Every answer the server acknowledged (2xx) is
appended to the journal (JSON lines), which the chaos run's invariants read: an acknowledged
event must exist exactly once in the database.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from bench.chaos.client import RoundRobin, Unavailable
from shockwave.domain.lifecycle import LeaseState

TICK_S = 0.3
HEARTBEAT_EVERY_S = 1.0
EPOCH_SECONDS = 2.0
"""The wall time a simulated epoch reports."""
CALL_DEADLINE_S = 15.0
TOKEN_ENV = "SHOCKWAVE_CHAOS_TOKEN"


@dataclass
class Attempt:
    """An attempt this node runs: its job, the job token and the rounds it trained in (an
    attempt whose job is done has ended: :meth:`Agent.end`)."""

    attempt_id: str
    job_id: str
    token: str
    rounds: list[int] = field(default_factory=list)


@dataclass
class State:
    """What survives a restart: the running attempts, those that ended (so a lease the server
    still lists for an ended attempt never starts it again) and the reports owed, in order."""

    attempts: dict[str, Attempt] = field(default_factory=dict)
    ended: list[str] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> State:
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls(
            attempts={k: Attempt(**v) for k, v in raw["attempts"].items()},
            ended=list(raw["ended"]),
            outbox=list(raw.get("outbox", [])),
        )

    def save(self, path: Path) -> None:
        """Write, fsync, rename: a kill at any point leaves the old or the new file."""
        scratch = path.with_suffix(".tmp")
        with scratch.open("w") as out:
            json.dump(
                {
                    "attempts": {k: asdict(v) for k, v in self.attempts.items()},
                    "ended": self.ended,
                    "outbox": self.outbox,
                },
                out,
            )
            out.flush()
            os.fsync(out.fileno())
        scratch.replace(path)


class Agent:
    """One node's loop (module docstring)."""

    def __init__(
        self, node: str, gpus: int, client: RoundRobin, state_path: Path, journal: TextIO
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.client = client
        self.state_path = state_path
        self.state = State.load(state_path)
        self.journal = journal
        self.last_heartbeat = 0.0

    def run(self) -> None:
        self.register()
        while True:
            try:
                self.tick()
            except Unavailable as error:
                self.note("unavailable", detail=str(error))
            time.sleep(TICK_S)

    def register(self) -> None:
        while True:
            try:
                response = self.client.call(
                    "POST",
                    "/v1/agent/register",
                    json={"gpus": self.gpus, "hostname": f"{self.node}.chaos"},
                    deadline_s=CALL_DEADLINE_S,
                )
            except Unavailable as error:
                self.note("unavailable", detail=str(error))
                continue
            _expect(response, 200)
            self.last_heartbeat = time.monotonic()
            self.note("registered", attempts=sorted(self.state.attempts))
            return

    def tick(self) -> None:
        """One contact (module docstring), then an epoch of each RUNNING lease's new round."""
        beat = time.monotonic() - self.last_heartbeat >= HEARTBEAT_EVERY_S
        body = self.poll(heartbeat=beat, tokens=True)
        if body is None:
            return
        if beat:
            self.last_heartbeat = time.monotonic()
        started = self.reconcile(body)
        if started or self.state.outbox:
            body = self.poll(heartbeat=False, tokens=False)
            if body is None:
                return
            self.reconcile(body)
        for lease in body["leases"]:
            if lease["state"] == LeaseState.RUNNING and lease["attempt_id"] in self.state.attempts:
                self.train_round(self.state.attempts[lease["attempt_id"]], lease)

    def poll(self, heartbeat: bool, tokens: bool) -> dict[str, Any] | None:
        """``POST /v1/agent/poll``; its answer, or None when the node had to register again
        (the server does not know it: a fresh database). Answered reports leave the outbox;
        those a kill or a lost answer interrupts are sent again (a repeated stop report is
        answered as the first was)."""
        sent = list(self.state.outbox)
        response = self.client.call(
            "POST",
            "/v1/agent/poll",
            json={
                "heartbeat": heartbeat,
                "tokens": tokens,
                "reports": sent,
                "running": sorted(self.state.attempts),
            },
            deadline_s=CALL_DEADLINE_S,
        )
        if response.status_code == 404:
            self.register()
            return None
        _expect(response, 200)
        body: dict[str, Any] = response.json()
        for report, answer in zip(sent, body["reports"], strict=True):
            self.note("reported", attempt=report["attempt_id"], state=report["state"],
                      status=answer["status"])  # fmt: skip
        if sent:
            del self.state.outbox[: len(sent)]
            self.state.save(self.state_path)
        return body

    def reconcile(self, body: dict[str, Any]) -> bool:
        """Stop what the server says to stop (owing ``checkpointed``), start each new lease
        with the token the poll minted for it; whether something started."""
        for attempt_id in body["stop"]:
            if attempt_id in self.state.attempts:
                self.end(attempt_id, "checkpointed", {"state": "checkpointed"})
        started = False
        for lease in body["leases"]:
            attempt_id, job_id = lease["attempt_id"], lease["job_id"]
            if attempt_id in self.state.ended or attempt_id in self.state.attempts:
                continue
            token = body["tokens"].get(attempt_id)
            if token is None:  # not asked for (an acknowledging poll): the next contact
                continue
            self.state.attempts[attempt_id] = Attempt(attempt_id, job_id, token)
            self.state.save(self.state_path)
            self.note("started", attempt=attempt_id, job=job_id, round=int(lease["round_index"]))
            started = True
        return started

    def train_round(self, attempt: Attempt, lease: dict[str, Any]) -> None:
        """An epoch for the lease's round, once per round; the attempt ends when its job is
        done (owing ``exited 0``) or its events are refused as fenced (owing
        ``checkpointed``: the process stops)."""
        round_index = int(lease["round_index"])
        if round_index in attempt.rounds:
            return
        attempt.rounds.append(round_index)
        self.state.save(self.state_path)
        outcome = self.train(attempt, round_index)
        if outcome == "fenced":
            self.end(attempt.attempt_id, "fenced", {"state": "checkpointed"})
        elif outcome == "done":
            self.end(attempt.attempt_id, "exited", {"state": "exited", "exit_code": 0})

    def train(self, attempt: Attempt, round_index: int) -> str:
        """One epoch of the attempt's job (unless all are done): "done" when all are done
        now, "fenced" when the server refused the event as the attempt's, else "trained"."""
        response = self.client.call(
            "GET", f"/v1/jobs/{attempt.job_id}", token=attempt.token, deadline_s=CALL_DEADLINE_S
        )
        _expect(response, 200)
        job = response.json()
        done, epochs = int(job["epochs_done"]), int(job["epochs"])
        if done >= epochs:
            return "done"
        epoch = done + 1
        event = {
            "seq": epoch,
            "kind": "progress",
            "epoch": epoch,
            "samples": int(job["samples_per_epoch"]),
            "seconds": EPOCH_SECONDS,
            "batch_size": int(job["initial_batch_size"]),
        }
        response = self.client.call(
            "POST",
            f"/v1/jobs/{attempt.job_id}/events",
            json=event,
            token=attempt.token,
            headers={"Idempotency-Key": f"progress-{attempt.job_id}-{epoch}"},
            deadline_s=CALL_DEADLINE_S,
        )
        if response.status_code == 409:  # fenced, or the job finished meanwhile (elsewhere)
            return "fenced" if response.json().get("fenced") else "done"
        _expect(response, 200, 201)
        self.note(
            "event",
            job=attempt.job_id,
            seq=epoch,
            kind="progress",
            status=response.status_code,
            attempt=attempt.attempt_id,
            round=round_index,
        )
        return "done" if epoch >= epochs else "trained"

    def end(self, attempt_id: str, how: str, report: dict[str, Any]) -> None:
        """The attempt's process is gone: remember it ended and owe ``report`` on it, in one
        write of the state file."""
        if self.state.attempts.pop(attempt_id, None) is None:
            return
        self.state.ended.append(attempt_id)
        self.state.outbox.append({"attempt_id": attempt_id, **report})
        self.state.save(self.state_path)
        self.note("ended", attempt=attempt_id, how=how)

    def note(self, what: str, **fields: Any) -> None:
        """Append one line to the journal (flushed: it survives a kill -9 of this process)."""
        record = {"t": time.time(), "node": self.node, "type": what, **fields}
        self.journal.write(json.dumps(record) + "\n")
        self.journal.flush()


class ProtocolError(Exception):
    """The server answered something the protocol does not allow."""


def _expect(response: Any, *codes: int) -> None:
    if response.status_code not in codes:
        raise ProtocolError(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {response.text[:300]}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", required=True)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--api", required=True, help="Comma-separated API base URLs.")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--journal", type=Path, required=True)
    args = parser.parse_args(argv)
    token = os.environ[TOKEN_ENV]

    def leave(signum: int, frame: FrameType | None) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    client = RoundRobin(args.api.split(","), token)
    with args.journal.open("a") as journal:
        Agent(args.node, args.gpus, client, args.state, journal).run()


if __name__ == "__main__":
    main()
