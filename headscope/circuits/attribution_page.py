"""The page of an `AttributionRun`: data -> figures -> HTML.

- `page_data(run)` -> `PageData`: the effect grid of the main method (exact where it ran, else
  AtP*, else AtP), the DLA components with the largest effects, each method's estimates against
  exact patching, and the top heads.
- `effect_figure`, `dla_figure`, `scatter_figure`: plotly figures of that data (fixed div ids).
- `render_attribution_html(run, plotlyjs="embed")`: the page, with the report's head explorer
  (`headscope.report.script.EXPLORER_JS`) on the task's own prompts: a click on the effect map,
  a scatter point or a head button shows that head's pattern.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

from ..detectors.section import figure_style, plotly_text
from ..report.figures import EXPLORER_ID, LABEL_MAP_ID, explorer_figure
from ..report.html import example_payload, figure_div, head_button, header_list, page, table
from ..report.data import HeaderField
from ..report.script import EXPLORER_JS

__all__ = ["PageData", "page_data", "effect_figure", "dla_figure", "scatter_figure", "render_attribution_html",
           "EFFECT_ID", "DLA_ID", "SCATTER_ID"]

EFFECT_ID = LABEL_MAP_ID  # the explorer highlights the chosen head on this map
DLA_ID = "hs-dla"
SCATTER_ID = "hs-attribution-scatter"
TOP = 15  # heads in the table
BARS = 25  # DLA components in the bar chart
PREFERENCE = ("exact", "atp*", "atp")


@dataclass
class PageData:
    """What the page shows (module docstring); grids are `[layer][head]` lists (None: no head)."""

    main: str
    grid: list
    dla: list  # (name, effect, lo, hi), largest |effect| first
    scatter: dict  # method -> [(layer, head, exact, estimate)]
    top: list  # rows: (layer, head, {method: (effect, lo, hi)}, dla, label)
    labels: list  # [layer][head] label strings ("" without an analysis)


def _name(row) -> str:
    if row.kind == "head":
        return f"L{int(row.layer)} H{int(row.head)}"
    if row.kind in ("embed",) or (row.kind == "bias" and _missing(row.layer)):
        return "embed" if row.kind == "embed" else "final bias"
    return f"{row.kind} L{int(row.layer)}"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "<NA>"


def page_data(run) -> PageData:
    """The page's data from a run's tables."""
    main = next(m for m in PREFERENCE if m in run.tables)
    grid = [[None] * run.n_heads for _ in range(run.n_layers)]
    for row in run.tables[main].itertuples():
        if row.head < run.n_heads:
            grid[int(row.layer)][int(row.head)] = float(row.effect)
    dla = sorted(((_name(r), float(r.effect), float(r.lo), float(r.hi)) for r in run.dla.itertuples()),
                 key=lambda item: -abs(item[1]))[:BARS]
    scatter = {}
    if "exact" in run.tables:
        exact = {(int(r.layer), int(r.head)): float(r.effect) for r in run.tables["exact"].itertuples()}
        for method, frame in run.tables.items():
            if method != "exact":
                scatter[method] = [(int(r.layer), int(r.head), exact[(int(r.layer), int(r.head))], float(r.effect))
                                   for r in frame.itertuples()]
    labels = [[""] * run.n_heads for _ in range(run.n_layers)]
    if run.labels is not None:
        for row in run.labels.itertuples():
            if int(row.layer) < run.n_layers and int(row.head) < run.n_heads:
                labels[int(row.layer)][int(row.head)] = str(row.label)
    head_dla = {(int(r.layer), int(r.head)): float(r.effect) for r in run.dla.itertuples() if r.kind == "head"}
    ranked = run.tables[main].reindex(run.tables[main].magnitude.sort_values(ascending=False).index)
    top = []
    for row in ranked.head(TOP).itertuples():
        key = (int(row.layer), int(row.head))
        per_method = {}
        for method, frame in run.tables.items():
            match = frame[(frame.layer == key[0]) & (frame["head"] == key[1])]
            if len(match):
                first = match.iloc[0]
                per_method[method] = (float(first.effect), float(first.lo), float(first.hi))
        top.append((key[0], key[1], per_method, head_dla.get(key), labels[key[0]][key[1]] if key[0] < run.n_layers else ""))
    return PageData(main, grid, dla, scatter, top, labels)


def effect_figure(data: PageData, point: str, direction: str):
    """Layer x head map of the main method's effects, 0 white, clickable into the explorer."""
    import plotly.graph_objects as go

    limit = max((abs(v) for row in data.grid for v in row if v is not None), default=1.0) or 1.0
    fig = go.Figure(go.Heatmap(
        z=data.grid, x=list(range(len(data.grid[0]))), y=list(range(len(data.grid))), colorscale="RdBu",
        zmin=-limit, zmax=limit, colorbar={"title": {"text": "effect"}, "thickness": 12},
        customdata=data.labels, hovertemplate="layer %{y} head %{x}<br>effect %{z:.3f}<br>%{customdata}<extra></extra>"))
    what = "recovered" if direction == "denoising" else "lost"
    fig.update_layout(title={"text": plotly_text(f"{data.main}: fraction of the gap {what}, patching hook_{point}"),
                             "y": 0.97}, xaxis={"title": {"text": "head"}, "dtick": 1},
                      yaxis={"title": {"text": "layer"}, "autorange": "reversed", "dtick": 1},
                      height=max(320, 18 * len(data.grid)),
                      margin={"t": 70}, **figure_style())
    return fig


