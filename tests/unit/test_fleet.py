"""The simulated agents of replay and the scale bench (shockwave_fleet/fleet.py) speak the poll
protocol as the real agent does: these check what a node does with a poll's answer and what
its training owes, with the HTTP calls recorded instead of sent."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shockwave.domain.model import Cluster, Regime
from shockwave_cli.runtime.replay import (
    LEASE_SLACK_S,
    ReplayConfig,
    fill_jobs,
    first_arrival_at,
    round_start_at,
)
from shockwave_fleet.fleet import (
    BUSY_RETRY_S,
    Attempt,
    Fleet,
    FleetLog,
    Node,
    TrainingJob,
    answered_for,
)

T1 = "2099-01-01T00:00:00+00:00"
T2 = "2099-01-01T00:02:00+00:00"


class RecordingFleet(Fleet):
    """A fleet whose requests are recorded and answered by ``answer``."""

    def __init__(self, jobs: dict[str, TrainingJob], answer: Any = None) -> None:
        super().__init__(["http://api"], {"n1": ("agent-token", 4)}, jobs, poll_s=1.0,
                         heartbeat_s=3.0)  # fmt: skip
        self.calls: list[tuple[str, str, dict[str, Any] | None]] = []
        self.answer = answer

    async def _call(
        self, kind: str, method: str, path: str, token: str, body: Any = None, **_: Any
    ) -> Any:
        self.calls.append((kind, path, body))
        return self.answer


def job(job_id: str, epochs: int = 2, epoch_s: float = 10.0) -> TrainingJob:
    return TrainingJob(job_id, 100, (Regime(32, epochs),), {32: epoch_s})


def lease(attempt_id: str, job_id: str, ends_at: str = T1) -> dict[str, Any]:
    return {"attempt_id": attempt_id, "job_id": job_id, "ends_at": ends_at}


def answer(leases: list[dict[str, Any]], stop: Sequence[str] = (), **tokens: str) -> Any:
    return {"current_round": 3, "leases": leases, "stop": list(stop), "tokens": tokens,
            "reports": []}  # fmt: skip


def test_a_new_lease_starts_with_the_token_its_poll_minted_and_only_then() -> None:
    jobs = {"j1": job("j1"), "j2": job("j2")}
    fleet, node = RecordingFleet(jobs), Node("agent-token")
    started = fleet._reconcile(node, answer([lease("a1", "j1"), lease("a2", "j2")], a1="tok-1"))
    assert started
    assert list(node.attempts) == ["a1"]  # a2 got no token: not started, asked again next poll
    assert jobs["j1"].token == "tok-1"
    assert node.outbox == []


def test_a_lease_whose_minted_token_was_lost_gets_one_asked_for_and_starts() -> None:
    """The answer that minted a2's token never arrived (a timeout): the server mints one
    token an attempt, so the next answers carry none. The node asks the token route for a new
    one, as the real agent does, and starts a2; without it every long poll of the node was
    answered at once for a2, for the rest of the run."""
    jobs = {"j1": job("j1"), "j2": job("j2")}
    fleet, node = RecordingFleet(jobs, answer={"token": "tok-2"}), Node("agent-token")
    poll = answer([lease("a1", "j1"), lease("a2", "j2")], a1="tok-1")
    assert asyncio.run(fleet._changeover(node, poll))
    assert fleet.calls == [("token", "/v1/agent/leases/a2/token", None)]  # a1's came minted
    assert sorted(node.attempts) == ["a1", "a2"]
    assert (jobs["j1"].token, jobs["j2"].token) == ("tok-1", "tok-2")
    # an attempt started here, or told to stop, is never asked for
    fleet.calls.clear()
    assert not asyncio.run(
        fleet._changeover(node, answer([lease("a1", "j1"), lease("a3", "j2")], stop=["a3"]))
    )
    assert fleet.calls == []


def test_a_token_asked_for_and_not_answered_leaves_the_lease_for_the_next_answer() -> None:
    jobs = {"j1": job("j1")}
    fleet, node = RecordingFleet(jobs, answer=None), Node("agent-token")
    assert not asyncio.run(fleet._changeover(node, answer([lease("a1", "j1")])))
    assert node.attempts == {} and fleet.calls == [("token", "/v1/agent/leases/a1/token", None)]
    fleet.answer = {"token": "tok-1"}
    assert asyncio.run(fleet._changeover(node, answer([lease("a1", "j1")])))
    assert list(node.attempts) == ["a1"] and jobs["j1"].token == "tok-1"


def test_a_lease_that_went_or_is_listed_in_stop_owes_checkpointed_and_never_restarts() -> None:
    jobs = {"j1": job("j1"), "j2": job("j2"), "j3": job("j3")}
    fleet, node = RecordingFleet(jobs), Node("agent-token")
    for attempt_id, job_id in (("a1", "j1"), ("a2", "j2"), ("a3", "j3")):
        node.attempts[attempt_id] = Attempt(attempt_id, job_id, T1, time.time())
    poll = answer([lease("a2", "j2"), lease("a3", "j3", ends_at=T2)], stop=["a2"])
    assert not fleet._reconcile(node, poll)
    assert list(node.attempts) == ["a3"]
    assert node.attempts["a3"].ends_at == T2  # an extension needs no report
    assert node.outbox == [
        {"attempt_id": "a1", "state": "checkpointed"},
        {"attempt_id": "a2", "state": "checkpointed"},
    ]
    # the server still lists a1 (say the revoke has not reached this poll): it stays ended
    assert not fleet._reconcile(node, answer([lease("a1", "j1")], a1="tok"))
    assert "a1" not in node.attempts


def test_training_posts_each_epoch_and_a_finished_job_owes_exited_0() -> None:
    jobs = {"j1": job("j1", epochs=2, epoch_s=0.0001)}
    fleet, node = RecordingFleet(jobs, answer={}), Node("agent-token")
    fleet._reconcile(node, answer([lease("a1", "j1")], a1="tok-1"))
    time.sleep(0.01)
    asyncio.run(fleet._train(node))
    assert [(kind, body["epoch"]) for kind, _, body in fleet.calls if body] == [
        ("progress", 1),
        ("progress", 2),
    ]
    assert jobs["j1"].finished
    assert node.attempts == {}
    assert node.outbox == [{"attempt_id": "a1", "state": "exited", "exit_code": 0}]


def test_a_poll_sends_the_reports_owed_and_the_attempts_running_and_drops_what_was_answered(
) -> None:  # fmt: skip
    fleet = RecordingFleet({"j1": job("j1")}, answer=answer([]))
    node = Node("agent-token")
    node.attempts["a3"] = Attempt("a3", "j1", T1, time.time())
    node.outbox.append({"attempt_id": "a1", "state": "checkpointed"})
    asyncio.run(fleet._poll(node, "poll", heartbeat=False, tokens=True))
    assert fleet.calls == [
        (
            "poll",
            "/v1/agent/poll",
            {
                "heartbeat": False,
                "tokens": True,
                "reports": [{"attempt_id": "a1", "state": "checkpointed"}],
                "running": ["a3"],
                "defer_busy": True,
            },
        )
    ]
    assert node.outbox == []
    fleet.answer = None  # the request failed: the report stays owed
    node.outbox.append({"attempt_id": "a2", "state": "checkpointed"})
    asyncio.run(fleet._poll(node, "poll", heartbeat=True, tokens=True))
    assert node.outbox == [{"attempt_id": "a2", "state": "checkpointed"}]


def test_what_a_poll_answers_503_stays_owed_first_and_in_order() -> None:
    fleet = RecordingFleet({"j1": job("j1")})
    node = Node("agent-token")
    node.attempt_of["j1"] = "a3"
    owed = [{"attempt_id": a, "state": "checkpointed"} for a in ("a1", "a2", "a4")]
    node.outbox.extend(owed)
    progress = {"attempt_id": "a3", "seq": 1, "kind": "progress", "epoch": 1}
    node.events.append(progress)
    busy = {"status": 503, "stop": False, "detail": "busy"}
    fleet.answer = {
        **answer([]),
        "reports": [
            {"attempt_id": "a1", **busy},
            {"attempt_id": "a2", "status": 200, "stop": True},
            {"attempt_id": "a4", **busy},
        ],
        "events": [{"attempt_id": "a3", "seq": 1, **busy}],
    }
    asyncio.run(fleet._poll(node, "poll", heartbeat=False, tokens=False))
    assert node.outbox == [owed[0], owed[2]]
    assert node.events == [progress]
    assert fleet.log.events["progress deferred"] == 1
    assert fleet.jobs["j1"].accepted == []


def test_a_started_attempt_restores_first_and_trains_no_further_than_its_lease() -> None:
    jobs = {"j1": job("j1", epochs=100, epoch_s=10.0)}
    fleet, node = RecordingFleet(jobs, answer={}), Node("agent-token")
    fleet.restart_s = 5.0
    before = time.time()
    fleet._reconcile(node, answer([lease("a1", "j1")], a1="tok-1"))
    attempt = node.attempts["a1"]
    assert before + 5.0 <= attempt.started_t <= time.time() + 5.0  # restoring: nothing trained
    attempt.started_t -= 100.0  # the restore ended long ago, and the lease 3 s after it
    attempt.ends_t = attempt.started_t + 3.0
    asyncio.run(fleet._train(node))
    assert jobs["j1"].spans == [(attempt.started_t, attempt.ends_t)]
    assert jobs["j1"].partial_s == 3.0
    assert jobs["j1"].restarts == 1


def started_with_slack(
    slack_s: float,
) -> tuple[dict[str, TrainingJob], RecordingFleet, Node, Attempt]:
    """A fleet whose attempts train ``slack_s`` past their lease, with one attempt started."""
    jobs = {"j1": job("j1", epochs=100, epoch_s=10.0)}
    fleet, node = RecordingFleet(jobs, answer={}), Node("agent-token")
    fleet.lease_slack_s = slack_s
    fleet._reconcile(node, answer([lease("a1", "j1")], a1="tok-1"))
    return jobs, fleet, node, node.attempts["a1"]


def test_with_no_word_a_program_trains_on_past_its_lease_for_the_slack_only() -> None:
    jobs, fleet, node, attempt = started_with_slack(2.0)
    attempt.started_t -= 100.0  # the lease ended 97 s ago, no word since: 2 s past it count
    attempt.ends_t = attempt.started_t + 3.0
    asyncio.run(fleet._train(node))
    assert jobs["j1"].partial_s == 5.0
    # the extension comes (late): the same attempt goes on, credited from where it paused
    fleet._settle(node, answer([lease("a1", "j1", ends_at=T2)]))
    assert node.attempts["a1"] is attempt and attempt.ends_t > time.time()
    assert jobs["j1"].trained_until == attempt.started_t + 5.0


def test_an_attempt_revoked_within_the_slack_trains_until_the_revoke_reaches_it() -> None:
    jobs, fleet, node, attempt = started_with_slack(2.0)
    now = time.time()
    attempt.started_t, attempt.ends_t = now - 4.0, now - 1.0  # ended 1 s ago: within the slack
    asyncio.run(fleet._changeover(node, answer([])))  # the revoke: a1 is no longer leased
    assert "a1" not in node.attempts
    assert node.outbox == [{"attempt_id": "a1", "state": "checkpointed"}]
    assert 4.0 <= jobs["j1"].partial_s <= 4.0 + (time.time() - now)  # to the revoke, not to 3 s
    fleet.lease_slack_s = 0.0  # without the slack: no further than the lease's end
    jobs["j2"] = job("j2", epochs=100, epoch_s=10.0)
    fleet._reconcile(node, answer([lease("a2", "j2")], a2="tok-2"))
    node.attempts["a2"].started_t, node.attempts["a2"].ends_t = now - 4.0, now - 1.0
    asyncio.run(fleet._changeover(node, answer([])))
    assert jobs["j2"].partial_s == 3.0


def test_with_report_s_only_the_latest_epoch_is_posted_and_every_batch_size_change() -> None:
    trained = TrainingJob("j1", 100, (Regime(32, 3), Regime(64, 3)), {32: 1.0, 64: 1.0})
    fleet, node = RecordingFleet({"j1": trained}, answer={}), Node("agent-token")
    fleet.report_s = 60.0
    fleet._reconcile(node, answer([lease("a1", "j1")], a1="tok-1"))
    node.attempts["a1"].started_t -= 3.5  # it has trained 3.5 s: epochs 1 to 3 are done
    asyncio.run(fleet._train(node))
    posted = [body for _, _, body in fleet.calls if body]
    assert [(b["kind"], b["epoch"]) for b in posted] == [("progress", 3), ("scaling", 3)]
    assert posted[1]["batch_size"] == 64
    trained.trained_until -= 10.0  # 10 s more: finished, the last epoch is posted at once
    asyncio.run(fleet._train(node))
    last = [body for _, _, body in fleet.calls if body][-1]
    assert last["kind"] == "progress" and last["epoch"] == 6
    assert trained.finished and trained.finished_at is not None
    assert node.outbox == [{"attempt_id": "a1", "state": "exited", "exit_code": 0}]


def test_a_node_polls_just_after_the_round_ends_and_again_soon_until_the_next_is_out() -> None:
    fleet = Fleet(["http://api"], {"n1": ("t", 4)}, {}, poll_s=0.1, heartbeat_s=3.0,
                  boundary_lag_s=0.02, boundary_retry_s=0.01)  # fmt: skip
    assert fleet.until_boundary_poll(0.5) == 0.52  # the round ends in 0.5 s
    assert fleet.until_boundary_poll(-0.05) == 0.01  # ended, the next one not out yet
    assert fleet.until_boundary_poll(-0.5) == -0.48  # long overdue: the regular interval
    assert Fleet(["http://api"], {"n1": ("t", 4)}, {}, poll_s=0.1, heartbeat_s=3.0,
                 boundary_lag_s=0.02).until_boundary_poll(-0.05) < 0  # fmt: skip


def test_the_trainer_wakes_when_a_leased_job_finishes_not_a_poll_later() -> None:
    two = TrainingJob("j1", 100, (Regime(32, 1), Regime(64, 2)), {32: 0.1, 64: 0.05})
    two.epochs_done, two.partial_s = 1, 0.02  # 2 epochs of 0.05 s left, 0.02 s of one done
    assert abs(two.seconds_left() - 0.08) < 1e-9
    fleet, node = RecordingFleet({"j1": two}), Node("agent-token")  # polls every 1 s
    now = time.time()
    node.attempts["a1"] = Attempt("a1", "j1", T2, now, now + 60.0)
    assert 0.0 < fleet.next_training_step(node) <= 0.09
    node.attempts["a1"].ends_t = now + 0.05  # the lease ends first: nothing to wake for
    assert fleet.next_training_step(node) == 1.0


def test_a_refusal_of_an_older_attempts_token_does_not_stop_the_newer_attempt() -> None:
    """An event of attempt a1 is in flight when a2 starts the job on another node with a new
    token; the 409 that fences a1 must not stop a2 (it did: a2 ended silently, the service
    kept extending its lease and the job never finished)."""
    j1 = job("j1")
    fleet = RecordingFleet({"j1": j1})
    j1.token = "tok-a1"

    async def refused_after_a2_started(*_: Any, **__: Any) -> Any:
        j1.token = "tok-a2"  # a2 started while the request of a1 was in flight
        fleet.log.refused_last = True
        return None

    fleet._call = refused_after_a2_started  # type: ignore[method-assign]
    asyncio.run(fleet._job_event(j1, {"seq": 1, "kind": "progress"}))
    assert not j1.fenced
    asyncio.run(fleet._job_event(j1, {"seq": 2, "kind": "progress"}))  # a2's own token refused
    assert j1.fenced


def test_a_changeover_starts_the_new_lease_before_the_stopping_attempt_posts_its_last_epoch(
) -> None:  # fmt: skip
    """With long polls a new lease starts at once (its restore stands for the checkpoint the
    stopping attempt writes); the stopping attempt's last progress goes out after, and its
    ``checkpointed`` report after that."""
    done = job("j1", epochs=4, epoch_s=0.0001)
    done.epochs_done, done.posted_epoch, done.token = 2, 2, "tok-old"
    jobs = {"j1": done, "j2": job("j2")}
    fleet, node = RecordingFleet(jobs, answer={}), Node("agent-token")
    node.attempts["a1"] = Attempt("a1", "j1", T1, time.time() - 1.0)
    started_at: list[float] = []
    real_start = fleet._start

    def start(here: Node, poll: Any, tokens: Any = None) -> bool:
        started_at.append(len(fleet.calls))
        return real_start(here, poll, tokens)

    fleet._start = start  # type: ignore[method-assign]
    poll = answer([lease("a2", "j2")], a2="tok-2")  # a1 is gone: it stops
    assert asyncio.run(fleet._changeover(node, poll))
    assert started_at == [0], "started before any request"
    assert list(node.attempts) == ["a2"] and jobs["j2"].token == "tok-2"
    assert [(kind, body and body["epoch"]) for kind, _, body in fleet.calls] == [
        ("progress", 3),
        ("progress", 4),
    ]
    assert node.outbox == [{"attempt_id": "a1", "state": "checkpointed"}]


def test_a_long_poll_names_its_wait_and_the_round_it_saw_and_carries_the_reports_owed() -> None:
    fleet = RecordingFleet({"j1": job("j1")}, answer=answer([]))
    node = Node("agent-token", seen_round=7)
    owed = {"attempt_id": "a1", "state": "checkpointed"}
    exited = {"attempt_id": "a2", "state": "exited", "exit_code": 0}
    node.outbox.append(owed)
    recorded = fleet._call

    async def held(*args: Any, **kwargs: Any) -> Any:
        assert node.outbox == [], "taken out when sent, not when answered"
        node.outbox.append(exited)  # a job exits while the poll is held
        return await recorded(*args, **kwargs)

    fleet._call = held  # type: ignore[method-assign]
    asyncio.run(fleet._poll(node, "poll", heartbeat=True, tokens=True, wait_s=0.1))
    (_, _, body) = fleet.calls[0]
    assert body is not None
    assert (body["wait_s"], body["seen_round"], body["reports"]) == (0.1, 7, [owed])
    assert node.outbox == [exited], "the exit is owed still, the report sent is not"


def test_a_stop_the_server_asked_for_rides_in_the_next_poll_and_an_exit_is_sent_at_once() -> None:
    jobs = {"j1": job("j1", epochs=100), "j2": job("j2", epochs=100)}
    fleet, node = RecordingFleet(jobs), Node("agent-token")
    fleet._reconcile(node, answer([lease("a1", "j1"), lease("a2", "j2")], a1="t1", a2="t2"))
    fleet._settle(node, answer([lease("a2", "j2")], stop=["a1"]))
    assert node.outbox == [{"attempt_id": "a1", "state": "checkpointed"}]
    assert not node.wake.is_set(), "no poll of its own: the next long poll carries it"
    node.end("a2", {"state": "exited", "exit_code": 0})
    assert node.wake.is_set()


def test_the_replay_long_polls_wherever_its_own_driver_wakes_the_held_polls(
    tmp_path: Path,
) -> None:
    """Embedded and distributed: on by default (woken in-process, or over Postgres NOTIFY);
    a service at ``--api`` (of unknown make): off; an explicit choice wins."""
    cluster = Cluster.of_gpus(4, 2)
    config = ReplayConfig(cluster, "shockwave", tmp_path)
    assert config.long_polls
    assert replace(config, mode="distributed").long_polls
    assert not replace(config, api="http://127.0.0.1:1").long_polls
    assert not replace(config, mode="distributed", long_poll=False).long_polls


def test_the_simulators_rule_gives_a_lease_no_slack_and_a_guard_the_real_one_the_slack(
    tmp_path: Path,
) -> None:
    """Under the simulator's rule a revoked job trains no further than its lease's end (the
    simulator's rounds end at their boundary) and a short final stretch is not charged; under
    ``always`` it trains on for the real agent's slack and every start restores."""
    config = ReplayConfig(Cluster.of_gpus(4, 2), "gavel", tmp_path, time_scale=120.0)
    assert config.lease_slack_wall_s == 0.0
    assert config.restore_guard_wall_s == pytest.approx(5.0 / 120.0)
    real = replace(config, restore_rule="always")
    assert LEASE_SLACK_S > 0
    assert real.lease_slack_wall_s == pytest.approx(LEASE_SLACK_S / 120.0)
    assert real.restore_guard_wall_s is None


def test_fills_count_the_jobs_started_mid_round_extended_or_not() -> None:
    """A fill's lease keeps its issue time when later rounds extend it: it is still a fill.
    A gang's leases (one per node) count once; a lease issued at a round's start is no fill,
    nor one issued before the first round."""
    rounds = {0: 100.0, 1: 101.0, 2: 102.0}
    issued = [
        ("a", 100.0),  # at round 0's start
        ("b", 100.4),  # mid-round 0 (later extended: the same issue time)
        ("c", 101.5),  # mid-round 1, on two nodes
        ("c", 101.5),
        ("d", 102.0004),  # at round 2's start, within the stamp's resolution
        ("e", 99.0),  # before the first round
    ]
    assert fill_jobs(issued, rounds) == 2
    assert fill_jobs(issued, {}) == 0


def test_a_round_begun_early_is_matched_to_the_boundary_it_was_due_at() -> None:
    """A lease issued at a round's start counts its start lag from the boundary the round was
    due at (the end of the round before), matched to the millisecond: the driver's boundary
    lead begins rounds before that."""
    due = {99.95: 100.0, 219.95: 220.0}

    def boundary_due_at(stamp: float, due: dict[float, float]) -> float | None:
        begun = round_start_at(stamp, sorted(due))
        return None if begun is None else due[begun]

    assert boundary_due_at(219.9504, due) == 220.0
    assert boundary_due_at(99.95, due) == 100.0
    assert boundary_due_at(150.0, due) is None
    assert boundary_due_at(99.95, {}) is None


def test_the_first_job_goes_in_just_after_a_round_boundary_the_agents_saw() -> None:
    """As the simulator starts its first round at the first arrival: the replay submits the
    first job just after a boundary the polls named (a later one when that one is too near or
    past, stepped by whole rounds), or at once when no poll named one within two rounds."""
    log = FleetLog()
    now = time.time()
    log.round_ends = now + 0.5
    assert asyncio.run(first_arrival_at(log, 1.0)) == pytest.approx(now + 0.5 + 0.01)
    log.round_ends = now - 2.95  # past: the next boundary at least a tenth of a round away
    start = asyncio.run(first_arrival_at(log, 1.0))
    assert start == pytest.approx(now + 1.05 + 0.01, abs=0.02)
    before = time.time()
    assert asyncio.run(first_arrival_at(FleetLog(), 0.05)) >= before + 0.1


def test_a_short_final_stretch_starts_without_the_restore_under_the_simulators_rule() -> None:
    """The simulator charges a start its restart overhead unless the job finishes within its
    lease less the 5 s guard; the replay's agents do the same with a guard, and restore on
    every start without one."""
    fleet = RecordingFleet({})
    fleet.restart_s = 20.0
    short = job("j1", epochs=2, epoch_s=50.0)  # 100 s left
    assert fleet.restore_s(short, 120.0) == 20.0  # no guard: every start restores
    fleet.restore_guard_s = 5.0
    assert fleet.restore_s(short, 120.0) == 0.0  # 100 <= 120 - 5
    assert fleet.restore_s(short, 104.0) == 20.0  # 100 > 104 - 5
    assert fleet.restore_s(job("j2", epochs=3, epoch_s=50.0), 120.0) == 20.0  # 150 s left


@pytest.mark.parametrize(
    ("received_after_s", "trains_from_s"),
    [
        pytest.param(-9.0, 20.0, id="early-delivery-waits-for-the-boundary"),
        pytest.param(6.0, 20.0, id="late-delivery-overlaps-the-restore"),
        pytest.param(25.0, 20.0, id="later-than-the-restore-is-credited-from-it"),
    ],
)
def test_under_the_simulators_rule_the_restore_counts_from_the_leases_began_at(
    received_after_s: float, trains_from_s: float
) -> None:
    """The simulator's restore starts at the round's boundary; the replay's poll brings a lease
    a few compressed seconds before or after it. Under the simulator's rule the attempt is
    delivered at the lease's ``began_at``; with the real rule, when the poll brings it."""
    fleet = RecordingFleet({})
    fleet.restart_s = 20.0
    long_job = job("j1", epochs=100, epoch_s=10.0)
    began = 4_000_000_000.0
    granted = {**lease("a1", "j1", "2096-10-02T07:08:40+00:00"), "began_at": datetime_of(began)}
    received = began + received_after_s
    assert fleet.training_from(long_job, granted, received) == received + 20.0  # the real rule
    fleet.restore_guard_s = 5.0
    assert fleet.training_from(long_job, granted, received) == pytest.approx(began + trains_from_s)
    unstamped = lease("a1", "j1", granted["ends_at"])  # a service that sends no began_at
    assert fleet.training_from(long_job, unstamped, received) == received + 20.0


def datetime_of(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def test_a_short_final_stretch_delivered_late_trains_from_its_boundary_as_in_the_simulator() -> (
    None
):
    """No restore for a job that finishes within its lease less the guard: the simulator trains
    it from the boundary, so a delivery 6 s late must not cost it its end of the lease."""
    fleet = RecordingFleet({})
    fleet.restart_s, fleet.restore_guard_s = 20.0, 5.0
    began = 4_000_000_000.0
    granted = {**lease("a1", "j1", datetime_of(began + 120.0)), "began_at": datetime_of(began)}
    short = job("j1", epochs=2, epoch_s=55.0)  # 110 s left: within 120 - 5
    assert fleet.training_from(short, granted, began + 6.0) == pytest.approx(began)


def test_under_the_simulators_rule_a_revoke_before_the_leases_end_trains_to_its_end() -> None:
    """The driver begins a round early (its boundary lead), so a boundary's revoke reaches a
    node before the lease it ends is over; the simulator's round runs to the boundary. Under
    the simulator's rule the attempt trains on to its lease's end and owes ``checkpointed``
    then; with the real rule it stops at once."""
    jobs, fleet, node, attempt = started_with_slack(0.0)
    fleet.restore_guard_s = 5.0
    now = time.time()
    attempt.started_t, attempt.ends_t = now - 4.0, now + 0.3
    asyncio.run(fleet._changeover(node, answer([])))  # the revoke, 0.3 s early
    assert node.attempts["a1"].revoked and node.outbox == []
    assert fleet.next_training_step(node) <= 0.31
    time.sleep(0.35)
    asyncio.run(fleet._train(node))
    assert "a1" not in node.attempts
    assert node.outbox == [{"attempt_id": "a1", "state": "checkpointed"}]
    assert jobs["j1"].partial_s == pytest.approx(4.3)  # to the lease's end, not past it
    fleet.restore_guard_s = None  # the real rule: the revoke stops it where it is
    jobs["j2"] = job("j2", epochs=100, epoch_s=10.0)
    fleet._reconcile(node, answer([lease("a2", "j2")], a2="tok-2"))
    node.attempts["a2"].started_t, node.attempts["a2"].ends_t = now - 4.0, now + 60.0
    asyncio.run(fleet._changeover(node, answer([])))
    assert "a2" not in node.attempts
    assert jobs["j2"].partial_s < 4.0 + (time.time() - now) < 60.0


def test_a_nap_ends_at_its_time_when_the_bell_rings_or_when_the_fleet_stops() -> None:
    """The fleet's waits (a trainer's step, a reporter's, a retry's pause) end on whichever
    comes first; a stop ends every one at once, however long it was to last."""
    fleet, node = RecordingFleet({}), Node("agent-token")

    async def scenario() -> list[float]:
        stop = asyncio.Event()
        began = time.perf_counter()
        await fleet._nap(stop, 0.05)
        timed = time.perf_counter() - began
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, node.wake.set)
        began = time.perf_counter()
        await fleet._nap(stop, 30.0, node.wake)
        rung = time.perf_counter() - began
        await fleet._nap(stop, 30.0, node.wake)  # rung already: no wait at all
        naps = [asyncio.create_task(fleet._nap(stop, 30.0)) for _ in range(3)]
        loop.call_later(0.05, stop.set)
        began = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*naps), 5.0)
        return [timed, rung, time.perf_counter() - began]

    timed, rung, stopped = asyncio.run(scenario())
    assert 0.04 <= timed < 1.0
    assert 0.04 <= rung < 1.0
    assert 0.04 <= stopped < 1.0


