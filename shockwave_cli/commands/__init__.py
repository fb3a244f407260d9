"""The ``shockwave`` subcommands and their options, one module a command group.

Each module turns options into calls of the core, the shells or the runtime and reports input
errors in one line; ``shockwave_cli.main`` assembles them into the one Typer app.
"""
