"""The Alembic migrations build the schema on an empty Postgres and remove it again, both through
:mod:`store.migrate` and through the documented ``alembic`` command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import inspect, make_url, text
from sqlalchemy.engine import Engine

from store import migrate
from store.db import make_engine
from tests.integration.conftest import POSTGRES_URL, postgres_schema, unique_name

ROOT = Path(migrate.__file__).resolve().parents[1]
TABLES = {"jobs", "job_events", "tokens", "idempotency_keys"}


def schema_tables(server: Engine, schema: str) -> set[str]:
    return set(inspect(server).get_table_names(schema=schema))


def test_upgrade_builds_the_schema_and_downgrade_removes_it(postgres_server: Engine) -> None:
    public_before = schema_tables(postgres_server, "public")
    with postgres_schema(postgres_server, "it_mig") as schema:
        migrate.upgrade(POSTGRES_URL, schema=schema)
        built = schema_tables(postgres_server, schema)
        assert built >= TABLES | {"alembic_version"}, built
        with postgres_server.connect() as connection:
            head = connection.execute(text(f'SELECT version_num FROM "{schema}".alembic_version'))
            assert head.scalar_one()

        migrate.downgrade(POSTGRES_URL, schema=schema)
        assert schema_tables(postgres_server, schema) <= {"alembic_version"}
    assert schema_tables(postgres_server, "public") & TABLES <= public_before, "touched public"


def _alembic(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    alembic = Path(sys.executable).with_name("alembic")
    env = {**os.environ, "SHOCKWAVE_DATABASE_URL": url}
    return subprocess.run(
        [str(alembic), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_documented_alembic_commands_migrate_a_fresh_database(postgres_server: Engine) -> None:
    name = unique_name("it_alembic")
    with postgres_server.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        upgraded = _alembic("upgrade", "head", url=url)
        assert upgraded.returncode == 0, upgraded.stderr
        assert set(inspect(engine).get_table_names()) >= TABLES | {"alembic_version"}

        downgraded = _alembic("downgrade", "base", url=url)
        assert downgraded.returncode == 0, downgraded.stderr
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
        with postgres_server.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
