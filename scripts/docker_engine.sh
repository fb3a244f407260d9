#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`: install Debian's docker.io (and debootstrap,
# which scripts/images.sh builds base images with, and docker-compose, which validates and runs
# docker-compose.yml) when they are missing and this runs as root, then start `dockerd` in the
# background when no engine answers. Safe to run any number of times.
#
# Exit 0: the engine answers. 1: it could not be installed or did not start (the reason and the
# end of dockerd's log are printed). Settings (environment): DOCKER_WAIT_SECONDS (60),
# DOCKERD_LOG (/var/log/shockwave-dockerd.log).
set -euo pipefail

WAIT_SECONDS=${DOCKER_WAIT_SECONDS:-60}
LOG=${DOCKERD_LOG:-/var/log/shockwave-dockerd.log}

say() { printf 'docker_engine.sh: %s\n' "$*" >&2; }

"$(dirname "${BASH_SOURCE[0]}")/apt_install.sh" dockerd=docker.io docker-compose=docker-compose \
    debootstrap=debootstrap >/dev/null

answers() { docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

if answers; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "no Docker engine answers and this is not root: start one (sudo dockerd &) and run again"
    exit 1
fi
say "starting dockerd (log: $LOG)"
# setsid: the engine outlives this script and the make that ran it (as a service would).
setsid nohup dockerd >>"$LOG" 2>&1 </dev/null &
for _ in $(seq "$WAIT_SECONDS"); do
    if answers; then
        say "the Docker engine answers ($(docker info --format '{{.ServerVersion}}'))"
        exit 0
    fi
    sleep 1
done
say "dockerd did not answer within ${WAIT_SECONDS}s; the end of $LOG:"
tail -n 20 "$LOG" >&2 || true
exit 1
