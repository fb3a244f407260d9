"""``shockwave simulate --report``: one self-contained HTML page with the comparison table and
every plot of the run (the PNGs embedded as data URIs: the page opens anywhere, offline, and
can be mailed as one file)."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("makespan_s", "makespan (s)", "{:,.0f}"),
    ("makespan_over_lower_bound", "makespan / bound", "{:.2f}"),
    ("avg_jct_s", "avg JCT (s)", "{:,.0f}"),
    ("utilization", "utilization", "{:.1%}"),
    ("worst_ftf", "worst FTF", "{:.2f}"),
    ("unfair_fraction", "unfair share", "{:.1%}"),
    ("jobs_completed", "jobs done", "{}"),
)
"""(metrics.json key, column title, format) of the page's table."""

TENANT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("entitled_gpu_s", "entitled (GPU-h)", "{:,.1f}"),
    ("received_gpu_s", "received (GPU-h)", "{:,.1f}"),
    ("worst_hour_ratio", "worst hour", "{:.2f}"),
    ("jobs", "jobs", "{}"),
    ("avg_jct_s", "avg JCT (s)", "{:,.0f}"),
    ("worst_ftf", "worst FTF in tenant", "{:.2f}"),
)
"""(key of a tenant's figures in metrics.json, column title, format) of the tenants' table;
GPU-seconds are shown in GPU-hours."""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; }
th, td { border-bottom: 1px solid #ccc; padding: 0.3em 0.8em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin-bottom: 1.5em; }
"""


def write_html_report(
    path: Path, title: str, records: Sequence[Mapping[str, Any]], images: Sequence[Path]
) -> None:
    """Write the page: ``records`` (metrics.json's objects) as a table, then ``images`` (the
    files that exist, in order) with their file names as captions."""
    rows = []
    for record in records:
        cells = []
        for key, _, form in COLUMNS:
            value = record.get(key)
            cells.append("-" if value is None else html.escape(form.format(value)))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{html.escape(name)}</th>" for _, name, _ in COLUMNS)
    tenants = _tenant_table(records)
    figures = []
    for image in images:
        if image.is_file():
            data = base64.b64encode(image.read_bytes()).decode("ascii")
            figures.append(
                f"<h2>{html.escape(image.stem)}</h2>"
                f'<img alt="{html.escape(image.name)}" src="data:image/png;base64,{data}">'
            )
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table><thead><tr>{head}</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        + tenants
        + "".join(figures)
        + "</body></html>\n"
    )
    path.write_text(page, encoding="utf-8")


def _tenant_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The tenants' table (policy, tenant, :data:`TENANT_COLUMNS`, the policy's worst tenant
    ratio and Jain's index), or "" when no run had more than one tenant."""
    if not any(len(record.get("tenants") or {}) > 1 for record in records):
        return ""
    titles = ["policy", "tenant", *(name for _, name, _ in TENANT_COLUMNS), "worst tenant", "Jain"]
    rows = []
    for record in records:
        for i, (tenant, figures) in enumerate((record.get("tenants") or {}).items()):
            cells = [str(record.get("policy", "")) if i == 0 else "", tenant or "(default)"]
            for key, _, form in TENANT_COLUMNS:
                value = figures.get(key)
                if value is not None and key.endswith("_gpu_s"):
                    value = value / 3600.0
                cells.append("-" if value is None else form.format(value))
            for key in ("worst_tenant_ratio", "tenant_jain"):
                value = record.get(key)
                cells.append("" if i or value is None else f"{value:.3f}")
            rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{html.escape(t)}</th>" for t in titles)
    return (
        f"<h2>Tenants</h2><table><thead><tr>{head}</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
