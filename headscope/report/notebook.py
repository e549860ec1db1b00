"""Rich display in Jupyter that works offline, also in nbconvert's HTML export.

- `analysis_html(analysis)`: what an `Analysis` shows as a cell's result: model, layers x heads,
  the control model, heads per label with the quantity their scores are in and the strongest
  ones (score and the control's score for the same head; heads whose label the OV qualifier
  reads with their qualifier), warnings (no control, a detector skipped), the detectors' own
  summary lines (`ReportSection.summary`), and the label map as an interactive figure.
- `analysis_text(analysis)`: the one-line `repr` of an `Analysis`.
- `figure_html(fig)`: one plotly figure as notebook HTML: a `<div>`, the figure's JSON and a
  script that draws it as soon as plotly.js is on the page.
- `reset()`: embed plotly.js again with the next figure (after clearing the output holding it).

plotly.js (~5 MB) is embedded inline once per kernel session, with the first figure; later
figures find `window.Plotly` on the page and wait for it if their output comes first on the page
(cells run out of order). In Colab each output is its own frame, so there every figure embeds it.
"""
from __future__ import annotations

import html
import json
import sys
import uuid

from .plotting import plot_labels
from .data import header_fields, label_grid, report_warnings, top_heads
from .detector_sections import section_data, section_summary
from .html import Raw, plotlyjs_tag, script_json, table

__all__ = ["analysis_html", "analysis_text", "figure_html", "reset", "TOP_HEADS"]

TOP_HEADS = 3  # strongest heads listed per label in the summary
_state = {"plotlyjs_sent": False}

# Draws the figure whose JSON sits in `<script id="{id}-figure">` into `<div id="{id}">`,
# polling for plotly.js for up to 15 s (the output that embeds it may come later on the page).
_DRAW_JS = """(function () {
  var id = "%s", tries = 0;
  function draw() {
    var el = document.getElementById(id);
    if (!el) return;
    if (window.Plotly) {
      var fig = JSON.parse(document.getElementById(id + "-figure").textContent);
      window.Plotly.newPlot(el, fig.data, fig.layout, {displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]});
    } else if (++tries < 300) {
      setTimeout(draw, 50);
    } else {
      el.textContent = "plotly.js is not on this page: run headscope.report.notebook.reset() and show the figure again.";
    }
  }
  draw();
})();"""


def reset() -> None:
    """Make the next figure embed plotly.js again (e.g. after clearing the output that held it)."""
    _state["plotlyjs_sent"] = False


def figure_html(fig) -> str:
    """One plotly figure as a notebook output, drawn offline.

    Args:
        fig: a plotly `go.Figure`.
    Returns:
        HTML: plotly.js inline (first figure of the session, or every figure in Colab), a
        `<div>` with a fresh id, the figure as JSON and the script that draws it.
    """
    import plotly.io as pio


    fig_id = f"hs-nb-{uuid.uuid4().hex[:12]}"  # unique across kernel restarts: old outputs stay on the page
    parts = []
    if not _state["plotlyjs_sent"] or "google.colab" in sys.modules:
        parts.append(plotlyjs_tag("embed"))
        _state["plotlyjs_sent"] = True
    figure_json = script_json(json.loads(pio.to_json(fig, validate=False)))
    parts += [
        f"<div id=\"{fig_id}\" class=\"headscope-figure\"></div>",
        f"<script type=\"application/json\" id=\"{fig_id}-figure\">{figure_json}</script>",
        f"<script>{_DRAW_JS % fig_id}</script>",
    ]
    return "\n".join(parts)


def analysis_html(analysis) -> str:
    """An analysis's summary and label map, as a notebook cell shows it.

    Args:
        analysis: a `headscope.analysis.Analysis`.
    Returns:
        HTML (every text from the analysis escaped).
    """

    fields = {f.name: f.value for f in header_fields(analysis.meta)}
    grid = label_grid(analysis)
    counts = {c: sum(row.count(c) for row in grid.labels) for c in grid.categories}
    strongest: dict = {}
    for t in top_heads(analysis, TOP_HEADS):
        strongest.setdefault(t.label, []).append(t)
    rows = []
    for label, colour in zip(grid.categories, grid.colours):
        heads = strongest.get(label, [])
        per_head = label == "mixed" or len({t.quantity for t in heads}) > 1
        unit = "" if not heads else ("clearest detector's score" if per_head else heads[0].quantity)
        rows.append([_swatch(label, colour), counts[label], unit,
                     ", ".join(f"L{t.layer} H{t.head} {t.text(per_head)}{t.ov_text()}" for t in heads)])
    detectors = ", ".join(analysis.detectors)
    return "\n".join([
        "<div class=\"headscope-analysis\">",
        "<style>.headscope-analysis th, .headscope-analysis td { text-align: left; }</style>",
        f"<p><b>headscope analysis</b> of <code>{html.escape(fields['Model'])}</code> "
        f"({html.escape(fields['Family'])}): {html.escape(fields['Heads'])}</p>",
        f"<p>Detectors: {html.escape(detectors)}. Control: {html.escape(fields['Control'])}</p>",
        *[f"<p><b>Warning:</b> {html.escape(w)}</p>" for w in report_warnings(analysis.meta)],
        table(["label", "heads", "quantity", f"strongest (up to {TOP_HEADS}; control in brackets)"], rows),
        *[f"<p>{html.escape(line)}</p>" for line in section_summary(section_data(analysis))],
        figure_html(plot_labels(analysis)),
        "</div>",
    ])


def analysis_text(analysis) -> str:
    """`Analysis(model=..., 30 layers x 9 heads, detectors=[...], labels={...})` on one line."""
    counts = analysis.labels["label"].astype(str).value_counts()
    labels = ", ".join(f"{label}: {int(n)}" for label, n in counts.items())
    return (f"Analysis(model={analysis.meta.get('model', '?')!r}, {analysis.n_layers} layers x {analysis.n_heads} heads, "
            f"detectors={analysis.detectors}, labels={{{labels}}})")


def _swatch(label: str, colour: str):
    """A label with its colour square, as a trusted `report.html.table` cell."""

    return Raw(f"<span style=\"display:inline-block;width:11px;height:11px;margin-right:6px;"
               f"background:{html.escape(colour)};border:1px solid #999\"></span>{html.escape(label)}")
