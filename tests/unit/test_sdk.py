"""The training SDK against a real API (the app on a fresh SQLite file): events and their seq,
resumption, retries and duplicates, checkpoints and the SIGTERM flag."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shockwave_sdk import (
    CheckpointStore,
    EventOutbox,
    EventRejected,
    GracefulStop,
    JobEnvironment,
    JobFinished,
    RetryPolicy,
    ShockwaveClient,
    atomic_write,
    remembered_job,
)
from shockwave_sdk.outbox import OUTBOX_NAME
from tests.unit.sdk_api import FAST_RETRY, Api, running_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with running_api(tmp_path) as api:
        yield api


class FakeClock:
    """A monotonic clock that only the fake sleep moves; records each sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_events_arrive_in_order_with_increasing_seq(api: Api, tmp_path: Path) -> None:
    job = api.submit()
    with api.sdk(job, tmp_path / "ckpt") as sdk:
        first = sdk.report_epoch_end(1, 4096, 2.5, 16)
        scaled = sdk.request_batch_size(32, 1)
        second = sdk.report_epoch_end(2, 4096, 1.5, 32)
    assert [d.seq for d in (first, scaled, second)] == [1, 2, 3]
    assert all(d.delivered and d.status == 201 for d in (first, scaled, second))
    events = api.client_events(job)
    assert [(e["seq"], e["kind"]) for e in events] == [
        (1, "progress"),
        (2, "scaling"),
        (3, "progress"),
    ]
    assert events[1]["payload"] == {"batch_size": 32, "epoch": 1}
    state = api.job(job)
    assert (state["epochs_done"], state["batch_size"], state["attained_s"]) == (2, 32, 4.0)
    assert state["measured_epoch_seconds"] == {"16": 2.5, "32": 1.5}


def test_a_resumed_attempt_continues_the_sequence(api: Api, tmp_path: Path) -> None:
    job = api.submit()
    directory = tmp_path / "ckpt"
    with api.sdk(job, directory) as first_attempt:
        first_attempt.report_epoch_end(1, 4096, 2.0, 16)
        first_attempt.report_epoch_end(2, 4096, 2.0, 16)
    with api.sdk(job, directory) as second_attempt:  # a new process with a new token
        delivery = second_attempt.report_epoch_end(3, 4096, 2.0, 16)
    assert (delivery.seq, delivery.status) == (3, 201)
    assert [e["seq"] for e in api.client_events(job)] == [1, 2, 3]
    assert api.job(job)["epochs_done"] == 3


def test_a_duplicate_post_is_harmless(api: Api, tmp_path: Path) -> None:
    job = api.submit()
    directory = tmp_path / "ckpt"
    store = CheckpointStore(directory)
    with api.sdk(job, directory) as sdk:
        sdk.report_epoch_end(1, 4096, 2.0, 16)
        acknowledged = store.load_json(OUTBOX_NAME)
    # The response was lost: the outbox still lists the event as pending.
    event = {"kind": "progress", "epoch": 1, "samples": 4096, "seconds": 2.0, "batch_size": 16}
    store.save_json(OUTBOX_NAME, {**acknowledged, "pending": [{**event, "seq": 1}]})
    with api.sdk(job, directory) as retry:
        assert retry.flush() == 0
        again = retry.report_epoch_end(2, 4096, 2.0, 16)
    assert again.seq == 2
    assert [e["seq"] for e in api.client_events(job)] == [1, 2]
    assert api.job(job)["attained_s"] == 4.0
    token = api.job_token(job)
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "k-1"}
    replies = [
        api.client.post(f"/v1/jobs/{job}/events", json={**event, "seq": 1}, headers=headers)
        for _ in range(2)
    ]
    assert [r.status_code for r in replies] == [200, 200]
    assert replies[0].json() == replies[1].json()


