# The project image: the API, the solver worker, the round driver and the node agent are this one
# image with another command (docker-compose.yml), and the example training programs run in it
# (the agent's Docker runtime, tests/e2e/test_docker_runtime.py).
#
#   docker build -t shockwave:latest .                       # on the public Python image
#   scripts/images.sh                                        # without a registry (docs/service.md)
#
# BASE_IMAGE: any Debian-like image with python3 (3.11 or newer) and its venv module; the default
# is the public Python image, scripts/images.sh passes a base image it built with debootstrap.
# EXTRAS: optional dependency groups of pyproject.toml to add (e.g. `torch` for examples/torch_mlp.py).
# The whole source tree is copied (what .dockerignore leaves out aside), so a new top-level package
# needs no change here; the install is editable so that the Alembic files (alembic.ini,
# migrations/) are found next to the packages, at /app.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/shockwave \
    PATH=/opt/shockwave/bin:$PATH

WORKDIR /app
# /var/lib/shockwave: the agent's work directory and its token, volumes in docker-compose.yml
# (a new named volume takes the ownership of the directory it is mounted on).
RUN python3 -m venv "$VIRTUAL_ENV" \
    && useradd --uid 10001 --home-dir /app --no-create-home --shell /usr/sbin/nologin shockwave \
    && mkdir -p /var/lib/shockwave/agent /var/lib/shockwave/tokens \
    && chown -R shockwave: /var/lib/shockwave

# The dependencies first, read from pyproject.toml alone: a change to the source does not
# reinstall them (this layer is rebuilt only when pyproject.toml changes).
COPY pyproject.toml ./
COPY docker/requirements.py docker/
RUN python3 docker/requirements.py "$EXTRAS" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY . .
RUN pip install --no-deps --no-build-isolation -e . \
    && shockwave --help > /dev/null
USER shockwave

EXPOSE 8000
CMD ["shockwave", "api", "--host", "0.0.0.0", "--port", "8000"]
