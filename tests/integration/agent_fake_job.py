"""A stand-in training program for the agent's tests: ``python agent_fake_job.py OUT_DIR``.

It resumes from ``$SHOCKWAVE_CHECKPOINT_DIR/state.json`` (the step it had reached), records
its start in ``OUT_DIR/<job id>.jsonl`` (pid, whether it resumed, its environment), counts
steps every 50 ms, and on SIGTERM writes its checkpoint, records the stop and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")


def record(out: Path, entry: dict[str, object]) -> None:
    with out.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")


def main(out_dir: Path) -> int:
    checkpoint = Path(os.environ["SHOCKWAVE_CHECKPOINT_DIR"]) / "state.json"
    resumed = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else None
    out = out_dir / f"{os.environ['SHOCKWAVE_JOB_ID']}.jsonl"
    env = {k: v for k, v in os.environ.items() if k.startswith("SHOCKWAVE_") or k in ENV_KEYS}
    record(out, {"event": "start", "pid": os.getpid(), "resumed_from": resumed, "env": env})
    stopping = False

    def on_sigterm(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_sigterm)
    step = resumed or 0
    while not stopping:
        time.sleep(0.05)
        step += 1
    checkpoint.write_text(json.dumps({"step": step}))
    record(out, {"event": "sigterm", "pid": os.getpid(), "step": step})
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