def test_only_the_jobs_with_something_due_are_published_each_step() -> None:
    """A step publishes a job only when its report interval has passed and it has a new epoch
    or a batch-size change to post; the others start nothing (no task, no event)."""
    fresh, due, idle = job("j1"), job("j2"), job("j3")
    for each in (fresh, due, idle):
        each.token, each.epochs_done = "token", 1
    fleet = RecordingFleet({j.id: j for j in (fresh, due, idle)}, answer={})
    fleet.report_s = 30.0
    fresh.posted_at = time.time()  # posted a moment ago: not due
    idle.posted_epoch = 1  # nothing new since its last post
    asyncio.run(fleet._publish_all([fresh, due, idle], Node("agent-token")))
    assert [(body or {}).get("epoch") for _, _, body in fleet.calls] == [1]
    assert [path for _, path, _ in fleet.calls] == ["/v1/jobs/j2/events"]
    assert fleet._due(fresh, force=True) and not fleet._due(idle, force=True)


def test_a_long_poll_answer_is_counted_by_what_it_told_the_node() -> None:
    node = Node("agent-token")
    node.seen_round = 3
    node.attempts["a1"] = Attempt("a1", "j1", T1, 0.0)
    same = answer([lease("a1", "j1")])  # round 3, a1 still leased
    assert answered_for(same, node, busy=False) == "held"
    assert answered_for(same, node, busy=True) == "busy"
    assert answered_for({**same, "current_round": 4}, node, busy=False) == "round"
    assert answered_for(answer([lease("a1", "j1"), lease("a2", "j2")]), node, False) == "leases"
    assert answered_for(answer([lease("a1", "j1")], stop=["a1"]), node, False) == "leases"
    assert answered_for(answer([]), node, busy=False) == "leases"


