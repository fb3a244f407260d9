"""A real Shockwave API for the SDK tests: the app on a fresh migrated SQLite file, reached
in-process (FastAPI's TestClient, an httpx client) or over a real socket (uvicorn)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from api.settings import Settings
from shockwave_sdk import CheckpointStore, EventOutbox, RetryPolicy, ShockwaveClient
from store import migrate
from store.principals import Role
from store.tokens import create_token

JOB: dict[str, Any] = {
    "name": "sdk-test",
    "gpus": 1,
    "epochs": 6,
    "samples_per_epoch": 4096,
    "initial_batch_size": 16,
    "mode": "gns",
    "batch_sizes": [16, 32, 64, 128],
}
FAST_RETRY = RetryPolicy(deadline_s=2.0, first_delay_s=0.01, max_delay_s=0.05)


@dataclass
class Api:
    """The app and an in-process client acting as admin (open mode)."""

    app: FastAPI
    client: TestClient

    def submit(self, **fields: Any) -> str:
        response = self.client.post("/v1/jobs", json={**JOB, **fields})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def job_token(self, job_id: str) -> str:
        with Session(self.app.state.engine) as session:
            return create_token(session, Role.JOB, job_id=job_id)

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def client_events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's progress and scaling events in the order the API stored them."""
        response = self.client.get(f"/v1/jobs/{job_id}/events", params={"page_size": 500})
        assert response.status_code == 200, response.text
        return [e for e in response.json()["items"] if e["kind"] in ("progress", "scaling")]

    def sdk(self, job_id: str, directory: Path, **options: Any) -> ShockwaveClient:
        """An SDK client for the job, over the in-process transport, with its job token."""
        return ShockwaveClient(
            api_url="http://testserver",
            job_id=job_id,
            token=self.job_token(job_id),
            outbox=EventOutbox(CheckpointStore(directory), job_id),
            http=self.client,
            retry=options.pop("retry", FAST_RETRY),
            **options,
        )


@contextmanager
def running_api(directory: Path) -> Iterator[Api]:
    url = f"sqlite:///{directory / 'api.db'}"
    migrate.upgrade(url)
    app = create_app(Settings(database_url=url, open_mode=True))
    with TestClient(app) as client:
        yield Api(app, client)
    app.state.engine.dispose()


def job_environment(
    api_url: str, job_id: str, token: str, checkpoint_dir: Path, batch_size: int
) -> dict[str, str]:
    """The environment an agent gives a job's process (``batch_size``: the job's current one),
    over this process's own (without any SHOCKWAVE_* variable of the test run's)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKWAVE_")}
    return {
        **base,
        "SHOCKWAVE_JOB_ID": job_id,
        "SHOCKWAVE_API_URL": api_url,
        "SHOCKWAVE_TOKEN": token,
        "SHOCKWAVE_CHECKPOINT_DIR": str(checkpoint_dir),
        "SHOCKWAVE_BATCH_SIZE": str(batch_size),
    }
