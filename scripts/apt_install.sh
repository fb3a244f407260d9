#!/usr/bin/env bash
# `scripts/apt_install.sh COMMAND=PACKAGE ...`: install with apt each Debian PACKAGE whose COMMAND
# is not on the PATH (as root; `apt-get update` first only if the install fails without it).
# Prints the packages it installed, one a line. Exit 1, naming what to install, when something is
# missing and this is not root on a machine with apt.
set -euo pipefail

need=()
for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || need+=("${pair#*=}")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "apt_install.sh: missing ${need[*]}: install them (Debian: sudo apt-get install -y ${need[*]}) and run again" >&2
    exit 1
fi
echo "apt_install.sh: installing ${need[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
printf '%s\n' "${need[@]}"