class ScriptedFleet(RecordingFleet):
    """A long-polling fleet answered from ``answers`` in turn; once they run out, it stops."""

    def __init__(self, jobs: dict[str, TrainingJob], answers: list[Any]) -> None:
        super().__init__(jobs)
        self.wait_s = 10.0
        self.boundary_retry_s = 0.01
        self.answers = answers
        self.stop = asyncio.Event()

    async def _call(
        self, kind: str, method: str, path: str, token: str, body: Any = None, **_: Any
    ) -> Any:
        self.calls.append((kind, path, body))
        if not self.answers:
            self.stop.set()
            return None
        return self.answers.pop(0)


def test_a_long_polling_node_acknowledges_what_it_started_in_its_next_long_poll() -> None:
    """No poll of its own for an acknowledgement when no report is owed: the next long poll
    lists the new attempt as running (the server acknowledges it before holding the poll)."""
    started = answer([lease("a1", "j1", T2)], a1="token-a1")
    running = answer([lease("a1", "j1", T2)])
    fleet = ScriptedFleet({"j1": job("j1", epochs=100)}, [started, running])
    asyncio.run(fleet._long_polls(Node("agent-token"), "n1", fleet.stop))
    sent = [
        (kind, (body or {})["running"], (body or {}).get("wait_s")) for kind, _, body in fleet.calls
    ]
    assert sent[:2] == [("poll", [], 10.0), ("poll", ["a1"], 10.0)]
    assert all(kind == "poll" for kind, _, _ in sent), sent


