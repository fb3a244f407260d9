"""The documentation's reference pages, rendered from the code so that they cannot drift from it.

Three pages, each a Markdown string (``scripts/mkdocs_hooks.py`` adds them to the site at build
time; ``make docs`` builds it with ``--strict``):

- :func:`cli_reference`: every command of the ``shockwave`` Typer app, walked as the click
  command tree it becomes: its help, its usage line, and each option and argument with its
  environment variable and default.
- :func:`settings_reference`: every setting of the service's pydantic settings classes
  (:data:`SETTINGS_CLASSES`): the environment variable, the default and the meaning, taken from
  the field's own docstring or else from its entry in the class docstring (````name````:
  meaning, or ````a```` / ````b````: meaning shared by both).
- :func:`api_reference`: every operation of the REST API's OpenAPI document.

A command, option, argument or setting without a description raises :class:`MissingDocs`
naming it: a new one cannot ship undocumented (tests/unit/test_reference.py runs these).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import typer
from pydantic_settings import BaseSettings

ENV_PREFIX = "SHOCKWAVE_"


class MissingDocs(ValueError):
    """A command, parameter or setting has no description; the message names each one."""


def _markdown(text: str) -> str:
    """Docstring markup (reStructuredText roles and double backquotes) as Markdown code."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    """``text`` fit for one Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


