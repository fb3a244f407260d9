"""Attempt fencing in the SDK against a real API (the app on a fresh SQLite file): a process
whose attempt is fenced (its lease lost, or a newer attempt's claim on the outbox) stops at
once, leaves the job's progress alone and writes nothing more to the checkpoint directory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import Session

from shockwave_sdk import (
    FENCED_EXIT_CODE,
    AttemptFenced,
    CheckpointStore,
    EventOutbox,
    ShockwaveClient,
)
from shockwave_sdk.outbox import OUTBOX_NAME
from store.principals import Role
from store.tables import LeaseRow, NodeApprovalRow, NodeRow
from store.tokens import create_token
from tests.unit.sdk_api import FAST_RETRY, Api, running_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with running_api(tmp_path) as api:
        yield api


def lease(api: Api, job_id: str, attempt: str) -> str:
    """A live lease ``attempt`` of the job on node n1 and the attempt's job token (what the
    agent hands the process)."""
    moment = datetime.now(UTC)
    with Session(api.app.state.engine) as session:
        if session.get(NodeRow, "n1") is None:
            session.add(NodeRow(id="n1", hostname="n1", gpus=1, registered_at=moment))
            session.add(NodeApprovalRow(node_id="n1", gpus=1))
            session.flush()
        session.add(
            LeaseRow(
                id=attempt,
                job_id=job_id,
                node_id="n1",
                round_index=0,
                gpus=[0],
                state="RUNNING",
                issued_at=moment,
                ends_at=moment,
                updated_at=moment,
            )
        )
        session.commit()
        return create_token(session, Role.JOB, job_id=job_id, attempt_id=attempt)


def set_lease_state(api: Api, attempt: str, state: str) -> None:
    with Session(api.app.state.engine) as session:
        row = session.get(LeaseRow, attempt)
        assert row is not None
        row.state = state
        session.add(row)
        session.commit()


def attempt_client(
    api: Api, job_id: str, attempt: str, token: str, directory: Path, hook: list[AttemptFenced]
) -> ShockwaveClient:
    return ShockwaveClient(
        api_url="http://testserver",
        job_id=job_id,
        token=token,
        outbox=EventOutbox(CheckpointStore(directory), job_id, attempt=attempt),
        http=api.client,
        retry=FAST_RETRY,
        on_fenced=hook.append,
    )


def test_a_lost_attempt_stops_and_leaves_the_progress_and_the_outbox_alone(
    api: Api, tmp_path: Path
) -> None:
    job = api.submit()
    token = lease(api, job, "a-1")
    fenced: list[AttemptFenced] = []
    with attempt_client(api, job, "a-1", token, tmp_path, fenced) as sdk:
        assert sdk.report_epoch_end(1, 4096, 2.0, 16).status == 201
        set_lease_state(api, "a-1", "LOST")
        with pytest.raises(AttemptFenced) as raised:
            sdk.report_epoch_end(2, 4096, 2.0, 16)
        assert fenced == [raised.value], "the hook ran once, before the raise"
        assert raised.value.problem["attempt_id"] == "a-1"
        outbox = CheckpointStore(tmp_path).load_json(OUTBOX_NAME)
        assert outbox["pending"] == [], "the refused event is not left for a later attempt"
        before = (tmp_path / OUTBOX_NAME).read_bytes()

        with pytest.raises(AttemptFenced):
            sdk.request_batch_size(32, 2)
        with pytest.raises(AttemptFenced):
            sdk.flush()
        assert (tmp_path / OUTBOX_NAME).read_bytes() == before, "nothing more written"
        assert len(fenced) == 1
    assert [e["payload"]["epoch"] for e in api.client_events(job)] == [1]
    assert api.job(job)["epochs_done"] == 1


def test_a_newer_attempt_s_claim_on_the_outbox_fences_the_older_one(
    api: Api, tmp_path: Path
) -> None:
    """The older attempt's lease still looks live to the server (its node not yet declared
    lost): the newer attempt's claim on the shared outbox is what stops it."""
    job = api.submit()
    old_token, new_token = lease(api, job, "a-1"), lease(api, job, "a-2")
    fenced: list[AttemptFenced] = []
    with attempt_client(api, job, "a-1", old_token, tmp_path, fenced) as old:
        assert old.report_epoch_end(1, 4096, 2.0, 16).seq == 1
        with attempt_client(api, job, "a-2", new_token, tmp_path, []) as new:
            claimed = (tmp_path / OUTBOX_NAME).read_bytes()
            with pytest.raises(AttemptFenced):
                old.report_epoch_end(2, 4096, 2.0, 16)
            assert len(fenced) == 1
            assert (tmp_path / OUTBOX_NAME).read_bytes() == claimed
            assert new.report_epoch_end(2, 4096, 2.0, 16).seq == 2
    assert [(e["seq"], e["payload"]["epoch"]) for e in api.client_events(job)] == [(1, 1), (2, 2)]


def test_by_default_a_fenced_process_ends_at_once_without_its_cleanup(tmp_path: Path) -> None:
    """The default reaction ends the process with FENCED_EXIT_CODE: the checkpoint that the
    program's ``finally`` would write is never written."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from shockwave_sdk import CheckpointStore, EventOutbox, ShockwaveClient
        directory = Path({str(tmp_path)!r})
        store = CheckpointStore(directory)
        sdk = ShockwaveClient(
            api_url="http://127.0.0.1:9", job_id="j", token="t",
            outbox=EventOutbox(store, "j", attempt="a-1"),
        )
        EventOutbox(store, "j", attempt="a-2")  # a newer attempt takes over
        try:
            sdk.report_epoch_end(1, 10, 1.0, 16)
            store.save_json("after.json", {{"reported": True}})
        finally:
            store.save_json("checkpoint.json", {{"written": True}})
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == FENCED_EXIT_CODE, done.stderr
    assert "has taken over" in done.stderr
    assert not (tmp_path / "checkpoint.json").exists()
    assert not (tmp_path / "after.json").exists()
    assert CheckpointStore(tmp_path).load_json(OUTBOX_NAME)["attempt"] == "a-2"
