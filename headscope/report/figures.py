"""Plotly figures built from report data only (no analysis, no HTML).

- `label_map_figure(grid)`: layer x head grid coloured by label, categorical colour legend.
- `detector_figure(grid)`: one detector's scores (colours span [0, 1], or wider when a score
  such as a held-out margin falls outside), hover with the 95% CI.
- `validation_figure(rows)`: per label, the metric's change with its top heads ablated (bars) and
  with each random draw of heads (markers).
- `explorer_figure()`: the head explorer's empty frame; the page's script fills it in.
- `pattern_figure(pattern, tokens, ticks, title, key_tokens, key_ticks)`: that frame filled in
  Python with one `[query, key]` pattern, as the script fills it (the notebook helpers in
  `headscope.report.plotting`); a cross-attention map's keys have tokens of their own.
- `diff_figure(detector, diff, hover)`: a b - a score difference (compare page).
- `clear_of_toolbar(fig)`: a titled figure's title moved below plotly's toolbar (every page's
  figures pass through it, `html.page`).
- Fixed div ids: `LABEL_MAP_ID`, `detector_id(i)`, `VALIDATION_ID`, `EXPLORER_ID`; a detector's
  own section draws its figures with its own ids (`ReportSection.figures`), in the shared style
  (`headscope.detectors.section.figure_style`).

Heatmaps put heads on x and layers on y (layer 0 on top), both as integer axes, so a click's
point gives `x = head`, `y = layer`.
"""
from __future__ import annotations

import numpy as np

from ..detectors.section import FONT, figure_style as _style, plotly_text as _escape_plotly

__all__ = [
    "label_map_figure", "detector_figure", "validation_figure", "explorer_figure", "pattern_figure",
    "diff_figure", "LABEL_MAP_ID", "VALIDATION_ID", "EXPLORER_ID", "FONT", "detector_id", "clear_of_toolbar",
    "MODEBAR_PX", "TITLED_TOP",
]

LABEL_MAP_ID = "hs-label-map"
VALIDATION_ID = "hs-validation"
EXPLORER_ID = "hs-explorer"
MODEBAR_PX = 34  # the band at the top of a figure that plotly's toolbar (shown on hover) takes
TITLED_TOP = MODEBAR_PX + 30  # a titled figure's top margin: the toolbar's band, then the title


def clear_of_toolbar(fig) -> None:
    """Put a titled figure's title below the toolbar's band, just above the plot.

    plotly draws its toolbar over the top right of a figure on hover and centres the title in
    the top margin, so in a figure not much wider than its title the toolbar covered it. The top
    margin grows to `TITLED_TOP` (the height with it, so the plot keeps its size) and the title
    is anchored to the top of the plot.
    """
    if not fig.layout.title.text:
        return
    top = 100 if fig.layout.margin.t is None else fig.layout.margin.t  # plotly's default margin
    if top < TITLED_TOP:
        if fig.layout.height is not None:
            fig.layout.height += TITLED_TOP - top
        fig.layout.margin.t = TITLED_TOP
    fig.update_layout(title={"y": 1, "yref": "paper", "yanchor": "bottom", "pad": {"b": 8}})


def detector_id(index: int) -> str:
    """Div id of the `index`-th detector heatmap (ids never contain detector names)."""
    return f"hs-detector-{index}"


def label_map_figure(grid, title: str = ""):
    """Layer x head heatmap coloured by label.

    Args:
        grid: a `LabelGrid`.
        title: figure title (plotly pseudo-HTML, escaped by the caller); none by default.
    Returns:
        A plotly `go.Figure`.
    """
    import plotly.graph_objects as go

    n_layers, n_heads = grid.index.shape
    count = len(grid.categories)
    # Category i is drawn as z = count - 1 - i so the legend (a colour bar, low values at the
    # bottom) lists the categories top-down in their fixed order; one flat band per category.
    colourscale = []
    for band, colour in enumerate(reversed(grid.colours)):
        colourscale += [[band / max(count, 1), colour], [(band + 1) / max(count, 1), colour]]
    z = [[None if i < 0 else count - 1 - int(i) for i in row] for row in grid.index]
    heatmap = go.Heatmap(
        z=z, x=list(range(n_heads)), y=list(range(n_layers)), zmin=-0.5, zmax=count - 0.5,
        colorscale=colourscale or [[0, "#ffffff"], [1, "#ffffff"]], xgap=1, ygap=1,
        text=[[_escape_plotly(s) for s in row] for row in grid.short], texttemplate="%{text}", textfont={"size": 9},
        customdata=[list(row) for row in grid.hover], hovertemplate="%{customdata}<extra></extra>",
        colorbar={"title": {"text": "label"}, "tickvals": list(range(count)), "ticktext": [_escape_plotly(c) for c in reversed(grid.categories)],
                  "thickness": 14, "y": 1, "yanchor": "top", "lenmode": "pixels", "len": 22 * max(count, 1)},
    )
    fig = go.Figure(heatmap)
    _grid_layout(fig, title, n_layers, n_heads, cell=40, row=20, legend_px=170)
    fig.update_layout(height=max(fig.layout.height, 22 * count + 100))  # room for the legend
    return fig