def test_an_outage_keeps_events_pending_until_they_get_through(api: Api, tmp_path: Path) -> None:
    job = api.submit()
    directory = tmp_path / "ckpt"
    clock = FakeClock()
    down = ShockwaveClient(
        api_url=f"http://127.0.0.1:{free_port()}",  # nothing listens: connection refused
        job_id=job,
        token=api.job_token(job),
        outbox=EventOutbox(CheckpointStore(directory), job),
        retry=RetryPolicy(deadline_s=0.5, first_delay_s=0.05, max_delay_s=0.1),
        sleep=clock.sleep,
        clock=clock,
        rng=random.Random(7),
    )
    with down:
        lost = [down.report_epoch_end(1, 4096, 2.0, 16)]
        retries = list(clock.slept)
        lost.append(down.request_batch_size(32, 1))
    assert [(d.seq, d.delivered) for d in lost] == [(1, False), (2, False)]
    assert len(retries) >= 4 and all(0.025 <= s <= 0.1 for s in retries)
    assert clock.now <= 0.5  # the delivery stopped at its deadline
    assert clock.slept == retries  # the API is known to be away: one try, no more waiting
    assert api.client_events(job) == []
    with api.sdk(job, directory) as back:
        delivery = back.report_epoch_end(2, 4096, 1.0, 32)
    assert (delivery.seq, delivery.delivered) == (3, True)
    assert [(e["seq"], e["kind"]) for e in api.client_events(job)] == [
        (1, "progress"),
        (2, "scaling"),
        (3, "progress"),
    ]
    assert CheckpointStore(directory).load_json(OUTBOX_NAME)["pending"] == []


def test_asked_to_stop_it_gives_up_without_waiting(api: Api, tmp_path: Path) -> None:
    slept: list[float] = []
    client = ShockwaveClient(
        api_url=f"http://127.0.0.1:{free_port()}",
        job_id="j",
        token=None,
        outbox=EventOutbox(CheckpointStore(tmp_path), "j"),
        should_give_up=lambda: True,
        sleep=slept.append,
    )
    with client:
        assert client.report_epoch_end(1, 10, 1.0, 16).delivered is False
    assert slept == []


def test_a_lost_outbox_takes_the_next_seq_after_the_servers(api: Api, tmp_path: Path) -> None:
    job = api.submit()
    with api.sdk(job, tmp_path / "first") as sdk:
        sdk.report_epoch_end(1, 4096, 2.0, 16)
        sdk.report_epoch_end(2, 4096, 2.0, 16)
    with api.sdk(job, tmp_path / "empty") as fresh:  # no outbox: it starts again from seq 1
        delivery = fresh.report_epoch_end(3, 4096, 2.0, 16)
        later = fresh.report_epoch_end(4, 4096, 2.0, 16)
    assert (delivery.seq, delivery.status, later.seq) == (3, 201, 4)
    assert [e["payload"]["epoch"] for e in api.client_events(job)] == [1, 2, 3, 4]


def test_a_finished_job_raises_job_finished(api: Api, tmp_path: Path) -> None:
    job = api.submit()
    assert api.client.post(f"/v1/jobs/{job}/cancel").status_code == 200
    with api.sdk(job, tmp_path) as sdk, pytest.raises(JobFinished) as raised:
        sdk.report_epoch_end(1, 4096, 2.0, 16)
    assert raised.value.status == 409
    assert sdk.outbox.pending() == []


def test_an_invalid_event_is_rejected_and_dropped(api: Api, tmp_path: Path) -> None:
    job = api.submit(epochs=2)
    with api.sdk(job, tmp_path) as sdk:
        with pytest.raises(EventRejected) as raised:
            sdk.report_epoch_end(3, 4096, 2.0, 16)
        assert raised.value.status == 422
        assert "beyond the job's 2 epochs" in str(raised.value)
        assert sdk.outbox.pending() == []
        assert sdk.report_epoch_end(2, 4096, 2.0, 16).seq == 2


def test_the_job_reads_its_own_record(api: Api, tmp_path: Path) -> None:
    job = api.submit(batch_sizes=[16, 64])
    with api.sdk(job, tmp_path) as sdk:
        record = sdk.job()
    assert (record.id, record.epochs, record.samples_per_epoch) == (job, 6, 4096)
    assert (record.mode, record.batch_sizes, record.batch_size) == ("gns", (16, 64), 16)


def test_an_attempt_started_in_an_outage_uses_the_remembered_record(
    api: Api, tmp_path: Path
) -> None:
    job = api.submit(epochs=3)
    store = CheckpointStore(tmp_path)
    with api.sdk(job, tmp_path) as sdk:
        online = remembered_job(sdk, store)
    clock = FakeClock()
    offline_client = ShockwaveClient(
        api_url=f"http://127.0.0.1:{free_port()}",
        job_id=job,
        token=None,
        outbox=EventOutbox(store, job),
        retry=FAST_RETRY,
        sleep=clock.sleep,
        clock=clock,
    )
    with offline_client:
        offline = remembered_job(offline_client, store)
        assert remembered_job(offline_client, CheckpointStore(tmp_path / "other")) is None
    assert online is not None and online.epochs == 3
    assert offline == online


