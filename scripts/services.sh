#!/usr/bin/env bash
# Start the local PostgreSQL and Redis the integration tests use, unless they already answer.
# Where they are not installed (Debian, as root), install them first with apt and set PostgreSQL
# up as the tests expect it: trust authentication on 127.0.0.1 and ::1, and a database `test`.
# Safe to run any number of times; fails (exit 1) if a service does not answer within the bound.
set -euo pipefail

HOST=127.0.0.1
WAIT_SECONDS=${SERVICES_WAIT_SECONDS:-30}

say() { printf 'services.sh: %s\n' "$*" >&2; }

FRESH_POSTGRES=0
install_missing() {
    local need=()
    command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        say "missing ${need[*]}: install them (Debian: sudo apt-get install -y ${need[*]}), with"
        say "trust authentication for 127.0.0.1 and a database named test, and run again"
        exit 1
    fi
    say "installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; then
        apt-get update -qq
        apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    [[ " ${need[*]} " == *" postgresql "* ]] && FRESH_POSTGRES=1
    return 0
}

# A PostgreSQL installed just now: the tests connect as postgres over TCP without a password,
# to the database test.
configure_fresh_postgres() {
    local version hba
    version=$(ls /etc/postgresql)
    hba=/etc/postgresql/$version/main/pg_hba.conf
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    runuser -u postgres -- psql -q -h /var/run/postgresql -d postgres \
        -c "SELECT 1 FROM pg_database WHERE datname = 'test'" -tA | grep -q 1 ||
        runuser -u postgres -- createdb -h /var/run/postgresql test
    say "PostgreSQL $version set up for the tests (trust on loopback, database test)"
}

install_missing

postgres_up() { pg_isready -q -h "$HOST" -p 5432; }
redis_up() { [ "$(redis-cli -h "$HOST" -p 6379 ping 2>/dev/null)" = "PONG" ]; }

wait_for() {
    local name=$1 check=$2 waited=0
    until "$check"; do
        if [ "$waited" -ge "$WAIT_SECONDS" ]; then
            echo "services.sh: $name did not answer on $HOST within ${WAIT_SECONDS}s" >&2
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

if ! postgres_up; then
    say "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start ||
        echo "services.sh: pg_ctlcluster failed (already starting?); waiting for PostgreSQL" >&2
fi
if ! redis_up; then
    say "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no ||
        echo "services.sh: redis-server failed to start; waiting for Redis" >&2
fi

wait_for PostgreSQL postgres_up
if [ "$FRESH_POSTGRES" = 1 ]; then
    configure_fresh_postgres
fi
wait_for Redis redis_up
say "PostgreSQL and Redis are answering on $HOST"