def detector_figure(grid):
    """One detector's layer x head scores in [0, 1], titled with its quantity and threshold.

    Args:
        grid: a `DetectorGrid`.
    Returns:
        A plotly `go.Figure`.
    """
    import plotly.graph_objects as go

    n_layers, n_heads = grid.score.shape
    title = f"{grid.detector}: {grid.quantity}" + ("" if grid.threshold is None else f" (threshold {grid.threshold:g})")
    finite = grid.score[np.isfinite(grid.score)]
    low, high = min(0.0, float(finite.min(initial=0.0))), max(1.0, float(finite.max(initial=1.0)))  # margins may be < 0
    fig = go.Figure(go.Heatmap(
        z=_rounded(grid.score), x=list(range(n_heads)), y=list(range(n_layers)), zmin=low, zmax=high,
        colorscale="Blues", xgap=1, ygap=1, customdata=[list(row) for row in grid.hover],
        hovertemplate="%{customdata}<extra></extra>", colorbar={"thickness": 10, "len": 0.8},
    ))
    _grid_layout(fig, _escape_plotly(title), n_layers, n_heads, cell=18, row=12, legend_px=40)
    return fig


def validation_figure(rows):
    """Change of each label's metric with its top heads ablated, next to random draws of heads.

    Args:
        rows: `ValidationRow`s of one mode (the report passes the primary ones).
    Returns:
        A plotly `go.Figure`: one bar per label (its heads) and one marker per random draw.
    """
    import plotly.graph_objects as go

    labels = [_escape_plotly(r.label) for r in rows]
    heads = [", ".join(f"{layer}.{head}" for layer, head in r.heads) for r in rows]
    draws_x = [label for label, r in zip(labels, rows) for _ in r.random_deltas]
    draws_y = [round(d, 4) for r in rows for d in r.random_deltas]
    metrics = sorted({r.metric for r in rows} - {"icl_score"}) or ["icl_score"]
    mode = rows[0].mode if rows else ""
    fig = go.Figure([
        go.Bar(name="top heads ablated", x=labels, y=[round(r.delta, 4) for r in rows], marker_color="#d62728",
               customdata=[[h, r.baseline, r.ablated] for h, r in zip(heads, rows)],
               hovertemplate="%{x}: heads %{customdata[0]}<br>Δ %{y:.3f} (%{customdata[1]:.3f} → "
                             "%{customdata[2]:.3f})<extra></extra>"),
        go.Scatter(name="random heads ablated", x=draws_x, y=draws_y, mode="markers",
                   marker={"color": "#636363", "symbol": "diamond", "size": 8},
                   hovertemplate="%{x}: random draw Δ %{y:.3f}<extra></extra>"),
    ])
    fig.update_layout(
        title={"text": _escape_plotly(f"What breaks: {mode} ablation")},
        yaxis={"title": {"text": _escape_plotly(f"Δ {', '.join(metrics)} (ablated − unablated)")}, "zeroline": True},
        height=340, width=max(420, 80 * len(rows) + 200), margin={"l": 60, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.2}, **_style(),
    )
    return fig


