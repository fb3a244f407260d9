"""An elastic example job resumed on a different GPU count (issue 21, docs/elastic.md).

``examples/numpy_linear.py`` runs as a real process with the environment an agent gives an
attempt on one GPU (``SHOCKWAVE_WORLD_SIZE=1``, ``CUDA_VISIBLE_DEVICES=0``); it is stopped
mid-training with SIGTERM (it checkpoints and exits 0, as on a revoked lease), then started
again as the next attempt on two GPUs. The second attempt learns from the SDK that its world
size went from 1 to 2, resumes from the first attempt's checkpoint (its loss curve continues
instead of restarting) and trains to the last epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.deployment import ROOT

EXAMPLE = ROOT / "examples" / "numpy_linear.py"
EPOCHS = 6


def attempt(checkpoint: Path, world: int, attempt_id: str) -> subprocess.Popen[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SHOCKWAVE_") and key != "CUDA_VISIBLE_DEVICES"
    }
    env.update(
        {
            "SHOCKWAVE_CHECKPOINT_DIR": str(checkpoint),
            "SHOCKWAVE_ATTEMPT_ID": attempt_id,
            "SHOCKWAVE_WORLD_SIZE": str(world),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(world)),
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = [
        sys.executable,
        str(EXAMPLE),
        "--epochs",
        str(EPOCHS),
        "--samples",
        "1024",
        "--mode",
        "static",
        "--min-step-seconds",
        "0.003",
    ]
    return subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def records(checkpoint: Path) -> list[dict[str, Any]]:
    path = checkpoint / "loss.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_elastic_job_resumes_on_another_gpu_count(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    first = attempt(checkpoint, 1, "a1")
    deadline = time.monotonic() + 60
    while not any(r["record"] == "epoch" for r in records(checkpoint)):
        assert first.poll() is None, first.communicate()[0]
        assert time.monotonic() < deadline, "the first attempt never finished an epoch"
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 0, out
    stopped = [r for r in records(checkpoint) if r["record"] == "stopped"]
    assert len(stopped) == 1 and 1 <= stopped[0]["epoch"] < EPOCHS, out

    second = attempt(checkpoint, 2, "a2")
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out
    assert "world size 1 -> 2" in out

    log = records(checkpoint)
    starts = [r for r in log if r["record"] == "start"]
    assert [(s["attempt"], s["world_size"], s["previous_world_size"]) for s in starts] == [
        ("a1", 1, None),
        ("a2", 2, 1),
    ]
    # The second attempt resumed where the first stopped, with the loss it had reached.
    assert starts[1]["epoch"] == stopped[0]["epoch"]
    assert starts[1]["offset"] == stopped[0]["offset"]
    assert abs(starts[1]["loss"] - stopped[0]["loss"]) < 1e-9
    assert starts[1]["loss"] < starts[0]["loss"]
    epochs = [r["epoch"] for r in log if r["record"] == "epoch"]
    assert epochs == list(range(1, EPOCHS + 1))
    assert log[-1]["record"] == "finished" and log[-1]["attempt"] == "a2"
