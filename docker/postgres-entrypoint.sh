#!/bin/sh
# First start on an empty data directory: initdb with password authentication for the network
# (scram-sha-256) and the database POSTGRES_DB owned by POSTGRES_USER; then run the server,
# listening on every address of the container. The password comes from POSTGRES_PASSWORD or
# the file POSTGRES_PASSWORD_FILE names; there is no default.
set -eu

user=${POSTGRES_USER:-postgres}
database=${POSTGRES_DB:-$user}
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
fi
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres-entrypoint: set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE)" >&2
    exit 1
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    password_file=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$password_file"
    initdb --username="$user" --pwfile="$password_file" --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$password_file"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl --wait --silent --options="-c listen_addresses=''" start
    if [ "$database" != postgres ]; then
        createdb --username="$user" --owner="$user" "$database"
    fi
    pg_ctl --wait --silent --mode=fast stop
    echo "postgres-entrypoint: initialized $PGDATA (user $user, database $database)" >&2
fi

if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -c listen_addresses='*' "$@"
fi
exec "$@"
