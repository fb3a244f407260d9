"""The Alembic migrations build the schema on an empty Postgres and remove it again, both through
:mod:`store.migrate` and through the documented ``alembic`` command line."""

from __future__ import annotations

import json
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


def _job_with_events(engine: Engine) -> None:
    """A job at revision 0007 with two progress events and two scaling events, out of order."""
    now = "2026-11-28 09:00:00+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO jobs (id, tenant, name, state, gpus, epochs, samples_per_epoch, "
                "initial_batch_size, mode, batch_sizes, throughput, budget, model, epochs_done, "
                "batch_size, attained_s, last_seq, created_at, updated_at) VALUES ('j1', 't', "
                "'n', 'RUNNING', 1, 10, 100, 32, 'gns', '[32, 64]', '{}', 1.0, '', 2.0, 64, "
                f"21.0, 4, '{now}', '{now}')"
            )
        )
        for seq, kind, payload in (
            (2, "progress", '{"epoch": 2, "seconds": 12.0, "batch_size": 32}'),
            (4, "scaling", '{"epoch": 3, "batch_size": 64}'),
            (1, "progress", '{"epoch": 1, "seconds": 9.0, "batch_size": 32}'),
            (3, "scaling", '{"epoch": 2, "batch_size": 64}'),
        ):
            connection.execute(
                text(
                    "INSERT INTO job_events (job_id, seq, kind, payload, reason, created_at) "
                    f"VALUES ('j1', {seq}, '{kind}', '{payload}', '', '{now}')"
                )
            )


def test_the_fold_migration_folds_the_stored_events(
    postgres_server: Engine, tmp_path: Path
) -> None:
    """0008 gives existing jobs the state their stored events fold into, on both databases."""
    with postgres_schema(postgres_server, "it_fold") as schema:
        for url, on in ((POSTGRES_URL, schema), (f"sqlite:///{tmp_path / 'fold.db'}", None)):
            migrate.upgrade(url, schema=on, revision="0007")
            engine = make_engine(url, on)
            try:
                _job_with_events(engine)
                migrate.upgrade(url, schema=on)
                with engine.connect() as connection:
                    row = connection.execute(
                        text("SELECT epoch_seconds, scalings FROM jobs WHERE id = 'j1'")
                    ).one()
            finally:
                engine.dispose()
            totals, scalings = (json.loads(v) if isinstance(v, str) else v for v in row)
            assert totals == {"32": [21.0, 2]}, url
            assert scalings == [[2, 3, 64], [3, 4, 64]], url


def test_the_large_json_documents_are_stored_without_compression(
    postgres_server: Engine,
) -> None:
    """A plan's rounds, the policy's memory and a round's jobs (lists of random ids, which
    compression fails to shrink) are stored out of line without a compression attempt."""
    with postgres_schema(postgres_server, "it_storage") as schema:
        migrate.upgrade(POSTGRES_URL, schema=schema)
        with postgres_server.connect() as connection:
            storage: dict[str, str] = dict(
                connection.execute(
                    text(
                        "SELECT c.relname || '.' || a.attname, a.attstorage FROM pg_attribute a "
                        "JOIN pg_class c ON c.oid = a.attrelid "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = :schema AND a.atttypid = 'json'::regtype"
                    ),
                    {"schema": schema},
                ).all()
            )
    assert {k: storage[k] for k in ("plans.rounds", "clusters.policy_state", "rounds.jobs")} == {
        "plans.rounds": "e",
        "clusters.policy_state": "e",
        "rounds.jobs": "e",
    }
    assert storage["jobs.command"] == "x", "small documents keep the default"