def _send_times(fleet: ScriptedFleet) -> list[float]:
    """The monotonic time of each of ``fleet``'s requests from now on, in order, as they are
    sent (the list fills as the fleet runs)."""
    sent_at: list[float] = []
    record = fleet._call

    async def timed(*args: Any, **kwargs: Any) -> Any:
        sent_at.append(time.monotonic())
        return await record(*args, **kwargs)

    fleet._call = timed  # type: ignore[method-assign]
    return sent_at


def test_a_long_poll_answered_at_once_because_its_acknowledgement_waits_is_sent_again_later() -> (
    None
):
    """The server answers a long poll whose acknowledgement must wait (a busy job) at once: the
    node sends it again after ``BUSY_RETRY_S``, not at the pace of a round's boundary polls."""
    started = answer([lease("a1", "j1", T2)], a1="token-a1")
    waiting = answer([{**lease("a1", "j1", T2), "state": "ISSUED"}])
    running = answer([{**lease("a1", "j1", T2), "state": "RUNNING"}])
    fleet = ScriptedFleet({"j1": job("j1", epochs=100)}, [started, waiting, running])
    sent_at = _send_times(fleet)
    asyncio.run(fleet._long_polls(Node("agent-token"), "n1", fleet.stop))
    assert len(sent_at) >= 3
    assert sent_at[1] - sent_at[0] < BUSY_RETRY_S / 2, "the acknowledgement rides at once"
    assert sent_at[2] - sent_at[1] >= BUSY_RETRY_S * 0.9, "then again after the busy retry"


