"""Interactive HTML reports of an analysis, and of two analyses side by side.

- `write_report(analysis, out_dir, plotlyjs=, force=)`: writes `out_dir/index.html` atomically.
- `write_report_into(analysis, folder, plotlyjs=)`: writes `index.html` into an existing folder
  (inside the caller's own `atomic_dir`, next to the analysis files).
- `rewrite_report(analysis, folder, plotlyjs=)`: re-renders `folder/index.html` in place
  (`headscope report`), atomically; a folder it cannot write is refused before rendering.
- `render_html(analysis, plotlyjs=)`: the page as a string.
- `report_data(analysis)`: the `ReportData` the page is drawn from (what tests assert on).
- `compare_data(a, b)`, `render_compare_html(a, b, plotlyjs=)`, `write_compare(a, b, out_dir, ...)`:
  label maps side by side, b - a score differences, heads that changed label.

The pipeline is data (`data.py`, `compare.py`) -> figures (`figures.py`) -> page (`html.py`).
plotly is imported only when a page is rendered.
"""
from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_dir, atomic_file
from .compare import CompareData, compare_data, render_compare_html, write_compare
from .data import ReportData, report_data
from .html import render_report

__all__ = [
    "write_report", "write_report_into", "rewrite_report", "render_html", "report_data", "ReportData",
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


def rewrite_report(analysis, folder, plotlyjs: str = "embed") -> Path:
    """Re-render `folder/index.html` from `analysis` (loaded from `folder`), atomically: a folder
    this process cannot write is refused before the page is rendered, and a failure leaves the
    old page and no temporary file.

    Returns:
        The path of `index.html`.
    """
    # The analysis folder's index.html is the page headscope renders there: always its own.
    guard = atomic_file(Path(folder) / "index.html", force=True, ours=lambda data: True)
    page = render_html(analysis, plotlyjs=plotlyjs)
    with guard as tmp:
        tmp.write_text(page, encoding="utf-8")
    return Path(folder) / "index.html"


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
