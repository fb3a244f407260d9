# The service image: API, solver worker and round driver are the same image with another command
# (see docker-compose.yml). The source tree stays at /app because the Alembic migrations
# (alembic.ini, migrations/) are read from next to the `api` package, not from the wheel: the
# install is editable so that `shockwave api` finds them.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY shockwave ./shockwave
COPY api ./api
COPY solver_service ./solver_service
COPY migrations ./migrations
RUN pip install -e . \
    && useradd --system --uid 10001 --home-dir /app shockwave
USER shockwave

EXPOSE 8000
CMD ["shockwave", "api", "--host", "0.0.0.0", "--port", "8000"]
