"""What a detector adds to the report, and the writer's building blocks it draws with.

- `ReportSection`: the hook a `Detector` carries as `Detector.report`. The report asks every
  detector with one (those `meta["detectors"]` records, then the other registered ones) for
  its section; report code names no detector. Override what the section needs:
      data(analysis)          -> its plain values (a NamedTuple; tests assert on them)
      figures(data)           -> [(div_id, plotly figure)], fixed div ids
      html(data, kit)         -> its `<section>` ("" when it has nothing to show)
      header(meta)            -> [(name, value)] lines for the page header
      warnings(meta)          -> sentences the page, notebook and CLI show prominently
      summary(data)           -> lines the CLI and notebook summaries add
      plot(source)            -> its figure for a notebook (`headscope.report.plotting.plot_section`)
  The method section's text is `Detector.report_rule`, recorded in `meta["detectors"]`.
- `Kit`: the HTML writer's building blocks (table, head buttons, figure divs), handed to a
  section so that detectors never import the report package (`headscope.report.html` builds it).
- `figure_style()`, `plotly_text(text)`: the look every report figure shares and plotly's
  escaping, for the report's figures and the sections' alike.
- `analysis_table(analysis, name)`: one of an analysis's tables by name, None when absent.
- `cell_text`, `cell_number`, `cell_flag`: cells of frames that may come back from CSV
  (`Analysis.load`: booleans as text, missing cells as NaN).
"""
from __future__ import annotations

import html
import math
from typing import Any, Callable, NamedTuple

from ..errors import HeadscopeError

__all__ = ["ReportSection", "Kit", "figure_style", "plotly_text", "FONT", "analysis_table", "cell_text",
           "cell_number", "cell_flag", "cell_missing"]

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


class Kit(NamedTuple):
    """The HTML writer's building blocks (`headscope.report.html` builds it).

    Attributes:
        table: `(headers, rows) -> str`, an HTML table; cells escaped unless `raw`, floats to 3 decimals.
        raw: `str -> Raw`, trusted HTML `table` inserts as is (build it from escaped parts only).
        head_button: `(layer, head) -> Raw`, a button that opens the head in the explorer.
        figure_div: `div_id -> str`, the empty `<div>` a figure is drawn into.
    """

    table: Callable
    raw: Callable
    head_button: Callable
    figure_div: Callable


class ReportSection:
    """A detector's own part of the report; every hook defaults to adding nothing."""

    def data(self, analysis) -> Any:
        """The section's plain values read from `analysis` (its tables and `meta`); its fields
        read as attributes of `headscope.report.ReportData` (`data.syntax_best`)."""
        return None

    def figures(self, data) -> list:
        """`(div_id, plotly figure)` pairs drawn from `data`; clicking a point whose
        `customdata` starts with `[layer, head]` opens that head."""
        return []

    def html(self, data, kit: Kit) -> str:
        """The section's HTML (a `<section>` with a fixed id, `kit.figure_div` for each figure)."""
        return ""

    def header(self, meta: dict) -> list:
        """`(name, value)` lines of the page header, after the control model."""
        return []

    def warnings(self, meta: dict) -> list:
        """Sentences shown prominently (page, notebook and CLI)."""
        return []

    def summary(self, data) -> list:
        """Lines the CLI and notebook summaries add after the labels."""
        return []

    def plot(self, source):
        """The section's figure for a notebook, from an `Analysis` (or the detector's own result)."""
        raise HeadscopeError(f"{type(self).__name__} draws no figure of its own")


def figure_style() -> dict:
    """Layout keywords of every report figure: a small inline template (plotly's default one
    adds ~7 KB of JSON to every figure).

    It must be a Template object: `update_layout(template=dict)` merges the dict into the
    default template instead of replacing it.
    """
    import plotly.graph_objects as go

    return {"template": go.layout.Template(layout={"font": {"family": FONT, "size": 11}}), "paper_bgcolor": "white",
            "plot_bgcolor": "white", "hoverlabel": {"align": "left"}}


def plotly_text(text: str) -> str:
    """Text escaped for plotly's pseudo-HTML (titles, tick labels, hover)."""
    return html.escape(text, quote=False)


def analysis_table(analysis, name: str):
    """`analysis.tables[name]`, else the attribute of that name (an `Analysis` without `tables`);
    None when the analysis has no such table."""
    tables = getattr(analysis, "tables", None)
    if isinstance(tables, dict) and name in tables:
        return tables[name]
    return getattr(analysis, name, None)


def cell_missing(value: Any) -> bool:
    """None in JSON, NaN in CSV."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell_text(value: Any) -> str:
    """A CSV cell as text ("" for a missing one)."""
    return "" if cell_missing(value) else str(value)


def cell_number(value: Any) -> float:
    """A float cell (NaN for a missing one: None in JSON, empty in CSV)."""
    return math.nan if cell_missing(value) else float(value)


def cell_flag(value: Any) -> bool:
    """A bool cell, also when read back from CSV as text."""
    return value.strip().lower() == "true" if isinstance(value, str) else bool(value)
