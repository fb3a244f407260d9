#!/usr/bin/env bash
# Start the local PostgreSQL and Redis the integration tests use, unless they already answer.
# Where they are not installed (Debian, as root), install them first with apt and set PostgreSQL
# up as the tests expect it: trust authentication on 127.0.0.1 and ::1, and a database `test`.
# Safe to run any number of times; fails (exit 1) if a service does not answer within the bound.
set -euo pipefail

HOST=127.0.0.1
WAIT_SECONDS=${SERVICES_WAIT_SECONDS:-30}

say() { printf 'services.sh: %s\n' "$*" >&2; }

# Installed just now (the packages apt_install.sh printed): PostgreSQL is set up for the tests.
installed=$("$(dirname "${BASH_SOURCE[0]}")/apt_install.sh" pg_ctlcluster=postgresql redis-server=redis-server) || {
    say "PostgreSQL needs trust authentication for 127.0.0.1 and a database named test"
    exit 1
}
FRESH_POSTGRES=0
[[ $'\n'"$installed"$'\n' == *$'\n'postgresql$'\n'* ]] && FRESH_POSTGRES=1

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
