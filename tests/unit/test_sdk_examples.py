"""The example training programs as real processes, with the environment an agent gives them,
reporting to a real API over a socket: stopped with SIGTERM part-way, they checkpoint and exit
0; run again, they resume where they stopped (the loss curve and the epoch count continue, the
event seq too) and finish.

The PyTorch example runs only where torch imports (``TORCH_AVAILABLE``); where it does not,
its test is skipped with that reason and the example's own refusal (exit 2) is tested instead.
"""

from __future__ import annotations

import importlib.util
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.schemas import JobCreate
from tests.integration.live_server import serving
from tests.unit.sdk_api import JOB, Api, job_environment, running_api

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TORCH_AVAILABLE = importlib.util.find_spec("torch") is not None
WAIT_S = 60.0
INTO_NEXT_EPOCH_S = 0.3
"""How long after its first epoch's checkpoint a job is stopped: well inside its second epoch
(at least 0.5 s with the pace the tests set), so it resumes from the middle of an epoch."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Api, str]]:
    with running_api(tmp_path) as api, serving(api.app) as url:
        yield api, url


def records(log: Path) -> list[dict[str, Any]]:
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_for(log: Path, kind: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not any(r["record"] == kind for r in records(log)):
        assert process.poll() is None, f"the example exited ({process.returncode}) first"
        assert time.monotonic() < deadline, f"no {kind!r} record in {log} after {WAIT_S} s"
        time.sleep(0.02)


def wait_for_checkpoint(directory: Path, script: str, process: subprocess.Popen[bytes]) -> None:
    """Wait until ``script`` has saved its checkpoint (each example names it after itself):
    the last step of its end-of-epoch work (report over HTTP, batch-size request, save), which
    on a loaded machine can outlast ``INTO_NEXT_EPOCH_S`` after the ``epoch`` record; a stop
    before it would land at offset 0 of the next epoch."""
    prefix = f"{Path(script).stem}."
    deadline = time.monotonic() + WAIT_S
    while not any(p.name.startswith(prefix) for p in directory.iterdir()):
        assert process.poll() is None, f"the example exited ({process.returncode}) first"
        assert time.monotonic() < deadline, f"no checkpoint in {directory} after {WAIT_S} s"
        time.sleep(0.02)


def agent_environment(api: Api, url: str, job: str, checkpoint_dir: Path) -> dict[str, str]:
    """What an agent would set now: a fresh job token and the job's current batch size."""
    batch_size = int(api.job(job)["batch_size"])
    return job_environment(url, job, api.job_token(job), checkpoint_dir, batch_size)


def start(script: str, env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=WAIT_S)
    return process.returncode, output.decode()


def preempt_and_resume(
    api: Api, url: str, tmp_path: Path, script: str, job_fields: dict[str, Any], *args: str
) -> tuple[str, list[dict[str, Any]]]:
    """Run ``script`` for a new job, SIGTERM it in its second epoch, run it again to the end;
    the job's id and its loss log."""
    job = api.submit(**job_fields)
    checkpoint_dir = tmp_path / "checkpoints" / job
    log = checkpoint_dir / "loss.jsonl"
    env = agent_environment(api, url, job, checkpoint_dir)
    first = start(script, {**env, "SHOCKWAVE_ATTEMPT_ID": "attempt-1"}, tmp_path, *args)
    wait_for(log, "epoch", first)
    wait_for_checkpoint(checkpoint_dir, script, first)
    time.sleep(INTO_NEXT_EPOCH_S)
    first.send_signal(signal.SIGTERM)
    code, output = finish(first)
    assert code == 0, output
    assert "stop requested: checkpointed" in output
    assert any(p.name != "loss.jsonl" for p in checkpoint_dir.iterdir())
    env = agent_environment(api, url, job, checkpoint_dir)
    second = start(script, {**env, "SHOCKWAVE_ATTEMPT_ID": "attempt-2"}, tmp_path, *args)
    code, output = finish(second)
    assert code == 0, output
    return job, records(log)


