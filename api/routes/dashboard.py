"""The web dashboard at ``/``: a static page and its script, shipped in the package (no build
step, nothing loaded from another host). The page calls the same /v1 API as every client with the
token the user types in (kept in the browser's session storage: for the tab's session only); in
open mode it needs none. Its Content-Security-Policy allows scripts and styles from this origin
only (api.security_headers).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(__file__).resolve().parent.parent / "dashboard"
"""index.html, dashboard.js, dashboard.css, favicon.svg."""


def install(app: FastAPI) -> None:
    """Serve the page at ``/`` and its assets under ``/static/dashboard``."""

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(ASSETS / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static/dashboard", StaticFiles(directory=ASSETS), name="dashboard")
