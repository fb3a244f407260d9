#!/usr/bin/env bash
# Run the PyTorch example under a real node agent on this machine's NVIDIA GPU(s): as a process,
# then in a container of the project's image with the GPUs passed through, where Docker and the
# NVIDIA container toolkit exist.
#
# Starts `shockwave up` (the embedded service on a SQLite file in a temporary directory), then:
# 1. process: `shockwave agent --gpus auto --runtime process`; examples/torch_mlp.py as a one-GPU
#    job; it must succeed on cuda.
# 2. container (only where `docker info` answers and the NVIDIA container toolkit is installed:
#    nvidia-ctk or nvidia-container-runtime, or an nvidia runtime in `docker info`): the image
#    with torch (GPU_CHECK_IMAGE, built by scripts/images.sh with SHOCKWAVE_IMAGE_EXTRAS=torch
#    when missing), `docker run --gpus all` of nvidia-smi and of torch's view of the GPUs, then
#    `shockwave agent --runtime docker`: the same job in a container of that image on the
#    leased GPU (`--gpus device=N`); it must succeed on cuda.
# Each phase prints nvidia-smi while the job runs and the device torch trained on (the `device`
# of each attempt's start record in the job's loss.jsonl).
#
# Exit 0: every phase that could run succeeded on cuda (a skipped container phase says why).
# 1: a job did not (the logs are printed). 2: something it needs is missing: nvidia-smi and a
# GPU, the project's virtualenv, or torch with CUDA in it. Nothing is installed by the process
# phase: use the project's venv (`make venv`, then `.venv/bin/pip install torch` with a CUDA
# build for this driver); the container phase builds its image (PyPI must be reachable then).
#
# Settings (environment): PYTHON (default .venv/bin/python; `shockwave` is taken from its
# directory), GPU_CHECK_TIMEOUT_S (600 per phase), GPU_CHECK_EPOCHS (4), GPU_CHECK_IMAGE
# (shockwave-gpu:latest), GPU_CHECK_CONTAINER (auto; 0: skip the container phase; 1: require
# it, exit 2 without Docker and the toolkit), GPU_CHECK_KEEP=1 keeps the temporary directory
# (database, agent work directories, logs, checkpoints).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
SW=$(dirname "$PY")/shockwave
TIMEOUT_S=${GPU_CHECK_TIMEOUT_S:-600}
EPOCHS=${GPU_CHECK_EPOCHS:-4}
IMAGE=${GPU_CHECK_IMAGE:-shockwave-gpu:latest}
CONTAINER=${GPU_CHECK_CONTAINER:-auto}
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
container_toolkit() {
    command -v nvidia-ctk >/dev/null 2>&1 || command -v nvidia-container-runtime >/dev/null 2>&1 ||
        docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia
}
CONTAINER_SKIP=
if [ "$CONTAINER" = 0 ]; then
    CONTAINER_SKIP="GPU_CHECK_CONTAINER=0"
elif ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
    CONTAINER_SKIP="no Docker engine answers \`docker info\`"
elif ! container_toolkit; then
    CONTAINER_SKIP="the NVIDIA container toolkit is not installed (nvidia-ctk, nvidia-container-runtime)"
fi
if [ "$CONTAINER" = 1 ] && [ -n "$CONTAINER_SKIP" ]; then
    missing+=("the container phase (GPU_CHECK_CONTAINER=1): $CONTAINER_SKIP")
fi
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

# --- the service ---------------------------------------------------------------------------------
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

# run_phase NAME RUNTIME IMAGE COMMAND_JSON: an agent (node gpu-check-NAME, work directory
# $WORK/agent-NAME) with RUNTIME, and the job; the agent is stopped at the end. Its exit status.
run_phase() {
    local name=$1 runtime=$2 image=$3 command=$4 status
    "$SW" agent --api "$API" --gpus auto --runtime "$runtime" --node-name "gpu-check-$name" \
        --work-dir "$WORK/agent-$name" --poll-interval 0.5 >"$WORK/agent-$name.log" 2>&1 &
    AGENT_PID=$!
    "$PY" - "$API" "gpu-check-$name" "$image" "$command" "$EPOCHS" "$TIMEOUT_S" "$WORK" \
        "$WORK/agent-$name" "$UP_PID" "$AGENT_PID" <<'EOF'
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

api, node_id, image, command, epochs, timeout_s, work, agent_work, up_pid, agent_pid = sys.argv[1:]
deadline = time.monotonic() + float(timeout_s)
work_dir = Path(work)
agent_dir = Path(agent_work)


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
    for log in (work_dir / "up.log", agent_dir.with_suffix(".log")):
        print(f"--- {log.name}\n{tail(log)}", file=sys.stderr)
    for log in sorted(agent_dir.glob("attempts/*/output.log")):
        print(f"--- {log}\n{tail(log)}", file=sys.stderr)
    sys.exit(1)


client = httpx.Client(base_url=api, timeout=10.0)
while True:  # the API answers and the agent's node is READY
    try:
        nodes = client.get("/v1/nodes").json().get("items", [])
        if any(n.get("id") == node_id and n.get("state") == "READY" for n in nodes):
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
node = next(n for n in client.get("/v1/nodes").json()["items"] if n["id"] == node_id)
print(f"== node {node_id} registered: {node}")

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
        "command": json.loads(command),
        "image": image or None,
    },
)
if job.status_code != 201:
    fail(f"the job was refused: {job.status_code} {job.text}")
job_id = job.json()["id"]
where = f"in a container of {image}" if image else "as a process"
print(f"== job {job_id} submitted (examples/torch_mlp.py {where}, {epochs} epochs, Accordion 32/256)")

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

loss_log = agent_dir / "checkpoints" / job_id / "loss.jsonl"
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
print(f"gpu_check: OK: the job SUCCEEDED on cuda {where}")
EOF
    status=$?
    stop "$AGENT_PID" 20
    AGENT_PID=
    return $status
}

echo "== phase 1: the job as a process"
run_phase process process "" "$("$PY" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$PY" "$EXAMPLE")"
status=$?

if [ "$status" = 0 ] && [ -z "$CONTAINER_SKIP" ]; then
    echo "== phase 2: the job in a container of $IMAGE"
    if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
        say "building $IMAGE (the project image with torch; a CUDA build of torch is large)"
        SHOCKWAVE_IMAGE=$IMAGE SHOCKWAVE_IMAGE_EXTRAS=torch "$ROOT/scripts/images.sh" || status=2
    fi
    if [ "$status" = 0 ]; then
        echo "== docker run --gpus all: nvidia-smi and torch in the container"
        docker run --rm --gpus all "$IMAGE" nvidia-smi &&
            docker run --rm --gpus all "$IMAGE" python -c 'import sys, torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, devices {torch.cuda.device_count()}")
sys.exit(0 if torch.cuda.is_available() else 1)' || {
            say "FAILED: the container does not see the GPUs (docker run --gpus all)"
            status=1
        }
    fi
    if [ "$status" = 0 ]; then
        run_phase container docker "$IMAGE" '["python", "examples/torch_mlp.py"]'
        status=$?
    fi
elif [ -n "$CONTAINER_SKIP" ]; then
    say "container phase skipped: $CONTAINER_SKIP"
fi

echo "== nvidia-smi (after)"
nvidia-smi
exit $status