@pytest.mark.parametrize(("retry", "ceiling"), [(0, 0.2), (1, 0.4), (2, 0.8), (5, 5.0), (30, 5.0)])
def test_backoff_doubles_up_to_its_ceiling_with_jitter(retry: int, ceiling: float) -> None:
    policy = RetryPolicy(first_delay_s=0.2, max_delay_s=5.0)
    delays = [policy.delay(retry, random.Random(seed)) for seed in range(50)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert max(delays) - min(delays) > 0


def test_environment_from_an_agent(tmp_path: Path) -> None:
    env = JobEnvironment.from_environ(
        {
            "SHOCKWAVE_JOB_ID": "j1",
            "SHOCKWAVE_API_URL": "http://127.0.0.1:8000/",
            "SHOCKWAVE_TOKEN": "swk_x",
            "SHOCKWAVE_CHECKPOINT_DIR": str(tmp_path),
            "SHOCKWAVE_BATCH_SIZE": "64",
            "SHOCKWAVE_ATTEMPT_ID": "a1",
            "CUDA_VISIBLE_DEVICES": "0,1",
        }
    )
    assert env.managed
    assert (env.api_url, env.batch_size, env.visible_devices) == (
        "http://127.0.0.1:8000",
        64,
        "0,1",
    )
    assert not JobEnvironment.from_environ({}).managed
    with pytest.raises(ValueError, match="SHOCKWAVE_BATCH_SIZE"):
        JobEnvironment.from_environ({"SHOCKWAVE_BATCH_SIZE": "big"})


# -- checkpoints -------------------------------------------------------------------------


def test_arrays_and_metadata_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    weights = np.arange(6, dtype=np.float64).reshape(2, 3)
    store.save_arrays("model.npz", {"w": weights}, {"epoch": 3, "scaler": {"trace": 1.5}})
    loaded = store.load_arrays("model.npz")
    assert loaded is not None
    np.testing.assert_array_equal(loaded.arrays["w"], weights)
    assert loaded.meta == {"epoch": 3, "scaler": {"trace": 1.5}}
    assert store.load_arrays("missing.npz") is None


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save_bytes("state", b"epoch 1")
    with pytest.raises(RuntimeError), atomic_write(store.path("state")) as handle:
        handle.write(b"epoch 2, half wri")
        raise RuntimeError("killed while writing")
    assert store.load_bytes("state") == b"epoch 1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_sigkill_during_a_write_leaves_the_old_checkpoint_whole(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save_bytes("state", b"epoch 1")
    writer = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from shockwave_sdk import atomic_write
        with atomic_write(Path(sys.argv[1])) as handle:
            handle.write(b"epoch 2" * 100000)
            handle.flush()
            print("writing", flush=True)
            time.sleep(60)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", writer, str(store.path("state"))], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"writing"
    process.kill()
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert store.load_bytes("state") == b"epoch 1"
    leftovers = [p for p in tmp_path.iterdir() if p.name != "state"]
    assert len(leftovers) == 1 and leftovers[0].stat().st_size >= 700000
    CheckpointStore(tmp_path)  # the next attempt's store clears the torn temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_sigterm_sets_the_flag_and_a_second_one_is_delivered() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    with GracefulStop(signals=(signal.SIGTERM,)) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.received_signal is signal.SIGTERM
        seconds = stop.seconds_since_request()
        assert seconds is not None and seconds >= 0
    assert signal.getsignal(signal.SIGTERM) == previous
    # The second SIGINT goes to the handler found at install. Python's own is set here: a
    # process started in the background by a non-interactive shell inherits SIGINT ignored
    # (how CI's runner may start pytest), and then the second signal is rightly ignored too.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with GracefulStop(signals=(signal.SIGINT,)) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.requested
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_a_training_loop_checkpoints_on_sigterm_and_exits_0(tmp_path: Path) -> None:
    loop = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from shockwave_sdk import CheckpointStore, GracefulStop
        store = CheckpointStore(Path(sys.argv[1]))
        with GracefulStop() as stop:
            step = 0
            while not stop.requested:
                step += 1
                if step == 1:
                    print("training", flush=True)
                time.sleep(0.001)
            store.save_json("state.json", {"step": step, "signal": stop.received_signal.name})
        sys.exit(0)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", loop, str(tmp_path)], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"training"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["signal"] == "SIGTERM" and state["step"] >= 1
