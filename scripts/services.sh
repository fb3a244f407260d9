#!/usr/bin/env bash
# Start the local PostgreSQL and Redis the integration tests use, unless they already answer.
# Safe to run any number of times; fails (exit 1) if a service does not answer within the bound.
set -euo pipefail

HOST=127.0.0.1
WAIT_SECONDS=${SERVICES_WAIT_SECONDS:-30}

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
    echo "services.sh: starting PostgreSQL" >&2
    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start ||
        echo "services.sh: pg_ctlcluster failed (already starting?); waiting for PostgreSQL" >&2
fi
if ! redis_up; then
    echo "services.sh: starting Redis" >&2
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no ||
        echo "services.sh: redis-server failed to start; waiting for Redis" >&2
fi

wait_for PostgreSQL postgres_up
wait_for Redis redis_up
echo "services.sh: PostgreSQL and Redis are answering on $HOST" >&2
