"""Plotly figures of the report's geometry section, built from `GeometryData` only.

- `geometry_map_figure(data, grid)`: every head on the MDS map of attention-pattern
  similarity, one trace per label in the label map's colours (`grid`: the `LabelGrid`), marker
  size by importance; each point carries `customdata = [layer, head]`, so a click opens the head
  in the explorer (`EXPLORER_JS`).
- `importance_figure(data)`: importance as a layer x head heatmap (click a cell: the explorer);
  a hybrid's layers without attention are blank rows, as in the label map.
- `pruning_figure(data)`: loss vs heads removed, importance order against each random order,
  with the +10% line.
- Fixed div ids: `GEOMETRY_MAP_ID`, `IMPORTANCE_ID`, `PRUNING_ID`.
"""
from __future__ import annotations

import numpy as np

from .figures import _escape_plotly, _grid_layout, _rounded, _style
from .geometry_data import LOSS_RISE

__all__ = ["geometry_map_figure", "importance_figure", "pruning_figure", "geometry_figures",
           "GEOMETRY_MAP_ID", "IMPORTANCE_ID", "PRUNING_ID"]

GEOMETRY_MAP_ID = "hs-geometry-map"
IMPORTANCE_ID = "hs-importance"
PRUNING_ID = "hs-pruning"
UNLABELLED = "#bdbdbd"


def geometry_figures(data, grid) -> list:
    """`(div_id, figure)` pairs for the section: the map, and importance and pruning when measured."""
    figs = [(GEOMETRY_MAP_ID, geometry_map_figure(data, grid))]
    if data.importance is not None:
        figs.append((IMPORTANCE_ID, importance_figure(data)))
    if data.curve:
        figs.append((PRUNING_ID, pruning_figure(data)))
    return figs


def _sizes(points) -> list:
    score = np.array([p.importance for p in points], dtype=float)
    top = np.nanmax(score) if np.isfinite(score).any() else 0.0
    if top <= 0:
        return [10.0] * len(points)
    return [round(7.0 + 17.0 * float(s) / top, 2) if np.isfinite(s) else 7.0 for s in score]


def geometry_map_figure(data, grid):
    """The MDS map, one scatter trace per label present (legend order and colours of `grid`).

    Args:
        data: a `GeometryData`.
        grid: the report's `LabelGrid` (for the label colours).
    Returns:
        A plotly `go.Figure`; each point's `customdata` is `[layer, head]`.
    """
    import plotly.graph_objects as go

    sizes = dict(zip(((p.layer, p.head) for p in data.points), _sizes(data.points)))
    order = list(grid.categories) + sorted({p.label for p in data.points} - set(grid.categories))
    traces = []
    for label in order:
        members = [p for p in data.points if p.label == label]
        if not members:
            continue
        colour = grid.colours[grid.categories.index(label)] if label in grid.categories else UNLABELLED
        traces.append(go.Scatter(
            name=_escape_plotly(label or "no label"), x=[round(p.x, 5) for p in members],
            y=[round(p.y, 5) for p in members], mode="markers",
            marker={"color": colour, "size": [sizes[(p.layer, p.head)] for p in members],
                    "line": {"color": "#333", "width": 0.6}},
            customdata=[[p.layer, p.head] for p in members], hovertext=[p.hover for p in members],
            hovertemplate="%{hovertext}<extra></extra>",
        ))
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": "Heads by attention-pattern similarity (classical MDS of √JS; size: importance)",
               "font": {"size": 13}},
        width=640, height=520, margin={"l": 50, "r": 10, "t": 40, "b": 40}, hovermode="closest",
        xaxis={"title": {"text": "MDS 1"}, "zeroline": False},
        yaxis={"title": {"text": "MDS 2"}, "zeroline": False, "scaleanchor": "x"},  # distances keep their meaning
        legend={"title": {"text": "label"}}, **_style(),
    )
    return fig


def importance_figure(data):
    """Importance `[layer, head]` as a heatmap (heads on x, layers on y, layer 0 on top)."""
    import plotly.graph_objects as go

    n_layers, n_heads = data.importance.shape
    name = data.importance_kind.replace("_", " ")
    hover = [[f"<b>layer {layer} head {head}</b><br>{name} {data.importance[layer, head]:.3g}"
              if np.isfinite(data.importance[layer, head]) else f"<b>layer {layer}</b>: no attention"
              for head in range(n_heads)] for layer in range(n_layers)]
    fig = go.Figure(go.Heatmap(
        z=_rounded(data.importance), x=list(range(n_heads)), y=list(range(n_layers)), colorscale="Reds",
        xgap=1, ygap=1, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        colorbar={"thickness": 10, "len": 0.8},
    ))
    _grid_layout(fig, f"Head {name} (Michel et al. 2019)", n_layers, n_heads, cell=18, row=12, legend_px=40)
    return fig


def pruning_figure(data):
    """Probe loss vs heads removed: importance order (least important first) and random orders."""
    import plotly.graph_objects as go

    traces = []
    for line in data.curve:
        first = line.order == "importance"
        name = "importance order" if first else f"random order (seed {line.seed})"
        traces.append(go.Scatter(
            name=name, x=list(line.removed), y=[round(v, 5) for v in line.loss], mode="lines+markers",
            line={"color": "#d62728" if first else "#9e9e9e", "width": 2.5 if first else 1.2,
                  "dash": "solid" if first else "dot"},
            marker={"size": 5}, hovertemplate=f"{name}<br>%{{x}} heads removed: loss %{{y:.4f}}<extra></extra>",
        ))
    removed = [n for line in data.curve for n in line.removed]
    limit = round(data.baseline_loss * (1 + LOSS_RISE), 5)
    traces.append(go.Scatter(name=f"+{LOSS_RISE:.0%} loss", x=[min(removed), max(removed)], y=[limit, limit],
                             mode="lines", line={"color": "#333", "dash": "dash", "width": 1}, hoverinfo="skip"))
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": "Pruning curve: loss as heads are zero-ablated", "font": {"size": 13}},
        width=640, height=420, margin={"l": 60, "r": 10, "t": 40, "b": 40},
        xaxis={"title": {"text": "heads removed"}}, yaxis={"title": {"text": "next-token loss (nats)"}},
        legend={"orientation": "h", "y": -0.2}, **_style(),
    )
    return fig
