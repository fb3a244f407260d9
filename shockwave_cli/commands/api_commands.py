"""``shockwave api`` (serve the REST API under uvicorn) and ``shockwave admin`` (tokens and
migrations, straight on the database).

Both read their settings once, from the environment (SHOCKWAVE_DATABASE_URL chooses the
database: ``sqlite:///path`` embedded, or ``postgresql+psycopg://...``). The API, uvicorn and
SQLAlchemy are imported only when one of these commands runs, so the simulator's commands start
as fast as before.
"""

from __future__ import annotations

import ipaddress
import os
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from fastapi import FastAPI

    from api.settings import Settings

USAGE_ERROR_EXIT = 2
DATABASE_ERROR_EXIT = 1
ROLES = ("admin", "user", "agent", "job", "metrics")
SCOPES = {"user": "tenant", "agent": "node", "job": "job"}
"""The one scope option each role needs (admin and metrics need none and take none)."""
UNPARSEABLE_URL = (
    "SHOCKWAVE_DATABASE_URL: cannot parse it (not shown: it may hold a password); expected "
    "sqlite:///path or postgresql+psycopg://user:password@host:port/db"
)

console = Console()
errors = Console(stderr=True)

admin_app = typer.Typer(
    help="Administer the service's database directly (SHOCKWAVE_DATABASE_URL): tokens, migrations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def api_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.", min=1)] = 1,
    migrate: Annotated[
        bool, typer.Option(help="Apply the database migrations before serving.")
    ] = True,
    open_mode: Annotated[
        bool,
        typer.Option(
            "--open",
            help="Open mode: requests without a token act as admin. Loopback hosts only "
            "(also SHOCKWAVE_OPEN_MODE=1).",
        ),
    ] = False,
    log_level: Annotated[
        str, typer.Option(help="uvicorn log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Serve the REST API under uvicorn (docs at /docs), migrating its database first.

    SHOCKWAVE_DATABASE_URL names the database: sqlite:///path (default ./shockwave.db) or
    postgresql+psycopg://user@host/db.
    """
    import uvicorn

    from api.http_limits import LimitedHttpToolsProtocol

    settings = _settings()
    open_mode = open_mode or settings.open_mode
    if open_mode and not is_loopback(host):
        _fail(
            f"open mode serves every request as an admin, so it listens on loopback addresses "
            f"only (127.0.0.1, ::1, localhost), not {host!r}: drop --open/SHOCKWAVE_OPEN_MODE "
            "and use tokens (`shockwave admin create-token`)",
            USAGE_ERROR_EXIT,
        )
    settings = settings.model_copy(update={"open_mode": open_mode, "host": host, "port": port})
    database = _shown_url(settings.database_url)
    if migrate:
        _migrate(settings.database_url, settings.database_schema)
    base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    auth = (
        "OPEN MODE, requests without a token act as admin (loopback only)"
        if open_mode
        else "bearer tokens (create one with `shockwave admin create-token --role admin`)"
    )
    for line in (
        f"Shockwave API: {base}  (docs: {base}/docs, OpenAPI: {base}/openapi.json)",
        f"Database: {database}{_schema_note(settings.database_schema)}"
        f"{' (migrated to head)' if migrate else ''}",
        f"Auth: {auth}",
    ):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if workers == 1:
        app = service_app(settings)
        uvicorn.run(app, host=host, port=port, log_level=log_level, http=LimitedHttpToolsProtocol)
        return
    os.environ.update(
        SHOCKWAVE_OPEN_MODE="1" if open_mode else "0",
        SHOCKWAVE_HOST=host,
        SHOCKWAVE_PORT=str(port),
    )
    uvicorn.run(
        "shockwave_cli.commands.api_commands:service_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        http=LimitedHttpToolsProtocol,
    )


def service_app(settings: Settings | None = None) -> FastAPI:
    """The API of the distributed deployment (default settings: from the environment), whose
    committed changes ask the solver service for plans (SHOCKWAVE_SOLVER_MODE, ...BROKER_URL).
    uvicorn calls it in each worker process when ``--workers`` is more than one."""
    from api.app import create_app
    from api.http_limits import configure
    from solver_service.enqueue import request_plan

    settings = settings or Settings()
    configure(settings)
    return create_app(settings, request_plan=request_plan)


@admin_app.command("create-token")
def create_token_command(
    role: Annotated[str, typer.Option(help=f"One of {', '.join(ROLES)}.", show_default=False)],
    tenant: Annotated[str | None, typer.Option(help="The tenant a user token acts for.")] = None,
    node: Annotated[str | None, typer.Option(help="The node an agent token acts for.")] = None,
    job: Annotated[str | None, typer.Option(help="The job id a job token reports for.")] = None,
    name: Annotated[str, typer.Option(help="A label, to tell tokens apart.")] = "",
    expires_in: Annotated[
        str | None,
        typer.Option(help="Expire after this long: 3600, 15m, 12h or 30d (default: never)."),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            help="Agent tokens: also approve the node for this many GPUs (enrollment).",
            min=1,
            max=1024,
        ),
    ] = None,
    gpu_type: Annotated[
        str, typer.Option(help="With --gpus: the approved GPU type (default: any).")
    ] = "",
) -> None:
    """Create a bearer token and print it once on stdout (it is stored only as a hash).

    A user token needs --tenant, an agent token --node, a job token --job (an existing job);
    admin and metrics tokens (a metrics token scrapes /metrics, nothing else) take none of
    them. An agent token with --gpus also approves its node for that many GPUs (approve-node).
    The database is migrated first. list-tokens, revoke-token and set-token-expiry manage
    tokens afterwards.
    """
    from datetime import UTC, datetime

    from pydantic import TypeAdapter
    from pydantic import ValidationError as PydanticError
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from api.schemas import Tenant
    from shockwave_cli.commands.token_commands import parse_duration
    from store.db import make_engine
    from store.principals import Role
    from store.tables import JobRow
    from store.tokens import create_token

    _check_scope(role, {"tenant": tenant, "node": node, "job": job})
    if gpus is not None and role != "agent":
        _fail("--gpus: only an agent token approves its node's GPUs", USAGE_ERROR_EXIT)
    if tenant is not None:
        try:
            TypeAdapter(Tenant).validate_python(tenant)
        except PydanticError:
            _fail(
                f"--tenant: {tenant!r} is not a tenant path (names of letters, digits, '.', "
                "'_', '-' joined by '/', such as org/team; at most 64)",
                USAGE_ERROR_EXIT,
            )
    if len(name) > 128 or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        _fail("--name: at most 128 characters, none of them control characters", USAGE_ERROR_EXIT)
    expires_at = None
    if expires_in is not None:
        expires_at = datetime.now(UTC) + parse_duration("--expires-in", expires_in)
    settings = _settings()
    url = settings.database_url
    _migrate(url, settings.database_schema)
    engine = make_engine(url, settings.database_schema)
    try:
        with Session(engine) as session:
            if job is not None and session.get(JobRow, job) is None:
                _fail(f"--job: no job {job!r} in {_shown_url(url)}", USAGE_ERROR_EXIT)
            token = create_token(
                session,
                Role(role),
                tenant=tenant,
                node=node,
                job_id=job,
                name=name,
                expires_at=expires_at,
            )
            if gpus is not None and node is not None:
                _approve(session, node, gpus, gpu_type)
    except ValueError as error:
        _fail(str(error), USAGE_ERROR_EXIT)
    except SQLAlchemyError as error:
        _fail(_database_error(url, error), DATABASE_ERROR_EXIT)
    finally:
        engine.dispose()
    typer.echo(token)
    label = f" {name!r}" if name else ""
    errors.print(f"Created {_article(role)} {role} token{label}; it is shown only once.")


@admin_app.command("approve-node")
def approve_node_command(
    node: Annotated[str, typer.Argument(help="The node's id (as its agent token names it).")],
    gpus: Annotated[int, typer.Option(help="The GPUs approved.", min=1, max=1024)],
    gpu_type: Annotated[str, typer.Option(help="The approved GPU type (default: any).")] = "",
) -> None:
    """Approve a node's GPUs, before or after its agent registers: the node gets leases only
    once approved, never for more GPUs than approved, and its agent is refused when it reports
    more (or another GPU type). Approving again replaces the approval."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from store.db import make_engine

    settings = _settings()
    url = settings.database_url
    _migrate(url, settings.database_schema)
    engine = make_engine(url, settings.database_schema)
    try:
        with Session(engine) as session:
            _approve(session, node, gpus, gpu_type)
    except SQLAlchemyError as error:
        _fail(_database_error(url, error), DATABASE_ERROR_EXIT)
    finally:
        engine.dispose()
    kind = f" {gpu_type}" if gpu_type else ""
    console.print(f"Node {node} approved for {gpus}{kind} GPUs.", soft_wrap=True)


def _approve(session: Any, node: str, gpus: int, gpu_type: str) -> None:
    """Approve ``node`` for ``gpus`` GPUs of ``gpu_type`` and commit (a new plan is asked
    for by the next round: the cluster's version is bumped)."""
    from store import cluster, cluster_version

    cluster.approve_node(session, node, gpus, gpu_type)
    cluster_version.bump_and_request(session, f"node {node} approved")
    session.commit()


@admin_app.command("migrate")
def migrate_command() -> None:
    """Upgrade the database that SHOCKWAVE_DATABASE_URL names to the latest schema."""
    settings = _settings()
    url = settings.database_url
    _migrate(url, settings.database_schema)
    console.print(
        f"Database {_shown_url(url)}{_schema_note(settings.database_schema)} is at the latest "
        "schema (head).",
        soft_wrap=True,
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): open mode's only hosts."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_scope(role: str, scopes: dict[str, str | None]) -> None:
    if role not in ROLES:
        _fail(f"--role: expected one of {', '.join(ROLES)}, got {role!r}", USAGE_ERROR_EXIT)
    needed = SCOPES.get(role)
    if needed is not None and not scopes[needed]:
        _fail(f"{_article(role)} {role} token needs --{needed}", USAGE_ERROR_EXIT)
    extra = [option for option, value in scopes.items() if value and option != needed]
    if extra:
        _fail(
            f"--{extra[0]} does not apply to {_article(role)} {role} token"
            + (f" (it takes --{needed} only)" if needed else ""),
            USAGE_ERROR_EXIT,
        )


def _schema_note(schema: str | None) -> str:
    return f", schema {schema}" if schema else ""


def _article(word: str) -> str:
    return "an" if word[:1] in "aeio" else "a"  # a user, a metrics token


def _settings() -> Settings:
    from pydantic import ValidationError as PydanticError

    from api.settings import Settings

    try:
        return Settings()
    except PydanticError as error:
        first = error.errors()[0]
        where = "SHOCKWAVE_" + "_".join(str(part) for part in first["loc"]).upper()
        _fail(f"{where}: {first['msg']}", USAGE_ERROR_EXIT)


def _migrate(url: str, schema: str | None) -> None:
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from store.migrate import upgrade

    try:
        upgrade(url, schema)
    except ArgumentError:
        _fail(UNPARSEABLE_URL, USAGE_ERROR_EXIT)
    except SQLAlchemyError as error:
        _fail(_database_error(url, error), DATABASE_ERROR_EXIT)


def _shown_url(url: str) -> str:
    """``url`` with any password masked."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        _fail(UNPARSEABLE_URL, USAGE_ERROR_EXIT)


def _database_error(url: str, error: Exception) -> str:
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines()
    return f"cannot use the database {_shown_url(url)}: {lines[0] if lines else type(cause)}"


def _fail(message: str, code: int) -> NoReturn:
    errors.print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    raise typer.Exit(code)
