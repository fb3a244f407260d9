"""MkDocs hook (mkdocs.yml, ``hooks``): adds the reference pages rendered from the code.

:func:`shockwave_cli.reference.pages` renders the command line, the settings and the REST
API; a command, option, setting or operation without a description stops the build with the names.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from shockwave_cli.reference import pages


def on_files(files: Files, config: Any) -> Files:
    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files
