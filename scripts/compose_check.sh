#!/usr/bin/env bash
# `make compose-check`: the compose stack, for real. Builds the images locally (no registry:
# scripts/images.sh compose, which installs and starts the Docker engine if needed), brings
# docker-compose.yml up under a project name of its own with a fresh env file (a random Postgres
# password, 5 s rounds), waits until every service is healthy, submits two example jobs with the
# CLI (examples/container/*.yaml), waits until both SUCCEED through the agent container, prints
# the services and the timings, and tears everything down (containers, network, volumes).
#
# Exit 0: both jobs SUCCEEDED and nothing was left behind. 1: anything else (the services' logs
# are printed). Settings (environment): COMPOSE_CHECK_TIMEOUT_S (300: for the jobs),
# COMPOSE_CHECK_KEEP=1 (leave the stack up; tear it down with the command it prints).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
SW=$(dirname "$PY")/shockwave
TIMEOUT_S=${COMPOSE_CHECK_TIMEOUT_S:-300}
JOBS=(examples/container/numpy_linear.yaml examples/container/numpy_linear_accordion.yaml)
PROJECT=shockwave-check-$$
BEGAN=$SECONDS

say() { printf 'compose_check: %s\n' "$*" >&2; }
fail() {
    say "FAILED: $*"
    exit 1
}
[ -x "$SW" ] || fail "no shockwave command next to $PY: run \`make venv\` (or set PYTHON)"

# --- images ------------------------------------------------------------------------------------
step=$SECONDS
"$ROOT/scripts/images.sh" compose
IMAGES_S=$((SECONDS - step))
export SHOCKWAVE_IMAGE=shockwave:latest SHOCKWAVE_POSTGRES_IMAGE=shockwave-postgres:15 \
    SHOCKWAVE_REDIS_IMAGE=shockwave-redis:7

if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    COMPOSE=(docker-compose)
fi

# --- the stack ---------------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shockwave-compose-check-XXXXXX")
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export SHOCKWAVE_ENV_FILE=$WORK/check.env SHOCKWAVE_API_PORT=$PORT
umask 077
cat >"$SHOCKWAVE_ENV_FILE" <<ENV
POSTGRES_PASSWORD=$("$PY" -c 'import secrets; print(secrets.token_hex(24))')
SHOCKWAVE_ROUND_SECONDS=5
SHOCKWAVE_SOLVER_TIME_LIMIT_S=2
ENV
umask 022
compose() { "${COMPOSE[@]}" --project-name "$PROJECT" --env-file "$SHOCKWAVE_ENV_FILE" -f "$ROOT/docker-compose.yml" "$@"; }

leftovers() {
    local label=com.docker.compose.project=$PROJECT
    {
        docker ps --all --quiet --filter "label=$label" | sed 's/^/container /'
        docker network ls --quiet --filter "label=$label" | sed 's/^/network /'
        docker volume ls --quiet --filter "label=$label" | sed 's/^/volume /'
    } 2>/dev/null
}
TORN_DOWN=0
teardown() {
    local status=$? step=$SECONDS
    [ "$TORN_DOWN" = 1 ] && return
    TORN_DOWN=1
    if [ "$status" != 0 ]; then
        say "the services' logs (last 40 lines each):"
        compose logs --no-color --tail 40 >&2 || true
    fi
    if [ "${COMPOSE_CHECK_KEEP:-0}" = 1 ]; then
        say "kept the stack: ${COMPOSE[*]} --project-name $PROJECT --env-file $SHOCKWAVE_ENV_FILE down -v"
        return
    fi
    compose down --volumes --remove-orphans --timeout 30 >/dev/null 2>&1 || true
    rm -rf "$WORK"
    local left
    left=$(leftovers)
    if [ -n "$left" ]; then
        say "FAILED: left behind after down:"
        echo "$left" >&2
        exit 1
    fi
    say "torn down in $((SECONDS - step)) s: no container, network or volume of $PROJECT is left"
}
trap teardown EXIT
trap 'exit 130' INT TERM

say "starting the stack $PROJECT (API on 127.0.0.1:$PORT) with ${COMPOSE[*]}"
step=$SECONDS
compose up --detach --no-build >"$WORK/up.log" 2>&1 || {
    cat "$WORK/up.log" >&2
    fail "${COMPOSE[*]} up failed"
}

service_state() { # service -> healthy, starting, unhealthy, exited:N, running (no check) or missing
    local id
    id=$(compose ps --quiet "$1" 2>/dev/null | head -n 1)
    [ -n "$id" ] || {
        echo missing
        return
    }
    docker inspect --format \
        '{{if eq .State.Status "exited"}}exited:{{.State.ExitCode}}{{else if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' \
        "$id"
}
SERVICES=(postgres redis api worker driver driver-standby agent-token agent)
deadline=$((SECONDS + 240))
while :; do
    pending=()
    for service in "${SERVICES[@]}"; do
        state=$(service_state "$service")
        case "$service:$state" in
        agent-token:exited:0 | *:healthy) ;;
        agent-token:exited:* | *:unhealthy | *:missing) fail "$service is $state" ;;
        *) pending+=("$service:$state") ;;
        esac
    done
    [ ${#pending[@]} -eq 0 ] && break
    [ $SECONDS -lt $deadline ] || fail "not healthy after 240 s: ${pending[*]}"
    sleep 2
done
UP_S=$((SECONDS - step))
say "every service is healthy after $UP_S s"

# --- two jobs through the CLI ----------------------------------------------------------------
step=$SECONDS
export SHOCKWAVE_API_URL=http://127.0.0.1:$PORT
SHOCKWAVE_TOKEN=$(compose exec -T api shockwave admin create-token --role user --tenant compose-check 2>/dev/null | tr -d '\r')
export SHOCKWAVE_TOKEN
[ -n "$SHOCKWAVE_TOKEN" ] || fail "could not create a token in the api container"
ids=()
for job in "${JOBS[@]}"; do
    id=$("$SW" jobs submit "$job" -o json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["id"])') ||
        fail "shockwave jobs submit $job failed"
    say "submitted $job: job $id"
    ids+=("$id")
done
job_state() { "$SW" jobs get "$1" -o json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["state"])'; }
deadline=$((SECONDS + TIMEOUT_S))
while :; do
    states=()
    done_count=0
    for id in "${ids[@]}"; do
        state=$(job_state "$id") || state=unknown
        states+=("$state")
        case "$state" in
        SUCCEEDED) done_count=$((done_count + 1)) ;;
        FAILED | CANCELLED)
            "$SW" jobs events "$id" >&2 || true
            fail "job $id is $state"
            ;;
        esac
    done
    [ "$done_count" -eq ${#ids[@]} ] && break
    [ $SECONDS -lt $deadline ] || fail "jobs not done after $TIMEOUT_S s: ${states[*]}"
    sleep 2
done
JOBS_S=$((SECONDS - step))
"$SW" jobs ls --all
for id in "${ids[@]}"; do # trained in the agent's container: its loss curve is there
    compose exec -T agent grep -q '"record": "finished"' "/var/lib/shockwave/agent/checkpoints/$id/loss.jsonl" ||
        fail "no finished loss curve of job $id in the agent container"
done
say "both jobs SUCCEEDED in $JOBS_S s, trained in the agent container"
echo "== services"
compose ps

# --- down --------------------------------------------------------------------------------------
trap - EXIT
teardown
echo "== timings: images ${IMAGES_S} s, stack up and healthy ${UP_S} s, two jobs ${JOBS_S} s, total $((SECONDS - BEGAN)) s"
echo "compose_check: OK"