# --- the command line -------------------------------------------------------------------------


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def _is_option(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "option"


def _context(command: Any, name: str) -> Any:
    return command.context_class(command, info_name=name)


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every visible command under ``command`` (itself first), depth first, in the order the
    app lists them. Typer's command classes are click's or a copy of them: only their shape is
    relied on."""
    yield path, command
    if _is_group(command):
        ctx = _context(command, path[-1])
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, (*path, name))


def _param_help(param: Any) -> str:
    return str(getattr(param, "help", None) or "").strip()


def _default(param: Any) -> str:
    if getattr(param, "show_default", True) is False:
        return ""
    default = param.default
    if callable(default) or default is None or default == () or default == []:
        return ""
    if _is_option(param) and param.is_flag and param.secondary_opts:
        return str(param.opts[0] if default else param.secondary_opts[0])
    if _is_option(param) and param.is_flag:
        return "on" if default else "off"
    return f"`{default}`"


def _names(param: Any) -> str:
    if _is_option(param):
        names = [*param.opts, *param.secondary_opts]
        return ", ".join(f"`{n}`" for n in names)
    return f"`{(param.human_readable_name or param.name or '').upper()}`"


def cli_reference(app: typer.Typer, prog: str = "shockwave") -> str:
    """The Markdown reference of every command of ``app``. Raises :class:`MissingDocs` naming
    every visible command without help and every visible parameter without help."""
    root = typer.main.get_command(app)
    missing: list[str] = []
    sections: list[str] = []
    for path, command in _commands(root, (prog,)):
        name = " ".join(path)
        text = inspect.cleandoc(command.help or "")
        if not text:
            missing.append(f"command `{name}`")
        ctx = _context(command, name)
        usage = " ".join(command.collect_usage_pieces(ctx))
        lines = [f"## `{name}`", "", text.replace("\b\n", ""), ""]
        lines += ["```text", f"{name} {usage}".rstrip(), "```", ""]
        if _is_group(command):
            subs = [
                (n, c)
                for n in command.list_commands(ctx)
                if (c := command.get_command(ctx, n)) is not None and not c.hidden
            ]
            lines += ["| Command | What it does |", "| --- | --- |"]
            for sub_name, sub in subs:
                anchor = _anchor(f"{name} {sub_name}")
                summary = _cell(sub.get_short_help_str(limit=120))
                lines.append(f"| [`{sub_name}`](#{anchor}) | {summary} |")
            lines.append("")
        params = [
            p for p in command.params if not getattr(p, "hidden", False) and p.name not in {"help"}
        ]
        if params:
            lines += ["| Option | Environment | Default | Meaning |", "| --- | --- | --- | --- |"]
            for param in params:
                help_text = _param_help(param)
                if not help_text:
                    missing.append(f"parameter {_names(param)} of `{name}`")
                envvar = param.envvar if isinstance(param.envvar, str) else ""
                env = f"`{envvar}`" if envvar else ""
                lines.append(
                    f"| {_names(param)} | {env} | {_cell(_default(param))} | {_cell(help_text)} |"
                )
            lines.append("")
        sections.append("\n".join(lines))
    if missing:
        raise MissingDocs("no help text for: " + "; ".join(missing))
    head = [
        "# Command line",
        "",
        "Every command of `shockwave`, generated from the command line itself at build time "
        "(`shockwave <command> --help` prints the same). Options marked with an environment "
        "variable read it when the option is not given.",
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(sections)


def _anchor(title: str) -> str:
    """The id MkDocs' toc gives a heading ``title`` (lower case, punctuation dropped)."""
    slug = re.sub(r"[^\w\s-]", "", title.lower()).strip()
    return re.sub(r"[-\s]+", "-", slug)


# --- settings ---------------------------------------------------------------------------------


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The string literals written right after a field of ``cls`` (its attribute docstrings)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    found: dict[str, str] = {}
    if not isinstance(body, ast.ClassDef):
        return found
    statements = body.body
    for stmt, after in itertools.pairwise(statements):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[stmt.target.id] = inspect.cleandoc(after.value.value)
    return found


_ENTRY = re.compile(r"``(\w+)``((?:\s*/\s*``\w+``)*)\s*:")


def _docstring_entries(doc: str, fields: Sequence[str]) -> dict[str, str]:
    """The meaning of each of ``fields`` in a class docstring written as entries: ````name````:
    text up to the next entry (````a```` / ````b````: one text for both)."""
    starts: list[tuple[int, int, list[str]]] = []
    for match in _ENTRY.finditer(doc):
        names = [match.group(1), *re.findall(r"``(\w+)``", match.group(2))]
        if any(n in fields for n in names):
            starts.append((match.start(), match.end(), names))
    entries: dict[str, str] = {}
    for i, (_, end, names) in enumerate(starts):
        stop = starts[i + 1][0] if i + 1 < len(starts) else len(doc)
        text = " ".join(doc[end:stop].split())
        for name in names:
            entries.setdefault(name, text)
    return entries


def setting_meanings(cls: type[BaseSettings]) -> dict[str, str]:
    """The meaning of each field ``cls`` itself declares (not its bases'), from the field's
    description, its attribute docstring, or its entry in the class docstring. Raises
    :class:`MissingDocs` naming the fields with none."""
    own = [name for name in cls.__annotations__ if name in cls.model_fields]
    attrs = _attribute_docstrings(cls)
    entries = _docstring_entries(inspect.getdoc(cls) or "", own)
    meanings: dict[str, str] = {}
    missing: list[str] = []
    for name in own:
        info = cls.model_fields[name]
        meaning = info.description or attrs.get(name) or entries.get(name, "")
        if not meaning.strip():
            missing.append(f"{ENV_PREFIX}{name.upper()} ({cls.__module__}.{cls.__qualname__})")
        meanings[name] = _markdown(" ".join(meaning.split()))
    if missing:
        raise MissingDocs("no description for setting: " + ", ".join(missing))
    return meanings


def _setting_default(cls: type[BaseSettings], name: str) -> str:
    info = cls.model_fields[name]
    if info.default_factory is not None:
        return "(computed)"
    default = info.default
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "`true`" if default else "`false`"
    return f"`{default}`"


def _settings_classes() -> list[tuple[str, type[BaseSettings], str]]:
    from api.settings import Settings
    from solver_service.driver import DriverSettings
    from solver_service.settings import SolverSettings
    from store.settings import DatabaseSettings

    return [
        ("Database (every process)", DatabaseSettings, "store.settings.DatabaseSettings"),
        ("API (`shockwave api`, `shockwave up`)", Settings, "api.settings.Settings"),
        ("Solver workers (`shockwave worker`)", SolverSettings, "solver_service.settings"),
        ("Round driver (`shockwave driver`)", DriverSettings, "solver_service.driver"),
    ]


def settings_reference(
    classes: Sequence[tuple[str, type[BaseSettings], str]] | None = None,
    app: typer.Typer | None = None,
) -> str:
    """The Markdown reference of every setting of ``classes`` (the service's by default) and,
    when ``app`` is given, of every environment variable its commands' options read. Raises
    :class:`MissingDocs` naming every setting without a meaning."""
    classes = _settings_classes() if classes is None else classes
    lines = [
        "# Configuration",
        "",
        "Every setting the service's processes read from the environment, generated from the "
        "settings classes at build time. Each is an environment variable with the prefix "
        f"`{ENV_PREFIX}`; the processes read them once, at start. The API, the solver workers "
        "and the round driver each read the database settings too.",
        "",
    ]
    missing: list[str] = []
    for title, cls, where in classes:
        try:
            meanings = setting_meanings(cls)
        except MissingDocs as error:
            missing.append(str(error))
            continue
        lines += [f"## {title}", "", f"Read by `{where}`.", ""]
        lines += ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
        for name, meaning in meanings.items():
            variable = f"`{ENV_PREFIX}{name.upper()}`"
            default = _cell(_setting_default(cls, name))
            lines.append(f"| {variable} | {default} | {_cell(meaning)} |")
        lines.append("")
    if missing:
        raise MissingDocs("; ".join(missing))
    if app is not None:
        lines += _option_variables(app)
    return "\n".join(lines)


def _option_variables(app: typer.Typer) -> list[str]:
    """The environment variables the command line's options read, with the commands."""
    root = typer.main.get_command(app)
    seen: dict[str, list[str]] = {}
    helps: dict[str, str] = {}
    for path, command in _commands(root, ("shockwave",)):
        for param in command.params:
            if isinstance(param.envvar, str):
                seen.setdefault(param.envvar, []).append(" ".join(path))
                helps.setdefault(param.envvar, _param_help(param))
    if not seen:
        return []
    lines = [
        "## Command-line options read from the environment",
        "",
        "These are options of the [command line](cli.md); the variable stands in for the option.",
        "",
        "| Variable | Commands | Meaning |",
        "| --- | --- | --- |",
    ]
    for variable in sorted(seen):
        commands = ", ".join(f"`{c}`" for c in sorted(set(seen[variable])))
        lines.append(f"| `{variable}` | {commands} | {_cell(helps[variable])} |")
    lines.append("")
    return lines


# --- the REST API -----------------------------------------------------------------------------

_METHODS = ("get", "post", "put", "patch", "delete")


def _schema_name(schema: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    return str(schema.get("type", "object"))


def api_reference(openapi: Mapping[str, Any]) -> str:
    """The Markdown reference of every operation of the OpenAPI document ``openapi``, grouped
    by tag: method and path, summary, description, parameters, body and responses. Raises
    :class:`MissingDocs` naming every operation without a summary or description."""
    groups: dict[str, list[str]] = {}
    missing: list[str] = []
    for path, item in openapi.get("paths", {}).items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            title = f"{method.upper()} {path}"
            summary = str(op.get("summary") or "")
            description = inspect.cleandoc(str(op.get("description") or ""))
            if not (summary or description):
                missing.append(title)
            lines = [f"### `{title}`", "", f"**{summary}**" if summary else "", ""]
            if description:
                lines += [description, ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| Parameter | In | Type | Meaning |", "| --- | --- | --- | --- |"]
                for p in params:
                    required = " (required)" if p.get("required") else ""
                    lines.append(
                        f"| `{p['name']}`{required} | {p.get('in', '')} | "
                        f"{_cell(_schema_name(p.get('schema', {})))} | "
                        f"{_cell(str(p.get('description', '')))} |"
                    )
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Body ({media}): `{_schema_name(content.get('schema', {}))}`", ""]
            responses = op.get("responses", {})
            if responses:
                lines += ["| Status | Meaning | Body |", "| --- | --- | --- |"]
                for status, response in responses.items():
                    schemas = [
                        _schema_name(c.get("schema", {}))
                        for c in response.get("content", {}).values()
                    ]
                    lines.append(
                        f"| {status} | {_cell(str(response.get('description', '')))} | "
                        f"{_cell(', '.join(f'`{s}`' for s in schemas))} |"
                    )
                lines.append("")
            tag = (op.get("tags") or ["other"])[0]
            groups.setdefault(str(tag), []).append("\n".join(lines))
    if missing:
        raise MissingDocs("no summary or description for: " + ", ".join(missing))
    info = openapi.get("info", {})
    lines = [
        "# REST API",
        "",
        f"Every operation of the API ({info.get('title', '')} {info.get('version', '')}), "
        "generated from its OpenAPI document at build time. A running API serves the same "
        "document at `/openapi.json`, and interactive pages at `/docs` and `/redoc`. The "
        "conventions (tokens, paging, errors, idempotency) are on the "
        "[REST API guide](../api.md).",
        "",
    ]
    for tag, ops in groups.items():
        lines += [f"## {tag}", "", *ops]
    return "\n".join(lines)


def service_openapi() -> dict[str, Any]:
    """The OpenAPI document of the API as ``shockwave api`` serves it (on a throwaway in-memory
    database: the document does not depend on the data)."""
    from api.app import create_app
    from api.settings import Settings

    return create_app(Settings(database_url="sqlite://")).openapi()


def pages() -> dict[str, str]:
    """The generated pages by their path in the site: the CLI, the settings and the API."""
    from shockwave_cli.main import app

    return {
        "reference/cli.md": cli_reference(app),
        "reference/settings.md": settings_reference(app=app),
        "reference/api.md": api_reference(service_openapi()),
    }