def explorer_figure():
    """The explorer's frame: an empty heatmap whose data and tick labels the page's script sets."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Heatmap(z=[[0]], zmin=0, zmax=1, colorscale="Blues", colorbar={"thickness": 10},
                               hovertemplate="%{text}<br>attention %{z:.3f}<extra></extra>", text=[[""]]))
    fig.update_layout(
        width=520, height=520, margin={"l": 110, "r": 20, "t": 20, "b": 110},
        xaxis={"title": {"text": "key"}, "tickangle": -60, "tickfont": {"size": 9}, "constrain": "domain"},
        yaxis={"title": {"text": "query"}, "autorange": "reversed", "tickfont": {"size": 9}, "scaleanchor": "x"},
        **_style(),
    )
    return fig


def pattern_figure(pattern, tokens, ticks, title: str = "", key_tokens=None, key_ticks=None):
    """The explorer's frame filled with one `[query, key]` pattern, as `EXPLORER_JS` fills it.

    Args:
        pattern: `[query, key]` attention weights.
        tokens: one display string per query position for the hover (escaped for plotly's
            pseudo-HTML); the keys' too unless `key_tokens` is given.
        ticks: one shorter display string per query position for the axes.
        title: figure title (plotly pseudo-HTML, escaped by the caller); none by default.
        key_tokens, key_ticks: the same per key position, where the keys are other tokens
            (cross-attention: the encoder's).
    Returns:
        A plotly `go.Figure`.
    """
    key_tokens, key_ticks = (tokens, ticks) if key_tokens is None else (key_tokens, key_ticks)
    queries, keys = list(range(len(tokens))), list(range(len(key_tokens)))
    hover = [[f"query {i}: {q}<br>key {j}: {k}" for j, k in enumerate(key_tokens)] for i, q in enumerate(tokens)]
    fig = explorer_figure()
    fig.update_traces(z=_rounded(np.asarray(pattern, dtype=np.float64)), x=keys, y=queries, text=hover)
    fig.update_layout(xaxis=_labelled(keys, key_ticks), yaxis=_labelled(queries, ticks))
    if title:
        fig.update_layout(title={"text": title, "font": {"size": 13}}, margin={"t": 40})
    return fig


def _labelled(positions: list, ticks) -> dict:
    """At most ~32 labelled ticks on an axis; the hover names every token."""
    shown = positions[:: -(-len(positions) // 32) or 1]
    return {"tickvals": shown, "ticktext": [ticks[t] for t in shown]}

def diff_figure(detector: str, diff: np.ndarray, hover):
    """`b - a` for one detector on a red-blue scale centred on 0.

    Args:
        detector: detector name.
        diff: `[layer, head]` differences.
        hover: `[layer][head]` hover strings.
    Returns:
        A plotly `go.Figure`.
    """
    import plotly.graph_objects as go

    n_layers, n_heads = diff.shape
    fig = go.Figure(go.Heatmap(
        z=_rounded(diff), x=list(range(n_heads)), y=list(range(n_layers)), zmin=-1, zmax=1, zmid=0,
        colorscale="RdBu", reversescale=True, xgap=1, ygap=1, customdata=[list(row) for row in hover],
        hovertemplate="%{customdata}<extra></extra>", colorbar={"thickness": 10, "len": 0.8},
    ))
    _grid_layout(fig, _escape_plotly(f"{detector}: b − a"), n_layers, n_heads, cell=18, row=12, legend_px=40)
    return fig


def _grid_layout(fig, title: str, n_layers: int, n_heads: int, *, cell: int, row: int, legend_px: int) -> None:
    """Integer head/layer axes with layer 0 on top; `cell` x `row` pixels per head, within bounds.
    The top margin leaves plotly's toolbar its band (`clear_of_toolbar` places a title below it)."""
    top = TITLED_TOP if title else MODEBAR_PX
    width = max(min(max(n_heads * cell, 120), 760) + 40 + legend_px, 7 * len(title) + 30)  # title fits
    height = min(max(n_layers * row, 110), 900) + 50 + top
    fig.update_layout(
        title={"text": title, "font": {"size": 13}}, width=int(width), height=int(height),
        margin={"l": 40, "r": 10, "t": top, "b": 40},
        xaxis={"title": {"text": "head"}, "dtick": 1 if n_heads <= 16 else None, "showgrid": False, "zeroline": False},
        yaxis={"title": {"text": "layer"}, "autorange": "reversed", "dtick": 1 if n_layers <= 16 else None,
               "showgrid": False, "zeroline": False},
        **_style(),
    )


def _rounded(values: np.ndarray) -> list:
    """Nested lists with 4 decimals and None for NaN (smaller, stable JSON)."""
    return [[None if np.isnan(v) else round(float(v), 4) for v in row] for row in values]
