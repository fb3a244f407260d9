#!/usr/bin/env bash
# Download, here, the wheels a lent GPU machine needs to run the project: its image has Python
# 3.12 with torch and CUDA but no network and not this project's service dependencies
# (FastAPI, SQLModel, SCIP, Celery, ...). scripts/device_gpu_check.sh installs them there.
#
#   scripts/gpu_wheels.sh            # into .whl/ (git-ignored through .git/info/exclude)
#   scripts/gpu_wheels.sh DIR
#   scripts/gpu_wheels.sh --list     # print the name==version pins only (no download)
#
# What: every distribution the project's runtime dependencies need (the transitive closure of
# pyproject's [project] dependencies, read from this checkout's venv, at the versions installed
# there, so the device runs what the suite tested), for CPython 3.12 on manylinux x86_64, minus
# the ones the device image already holds and this project does not pin closely (numpy and
# matplotlib with theirs: the large ones; SKIP_WHEELS overrides the list). About 42 MB, within
# the 64 MiB a device call carries.
#
# Needs: the venv (`make venv`) and PyPI. Exit 0 with the wheels in DIR (emptied first); 2 when
# the venv is missing; pip's status when a download fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
LIST=0
if [ "${1:-}" = --list ]; then LIST=1; shift; fi
DIR=${1:-$ROOT/.whl}
SKIP=${SKIP_WHEELS:-numpy matplotlib pillow contourpy fonttools kiwisolver pyparsing cycler python-dateutil six packaging}

if [ ! -x "$PY" ]; then
    echo "gpu_wheels: no Python at $PY: run \`make venv\` first" >&2
    exit 2
fi
if [ "$LIST" = 0 ] && [ "$DIR" = "$ROOT/.whl" ] && [ -d "$ROOT/.git" ]; then
    mkdir -p "$ROOT/.git/info"
    grep -qx '/.whl/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.whl/' >>"$ROOT/.git/info/exclude"
fi

# name==version of each distribution the runtime closure needs (markers evaluated for the
# device: Linux, CPython 3.12; extras followed where a requirement names them).
mapfile -t PINS < <(SKIP="$SKIP" "$PY" - <<'EOF'
import os
from importlib.metadata import PackageNotFoundError, distribution
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

skip = {canonicalize_name(n) for n in os.environ["SKIP"].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "platform_machine": "x86_64", "os_name": "posix"}
seen: dict[str, str] = {}
# (requirement, the extras its parent was asked with: its marker may name one)
todo: list[tuple[str, tuple[str, ...]]] = [
    (r, ()) for r in distribution("shockwave-scheduler").requires or () if "extra ==" not in r
]
while todo:
    text, parent_extras = todo.pop()
    req = Requirement(text)
    if req.marker is not None and not any(
        req.marker.evaluate({**env, "extra": e}) for e in ("", *parent_extras)
    ):
        continue
    name = canonicalize_name(req.name)
    if name in skip or name in seen:
        continue
    try:
        dist = distribution(req.name)
    except PackageNotFoundError:
        raise SystemExit(f"gpu_wheels: {req.name} is not installed in the venv") from None
    seen[name] = dist.version
    todo.extend((sub, tuple(req.extras)) for sub in dist.requires or ())
for name, version in sorted(seen.items()):
    print(f"{name}=={version}")
EOF
)
if [ ${#PINS[@]} = 0 ]; then
    echo "gpu_wheels: could not read the project's dependencies from $PY" >&2
    exit 2
fi
if [ "$LIST" = 1 ]; then
    printf '%s\n' "${PINS[@]}"
    exit 0
fi
echo "gpu_wheels: ${#PINS[@]} distributions for CPython 3.12 (skipped: $SKIP)" >&2
rm -rf "$DIR" && mkdir -p "$DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$DIR" "${PINS[@]}" 2> >(grep -v "^WARNING: Location" >&2)
echo "gpu_wheels: $(ls "$DIR" | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR" >&2
