# Redis 7 from Debian's packages, for machines that reach no image registry (scripts/images.sh
# compose): `redis-server` and `redis-cli` on the PATH, as in the public redis image that
# docker-compose.yml uses. It is only the Celery broker: nothing is kept on disk.
ARG BASE_IMAGE=shockwave-base:bookworm
FROM ${BASE_IMAGE}

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
USER redis
EXPOSE 6379
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
