#!/usr/bin/env bash
# Build the project's Docker images with no image registry: a Debian 12 base image made with
# debootstrap from the Debian mirror apt already uses, then the images on top of it.
#
#   scripts/images.sh            # the base image (once) and the project image, shockwave:latest
#   scripts/images.sh compose    # also the Postgres and Redis images docker-compose.yml runs
#
# Images: shockwave-base:bookworm (debootstrap --variant=minbase, Debian's Python 3.11 and its
# venv module, and this machine's added certificate authorities; built only when missing), shockwave:latest (the top-level Dockerfile on that
# base: the API, worker, driver, agent and the examples), shockwave-postgres:15 and
# shockwave-redis:7 (docker/postgres.Dockerfile, docker/redis.Dockerfile: Debian's packages).
# The builds run on the host network (pip and apt inside reach the same registries as this
# machine); Docker's cache makes a rebuild of unchanged sources take seconds. Starts the engine
# first (scripts/docker_engine.sh). Builds are serialized with a lock, so concurrent runs share
# one base image; the images a rebuild replaced (labelled org.shockwave.image) are pruned.
#
# Settings (environment): SHOCKWAVE_IMAGE, SHOCKWAVE_BASE_IMAGE, SHOCKWAVE_POSTGRES_IMAGE,
# SHOCKWAVE_REDIS_IMAGE (the names above), SHOCKWAVE_IMAGE_EXTRAS (optional dependency groups
# for the project image, e.g. torch), DEBIAN_MIRROR (default: the first Debian mirror in apt's
# sources), SHOCKWAVE_REBUILD_BASE=1 (rebuild the base image even if it exists).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${SHOCKWAVE_IMAGE:-shockwave:latest}
BASE=${SHOCKWAVE_BASE_IMAGE:-shockwave-base:bookworm}
POSTGRES=${SHOCKWAVE_POSTGRES_IMAGE:-shockwave-postgres:15}
REDIS=${SHOCKWAVE_REDIS_IMAGE:-shockwave-redis:7}
EXTRAS=${SHOCKWAVE_IMAGE_EXTRAS:-}
SUITE=bookworm
PROJECT_LABEL=org.shockwave.image=1
WHAT=${1:-project}

say() { printf 'images.sh: %s\n' "$*" >&2; }
case "$WHAT" in
project | compose) ;;
*)
    say "usage: scripts/images.sh [project|compose] (got $WHAT)"
    exit 2
    ;;
esac

"$ROOT/scripts/docker_engine.sh"
export DOCKER_BUILDKIT=0 # the classic builder: Debian's engine has no buildx

exec 9>"${TMPDIR:-/tmp}/shockwave-images.lock"
flock 9

debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local found
    found=$(
        {
            grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
            grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
                sed -E 's/^deb (\[[^]]*\] )?//' | awk '{print $1}'
        } | grep -E '/debian/?$' | head -n 1
    )
    if [ -z "$found" ]; then
        say "no Debian mirror in apt's sources: set DEBIAN_MIRROR"
        return 1
    fi
    echo "$found"
}

build_base() {
    local mirror rootfs began
    mirror=$(debian_mirror)
    rootfs=$(mktemp -d "${TMPDIR:-/tmp}/shockwave-rootfs-XXXXXX")
    trap 'rm -rf "$rootfs"' RETURN
    began=$SECONDS
    say "building $BASE: debootstrap $SUITE from $mirror (about a minute)"
    if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
        tail -n 20 "$rootfs.log" >&2
        rm -f "$rootfs.log"
        say "debootstrap failed"
        return 1
    fi
    rm -f "$rootfs.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    # The certificate authorities added on this machine (a TLS-intercepting proxy's, say) are
    # trusted inside too, so that pip and apt in the builds reach what the machine reaches.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    fi
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    say "built $BASE in $((SECONDS - began)) s"
}

build() { # name dockerfile [build args...]
    local name=$1 dockerfile=$2 began=$SECONDS
    shift 2
    say "building $name ($dockerfile)"
    if ! docker build --force-rm --label "$PROJECT_LABEL" --network host --build-arg "BASE_IMAGE=$BASE" "$@" \
        -f "$ROOT/$dockerfile" -t "$name" "$ROOT" >"${TMPDIR:-/tmp}/shockwave-build.log" 2>&1; then
        tail -n 30 "${TMPDIR:-/tmp}/shockwave-build.log" >&2
        say "docker build of $name failed"
        return 1
    fi
    say "built $name in $((SECONDS - began)) s"
}

if [ "${SHOCKWAVE_REBUILD_BASE:-0}" = 1 ] || ! docker image inspect "$BASE" >/dev/null 2>&1; then
    build_base
fi
build "$IMAGE" Dockerfile --build-arg "EXTRAS=$EXTRAS"
if [ "$WHAT" = compose ]; then
    build "$POSTGRES" docker/postgres.Dockerfile
    build "$REDIS" docker/redis.Dockerfile
fi
# The images these builds replaced (untagged now), and nothing else.
docker image prune --force --filter "label=$PROJECT_LABEL" >/dev/null
