# PostgreSQL 15 from Debian's packages, for machines that reach no image registry
# (scripts/images.sh compose). It takes the settings of the public postgres image that
# docker-compose.yml uses: POSTGRES_USER, POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE),
# POSTGRES_DB, data in /var/lib/postgresql/data; pg_isready is on the PATH.
ARG BASE_IMAGE=shockwave-base:bookworm
FROM ${BASE_IMAGE}

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
    && chmod 700 /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY docker/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
CMD ["postgres"]