def check_the_run_continued(
    api: Api, job: str, log: list[dict[str, Any]], epochs: int
) -> list[dict[str, Any]]:
    """Assertions common to both examples; returns the epoch records."""
    kinds = [(r["attempt"], r["record"]) for r in log]
    assert kinds[0] == ("attempt-1", "start")
    assert kinds[-1] == ("attempt-2", "finished")
    stopped = next(r for r in log if r["record"] == "stopped")
    resumed = next(r for r in log if r["record"] == "start" and r["attempt"] == "attempt-2")
    assert stopped["attempt"] == "attempt-1"
    # The second attempt starts where the first stopped, in the middle of its second epoch:
    # same epoch, offset and weights, and the batch size the service knows.
    assert (stopped["epoch"], resumed["epoch"]) == (1, 1)
    assert 0 < stopped["offset"] == resumed["offset"]
    assert resumed["loss"] == pytest.approx(stopped["loss"], rel=1e-6)
    assert resumed["loss"] < log[0]["loss"] - 0.05  # not a restart from scratch
    first_epoch = next(r for r in log if r["record"] == "epoch")
    assert resumed["batch_size"] == first_epoch["next_batch_size"]
    epochs_seen = [r for r in log if r["record"] == "epoch"]
    assert [r["epoch"] for r in epochs_seen] == list(range(1, epochs + 1))
    assert {r["attempt"] for r in epochs_seen} == {"attempt-1", "attempt-2"}
    state = api.job(job)
    assert state["epochs_done"] == epochs
    events = api.client_events(job)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    progress = [e["payload"] for e in events if e["kind"] == "progress"]
    assert [p["epoch"] for p in progress] == list(range(1, epochs + 1))
    assert [p["batch_size"] for p in progress] == [r["batch_size"] for r in epochs_seen]
    scalings = [e["payload"] for e in events if e["kind"] == "scaling"]
    changes = [
        {"epoch": r["epoch"], "batch_size": r["next_batch_size"]}
        for r in epochs_seen
        if r["next_batch_size"] != r["batch_size"]
    ]
    assert scalings == changes
    assert state["batch_size"] == epochs_seen[-1]["next_batch_size"]
    return epochs_seen


def test_numpy_example_is_preempted_resumes_and_scales_with_gns(
    served: tuple[Api, str], tmp_path: Path
) -> None:
    api, url = served
    job, log = preempt_and_resume(
        api, url, tmp_path, "numpy_linear.py", {}, "--min-step-seconds", "0.004"
    )
    epochs = check_the_run_continued(api, job, log, JOB["epochs"])
    sizes = [r["batch_size"] for r in epochs]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]  # GNS: up only, and it did scale
    assert log[0]["loss"] == pytest.approx(math.log(2))  # w = 0 at the very start
    # Resuming loses nothing: the same job run without a stop has the very same loss curve
    # and batch sizes (data order, weights and the GNS averages all come back exactly).
    reference = api.submit()
    checkpoint_dir = tmp_path / "reference"
    env = agent_environment(api, url, reference, checkpoint_dir)
    code, output = finish(start("numpy_linear.py", env, tmp_path))
    assert code == 0, output
    uninterrupted = [r for r in records(checkpoint_dir / "loss.jsonl") if r["record"] == "epoch"]
    assert [r["batch_size"] for r in uninterrupted] == sizes
    assert [r["loss"] for r in uninterrupted] == pytest.approx([r["loss"] for r in epochs])


def test_numpy_example_scales_with_accordion(served: tuple[Api, str], tmp_path: Path) -> None:
    api, url = served
    job = api.submit(mode="accordion", batch_sizes=[16, 128])
    checkpoint_dir = tmp_path / job
    env = agent_environment(api, url, job, checkpoint_dir)
    code, output = finish(start("numpy_linear.py", env, tmp_path))
    assert code == 0, output
    epochs = [r for r in records(checkpoint_dir / "loss.jsonl") if r["record"] == "epoch"]
    assert {r["batch_size"] for r in epochs} == {16, 128}
    assert epochs[0]["batch_size"] == 16 and epochs[0]["statistic"] is None
    for record in epochs[1:]:
        target = 16 if record["statistic"] >= 0.5 else 128
        assert record["next_batch_size"] == target or record["epoch"] == JOB["epochs"]
    assert api.job(job)["epochs_done"] == JOB["epochs"]


@pytest.mark.parametrize("name", ["numpy_linear", "numpy_linear_accordion", "torch_mlp"])
def test_job_files_are_valid_submissions(name: str) -> None:
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    job = JobCreate.model_validate(body)
    assert job.command[1] == f"examples/{name.removesuffix('_accordion')}.py"
    assert (ROOT / job.command[1]).is_file()


@pytest.mark.skipif(not TORCH_AVAILABLE, reason="torch is not installed: the PyTorch example")
def test_torch_example_is_preempted_and_resumes(served: tuple[Api, str], tmp_path: Path) -> None:
    api, url = served
    fields = {"mode": "accordion", "epochs": 4, "initial_batch_size": 32, "batch_sizes": [32, 256]}
    job, log = preempt_and_resume(
        api, url, tmp_path, "torch_mlp.py", fields, "--min-step-seconds", "0.004"
    )
    check_the_run_continued(api, job, log, 4)


@pytest.mark.skipif(TORCH_AVAILABLE, reason="torch is installed: the example runs instead")
def test_torch_example_without_torch_says_so(tmp_path: Path) -> None:
    code, output = finish(start("torch_mlp.py", {}, tmp_path, "--checkpoint-dir", str(tmp_path)))
    assert code == 2
    assert "PyTorch is not installed" in output
