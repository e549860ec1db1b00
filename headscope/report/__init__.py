"""Interactive HTML reports of an analysis, and of two analyses side by side.

- `write_report(analysis, out_dir, plotlyjs=, force=)`: writes `out_dir/index.html` atomically.
- `write_report_into(analysis, folder, plotlyjs=)`: writes `index.html` into an existing folder
  (inside the caller's own `atomic_dir`, next to the analysis files).
- `render_html(analysis, plotlyjs=)`: the page as a string.
- `report_data(analysis)`: the `ReportData` the page is drawn from (what tests assert on).
- `compare_data(a, b)`, `render_compare_html(a, b, plotlyjs=)`, `write_compare(a, b, out_dir, ...)`:
  label maps side by side, b - a score differences, heads that changed label.

The pipeline is data (`data.py`, `compare.py`) -> figures (`figures.py`) -> page (`html.py`).
plotly is imported only when a page is rendered.
"""
from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_dir
from .compare import CompareData, compare_data, render_compare_html, write_compare
from .data import ReportData, report_data
from .html import render_report

__all__ = [
    "write_report", "write_report_into", "render_html", "report_data", "ReportData",
    "compare_data", "render_compare_html", "write_compare", "CompareData",
]


def render_html(analysis, plotlyjs: str = "embed") -> str:
    """The report page of an analysis.

    Args:
        analysis: a `headscope.analysis.Analysis`.
        plotlyjs: "embed" (plotly.js inline, works offline) or "cdn" (a `<script src>`, small file).
    Returns:
        The page's HTML; identical for identical analyses except the line with `meta["created"]`.
    """
    return render_report(report_data(analysis), plotlyjs=plotlyjs)


def write_report_into(analysis, folder, plotlyjs: str = "embed") -> Path:
    """Write `index.html` into an existing folder (no atomicity of its own).

    Args:
        analysis: a `headscope.analysis.Analysis`.
        folder: an existing folder, e.g. the temporary one of `headscope.analysis.atomic_dir`.
        plotlyjs: "embed" or "cdn".
    Returns:
        The path of `index.html`.
    """
    path = Path(folder) / "index.html"
    path.write_text(render_html(analysis, plotlyjs=plotlyjs), encoding="utf-8")
    return path


def write_report(analysis, out_dir, *, plotlyjs: str = "embed", force: bool = False) -> Path:
    """Write the report to `out_dir/index.html`, atomically (a failed render leaves nothing).

    Args:
        analysis: a `headscope.analysis.Analysis`.
        out_dir: the folder to create; must not exist unless `force`.
        plotlyjs: "embed" or "cdn".
        force: replace an existing folder (only once the new one is complete).
    Returns:
        The path of `index.html`.
    Raises:
        HeadscopeError: `out_dir` exists and not `force`, or `plotlyjs` is unknown.
    """
    with atomic_dir(out_dir, force=force) as tmp:
        write_report_into(analysis, tmp, plotlyjs=plotlyjs)
    return Path(out_dir) / "index.html"
