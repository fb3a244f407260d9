#!/usr/bin/env bash
# scripts/gpu_check.sh on a lent GPU machine whose image has torch but no network and no
# project install: the wheels scripts/gpu_wheels.sh downloaded here (carried as .whl/) go into
# /tmp/site, the source tree goes on PYTHONPATH, and two one-line wrappers in /tmp/bin stand for
# the venv (`python`, and `shockwave` next to it, which gpu_check.sh looks for).
#
#   scripts/device_gpu_check.sh      # on the device, from the repository root; .whl/ carried
#
# Settings (environment): WHEELS (default .whl), PYTHON3 (default python3: the image's Python
# that holds torch); gpu_check.sh's own (GPU_CHECK_EPOCHS, GPU_CHECK_TIMEOUT_S, ...) pass
# through. Exit: gpu_check.sh's status; 2 when the wheels are missing or do not install.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=${WHEELS:-$ROOT/.whl}
PY3=${PYTHON3:-python3}
SITE=/tmp/site
BIN=/tmp/bin

if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "device_gpu_check: no wheels in $WHEELS: run scripts/gpu_wheels.sh here and carry .whl" >&2
    exit 2
fi
if ! "$PY3" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl; then
    echo "device_gpu_check: the wheels in $WHEELS did not install into $SITE" >&2
    exit 2
fi
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$BIN"
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$PY3")" >"$BIN/python"
printf '#!/bin/sh\nexec %s -c "from shockwave_cli.main import app; app()" "$@"\n' \
    "$(command -v "$PY3")" >"$BIN/shockwave"
chmod +x "$BIN/python" "$BIN/shockwave"
"$BIN/python" --version
if ! "$BIN/python" -c 'import api.app, solver_service.driver, pyscipopt' 2>&1; then
    echo "device_gpu_check: the project does not import with the carried wheels" >&2
    exit 2
fi
PYTHON=$BIN/python exec "$ROOT/scripts/gpu_check.sh"