def test_reports_a_long_poll_answered_503_are_sent_again_later_not_at_once() -> None:
    """The next long poll carries the reports on what an answer stopped, with what it started,
    at once; when the server answers those reports 503 (the driver writing a boundary) they
    go again after ``BUSY_RETRY_S``, not in a loop as fast as the server answers."""
    jobs = {"j1": job("j1", epochs=100), "j2": job("j2", epochs=100)}
    first = answer([lease("a1", "j1", T2)], a1="token-a1")
    moved = answer([lease("a2", "j2", T2)], a2="token-a2")  # a1 stops, a2 starts
    busy = {
        **answer([{**lease("a2", "j2", T2), "state": "RUNNING"}]),
        "reports": [{"attempt_id": "a1", "status": 503, "stop": False}],
    }
    done = {
        **answer([{**lease("a2", "j2", T2), "state": "RUNNING"}]),
        "reports": [{"attempt_id": "a1", "status": 200, "stop": True}],
    }
    fleet = ScriptedFleet(jobs, [first, moved, busy, done])
    sent_at = _send_times(fleet)
    node = Node("agent-token")
    asyncio.run(fleet._long_polls(node, "n1", fleet.stop))
    bodies = [body or {} for _, _, body in fleet.calls]
    checkpointed = [{"attempt_id": "a1", "state": "checkpointed"}]
    assert [(b["running"], b["reports"]) for b in bodies[1:4]] == [
        (["a1"], []),
        (["a2"], checkpointed),
        (["a2"], checkpointed),
    ]
    assert all(kind == "poll" for kind, _, _ in fleet.calls[:4])
    assert sent_at[2] - sent_at[1] < BUSY_RETRY_S / 2, "the report rides in the next long poll"
    assert sent_at[3] - sent_at[2] >= BUSY_RETRY_S * 0.9, "then again after the busy retry"
    assert node.outbox == []


def test_a_node_the_server_turns_away_backs_off_as_the_real_agent_does() -> None:
    """Each failed long poll in a row waits longer (from half the poll interval, doubling,
    jittered), so the nodes an overloaded server shed do not all come back every second."""
    fleet = ScriptedFleet({"j1": job("j1")}, [None, None, None, answer([])])
    fleet.poll_s = 0.02
    sent_at = _send_times(fleet)
    asyncio.run(fleet._long_polls(Node("agent-token"), "n1", fleet.stop))
    gaps = [b - a for a, b in itertools.pairwise(sent_at)][:3]
    assert len(gaps) == 3
    assert gaps[0] >= 0.9 * fleet.poll_s / 4, "at least half of half the poll interval"
    assert gaps[2] >= 0.9 * fleet.poll_s, "the third failure in a row: at least a poll interval"
