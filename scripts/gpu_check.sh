#!/usr/bin/env bash
# Run the PyTorch example under a real node agent on this machine's NVIDIA GPU(s).
#
# Starts `shockwave up` (the embedded service on a SQLite file in a temporary directory) and
# `shockwave agent --gpus auto --runtime process`, submits examples/torch_mlp.py as a one-GPU
# job, waits for it to succeed, and prints nvidia-smi (while the job runs and at the end) and
# the device torch trained on (the `device` of each attempt's start record in the job's
# loss.jsonl).
#
# Exit 0: the job SUCCEEDED and every attempt trained on cuda. 1: it did not (the logs are
# printed). 2: something it needs is missing: nvidia-smi and a GPU, the project's virtualenv,
# or torch with CUDA in it. Nothing is installed: use the project's venv (`make venv`, then
# `.venv/bin/pip install torch` with a CUDA build for this driver).
#
# Settings (environment): PYTHON (default .venv/bin/python; `shockwave` is taken from its
# directory), GPU_CHECK_TIMEOUT_S (600), GPU_CHECK_EPOCHS (4), GPU_CHECK_KEEP=1 keeps the
# temporary directory (database, agent work directory, logs, checkpoints).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
SW=$(dirname "$PY")/shockwave
TIMEOUT_S=${GPU_CHECK_TIMEOUT_S:-600}
EPOCHS=${GPU_CHECK_EPOCHS:-4}
EXAMPLE=$ROOT/examples/torch_mlp.py

say() { printf 'gpu_check: %s\n' "$*" >&2; }

# --- what is needed ---------------------------------------------------------------------------
missing=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
    missing+=("nvidia-smi is not on PATH: this check needs an NVIDIA GPU and its driver")
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    missing+=("nvidia-smi lists no GPU (nvidia-smi -L): $(nvidia-smi -L 2>&1 | head -1)")
fi
if [ ! -x "$PY" ]; then
    missing+=("no Python at $PY: run \`make venv\` (or set PYTHON)")
elif [ ! -x "$SW" ]; then
    missing+=("no shockwave command next to $PY: install the project (\`make venv\`)")
else
    if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        missing+=("torch is not installed in $PY: install a CUDA build, e.g. $PY -m pip install torch")
    elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        >/dev/null 2>&1; then
        missing+=("torch in $PY does not see a GPU: $("$PY" -c \
            'import torch; print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda.is_available() False")' 2>&1 | tail -1)")
    fi
fi
[ -f "$EXAMPLE" ] || missing+=("$EXAMPLE is missing")
if [ ${#missing[@]} -gt 0 ]; then
    say "cannot run; missing:"
    for item in "${missing[@]}"; do printf '  - %s\n' "$item" >&2; done
    exit 2
fi

# --- the machine --------------------------------------------------------------------------------
echo "== nvidia-smi (before)"
nvidia-smi
echo "== torch"
"$PY" -c 'import torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, "
      f"cuda available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")'

# --- the service and the agent ---------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shockwave-gpu-check-XXXXXX")
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
API=http://127.0.0.1:$PORT
UP_PID=
AGENT_PID=

stop() {  # SIGTERM, then SIGKILL after $2 seconds
    local pid=$1 grace=$2
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq $((grace * 5))); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
}
cleanup() {
    stop "$AGENT_PID" 20  # it checkpoints and stops its job first
    stop "$UP_PID" 35
    if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "work directory $WORK; API $API"
"$SW" up --port "$PORT" --db "$WORK/gpu_check.db" --round-seconds 10 --log-level warning \
    >"$WORK/up.log" 2>&1 &
UP_PID=$!
"$SW" agent --api "$API" --gpus auto --runtime process --node-name gpu-check \
    --work-dir "$WORK/agent" --poll-interval 0.5 >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!

# --- the job --------------------------------------------------------------------------------
"$PY" - "$API" "$PY" "$EXAMPLE" "$EPOCHS" "$TIMEOUT_S" "$WORK" "$UP_PID" "$AGENT_PID" <<'EOF'
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

api, python, example, epochs, timeout_s, work, up_pid, agent_pid = sys.argv[1:]
deadline = time.monotonic() + float(timeout_s)
work_dir = Path(work)


def alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except OSError:
        return False
    return True


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


def fail(message: str) -> None:
    print(f"gpu_check: FAILED: {message}", file=sys.stderr)
    for name in ("up.log", "agent.log"):
        print(f"--- {name}\n{tail(work_dir / name)}", file=sys.stderr)
    for log in sorted(work_dir.glob("agent/attempts/*/output.log")):
        print(f"--- {log}\n{tail(log)}", file=sys.stderr)
    sys.exit(1)


client = httpx.Client(base_url=api, timeout=10.0)
while True:  # the API answers and the agent's node is READY
    try:
        nodes = client.get("/v1/nodes").json().get("items", [])
        if any(n.get("id") == "gpu-check" and n.get("state") == "READY" for n in nodes):
            break
    except (httpx.HTTPError, ValueError):
        pass
    if not alive(up_pid):
        fail("shockwave up exited")
    if not alive(agent_pid):
        fail("shockwave agent exited")
    if time.monotonic() > deadline:
        fail("the service or the agent did not come up")
    time.sleep(0.5)
node = next(n for n in client.get("/v1/nodes").json()["items"] if n["id"] == "gpu-check")
print(f"== node gpu-check registered: {node}")

job = client.post(
    "/v1/jobs",
    json={
        "name": "torch-mlp-gpu-check",
        "gpus": 1,
        "epochs": int(epochs),
        "samples_per_epoch": 65536,
        "initial_batch_size": 32,
        "mode": "accordion",
        "batch_sizes": [32, 256],
        "model": "MLP",
        "command": [python, example],
    },
)
if job.status_code != 201:
    fail(f"the job was refused: {job.status_code} {job.text}")
job_id = job.json()["id"]
print(f"== job {job_id} submitted (examples/torch_mlp.py, {epochs} epochs, Accordion 32/256)")

shown = False
state = "PENDING"
while state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
    if time.monotonic() > deadline:
        fail(f"the job is still {state} after {timeout_s} s")
    if not alive(agent_pid):
        fail("shockwave agent exited")
    time.sleep(1.0)
    record = client.get(f"/v1/jobs/{job_id}").json()
    state = record["state"]
    if state == "RUNNING" and not shown and record["epochs_done"] >= 1:
        print("== nvidia-smi (while the job runs)", flush=True)
        subprocess.run(["nvidia-smi"], check=False)
        shown = True
print(f"== job {state}: {record['epochs_done']:g}/{record['epochs']} epochs, "
      f"batch size {record['batch_size']}")

loss_log = work_dir / "agent" / "checkpoints" / job_id / "loss.jsonl"
records = [json.loads(x) for x in loss_log.read_text().splitlines()] if loss_log.exists() else []
devices = [r.get("device") for r in records if r.get("record") == "start"]
for r in records:
    if r.get("record") == "epoch":
        print(f"   epoch {r['epoch']}: loss {r['loss']:.4f} at batch size {r['batch_size']}")
print(f"== torch trained on: {', '.join(map(str, devices)) or '(no start record)'}")
if state != "SUCCEEDED":
    fail(f"the job is {state}")
if not devices or not all(str(d).startswith("cuda") for d in devices):
    fail(f"torch did not train on the GPU (devices {devices})")
print("gpu_check: OK: the job SUCCEEDED on cuda")
EOF
status=$?
echo "== nvidia-smi (after)"
nvidia-smi
exit $status
