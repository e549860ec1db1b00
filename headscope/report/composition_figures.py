"""Plotly figures of the report's composition section, built from `CompositionData` only.

- `composition_figure(cmap)`: one kind's z as a `[source head, destination head]` heatmap, heads
  named "layer.head" in layer order (source on y, earlier layers on top; destination on x).
- `composition_figures(data)`: `(div_id, figure)` per kind; fixed ids `composition_id(kind)`.
"""
from __future__ import annotations

import numpy as np

from .composition_data import KIND_NAMES
from .figures import _style

__all__ = ["composition_figure", "composition_figures", "composition_id"]

Z_FLOOR = 5.0  # the colour scale spans at least [-5, 5] baseline spreads


def composition_id(kind: str) -> str:
    """Div id of one kind's heatmap."""
    return f"hs-composition-{kind}"


def composition_figures(data) -> list:
    """`(div_id, figure)` for each kind's heatmap."""
    return [(composition_id(m.kind), composition_figure(m)) for m in data.maps]


def composition_figure(cmap):
    """One kind's z grid as a heatmap (NaN cells blank: not an earlier -> later pair).

    Args:
        cmap: a `CompositionMap`.
    Returns:
        A plotly `go.Figure`.
    """
    import plotly.graph_objects as go

    names = [f"{layer}.{head}" for layer, head in cmap.heads]
    finite = cmap.z[np.isfinite(cmap.z)]
    top = max(Z_FLOOR, float(np.percentile(np.abs(finite), 99.5))) if finite.size else Z_FLOOR
    # one decimal: about 0.4 MB of JSON a kind at SmolLM2's 270 heads
    z = [[None if not np.isfinite(v) else round(float(v), 1) for v in row] for row in cmap.z]
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, zmin=-top, zmax=top, zmid=0, colorscale="RdBu", reversescale=True,
        hovertemplate="from head %{y} to head %{x}<br>z %{z}<extra></extra>",
        colorbar={"thickness": 10, "len": 0.8, "title": {"text": "z"}},
    ))
    size = int(min(max(14 * len(names), 260), 720))
    fig.update_layout(
        title={"text": f"{KIND_NAMES.get(cmap.kind, cmap.kind)}: z against random matrices "
                       f"(baseline {cmap.baseline:.3f} ± {cmap.baseline_std:.3f})", "font": {"size": 13}},
        width=size + 110, height=size + 90, margin={"l": 60, "r": 10, "t": 40, "b": 50},
        xaxis={"title": {"text": "destination head (layer.head)"}, "type": "category", "showgrid": False},
        yaxis={"title": {"text": "source head"}, "type": "category", "autorange": "reversed", "showgrid": False},
        **_style(),
    )
    return fig