def dla_figure(data: PageData):
    """The components with the largest direct effects on the logit difference, with 95% intervals."""
    import plotly.graph_objects as go

    names = [plotly_text(name) for name, *_ in data.dla]
    effects = [effect for _, effect, _, _ in data.dla]
    fig = go.Figure(go.Bar(x=effects, y=names, orientation="h",
                           error_x={"type": "data", "symmetric": False,
                                    "array": [hi - e for _, e, _, hi in data.dla],
                                    "arrayminus": [e - lo for _, e, lo, _ in data.dla]},
                           marker={"color": ["#2166ac" if e > 0 else "#b2182b" for e in effects]},  # as the map
                           hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_layout(title={"text": "Direct logit attribution (largest components)", "y": 0.97},
                      xaxis={"title": {"text": "direct effect on the logit difference"}},
                      yaxis={"autorange": "reversed"}, height=max(320, 22 * len(names)), margin={"t": 70},
                      **figure_style())
    return fig


def scatter_figure(data: PageData):
    """Each method's estimate against exact patching, one point per head (click: the explorer)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    values = [v for points in data.scatter.values() for _, _, x, y in points for v in (x, y)]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", line={"color": "#999", "dash": "dot"},
                             name="estimate = exact", hoverinfo="skip"))
    for method, points in data.scatter.items():
        fig.add_trace(go.Scatter(x=[p[2] for p in points], y=[p[3] for p in points], mode="markers", name=method,
                                 customdata=[[p[0], p[1]] for p in points],
                                 hovertemplate="layer %{customdata[0]} head %{customdata[1]}<br>exact %{x:.3f}<br>"
                                               + plotly_text(method) + " %{y:.3f}<extra></extra>"))
    fig.update_layout(title={"text": "Attribution against exact patching", "y": 0.97},
                      xaxis={"title": {"text": "exact effect"}}, yaxis={"title": {"text": "estimate"}}, height=420,
                      margin={"t": 70}, **figure_style())
    return fig


def _interval(value) -> str:
    effect, lo, hi = value
    return f"{effect:.3f} [{lo:.3f}, {hi:.3f}]"


def render_attribution_html(run, plotlyjs: str = "embed") -> str:
    """The whole page of a run (module docstring)."""
    data = page_data(run)
    meta = run.meta
    first = run.tables[data.main].attrs
    fields = [HeaderField("model", str(run.model)), HeaderField("task", f"{meta['task']} ({meta['n']} prompt pairs)"),
              HeaderField("metric", str(meta["metric"])),
              HeaderField("clean / corrupted", f"{first['clean_metric']:.3f} / {first['corrupted_metric']:.3f}"),
              HeaderField("patched", f"hook_{meta['point']}, {meta['direction']}"),
              HeaderField("passes", "; ".join(f"{m}: {t.attrs['passes']['forward']:g} forward, "
                                               f"{t.attrs['passes']['backward']:g} backward"
                                               for m, t in run.tables.items()))]
    methods = list(run.tables)
    rows = [[head_button(layer, head), *[(_interval(per[m]) if m in per else "") for m in methods],
             None if dla is None else dla, label]
            for layer, head, per, dla, label in data.top]
    figs = [(EFFECT_ID, effect_figure(data, meta["point"], meta["direction"])), (DLA_ID, dla_figure(data)),
            (EXPLORER_ID, explorer_figure())]
    scatter = ""
    if data.scatter:
        figs.append((SCATTER_ID, scatter_figure(data)))
        scatter = "<section><h2>Attribution against exact patching</h2>" + figure_div(SCATTER_ID) + "</section>"
    options = "".join(f"<option value=\"{i}\">prompt #{e.index}: {html.escape(''.join(e.tokens)[:60])}</option>"
                      for i, e in enumerate(run.examples))
    best = data.top[0][:2] if data.top else (0, 0)
    body = "\n".join([
        "<header><h1>" + html.escape(f"headscope attribute: {run.model}, {meta['task']}") + "</h1>",
        header_list(fields), "<p id=\"hs-error\"></p></header>",
        "<div class=\"layout\"><div class=\"main\">",
        "<section><h2>Which heads the task needs</h2>", figure_div(EFFECT_ID), "</section>",
        "<section><h2>Top heads</h2>",
        table(["head", *[f"{m} effect [95% CI]" for m in methods], "direct effect (DLA)", "label"], rows),
        "</section>",
        "<section><h2>Direct logit attribution</h2>", figure_div(DLA_ID), "</section>", scatter, "</div>",
        "<aside><section id=\"explorer\"><h2>Head explorer</h2>",
        f"<label>Prompt <select id=\"hs-example\">{options}</select></label>",
        f"<p id=\"hs-explorer-title\">layer {best[0]} head {best[1]}</p>", figure_div(EXPLORER_ID),
        "<p class=\"hint\" id=\"hs-explorer-note\">Query on y, key on x. Click the effect map, a scatter point or "
        "a head button.</p></section></aside></div>",
    ])
    payload = {"explorer": EXPLORER_ID, "labelMap": EFFECT_ID, "clickable": [EFFECT_ID] + ([SCATTER_ID] if scatter else []),
               "n_layers": run.n_layers, "n_heads": run.n_heads, "initial": list(best), "labels": data.labels,
               "passing": [[""] * run.n_heads for _ in range(run.n_layers)],
               "examples": [example_payload(e) for e in run.examples]}
    return page(f"headscope attribute: {run.model}", body, figs, plotlyjs, json_blocks={"hs-explorer-data": payload},
                scripts=[EXPLORER_JS])

