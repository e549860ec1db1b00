"""The page of a `KVEvaluation`: data -> figures -> HTML.

- `curve_data(evaluation)` -> `{length: [CurveSeries]}`: per prompt length, one series per
  condition kind (headscope, reverse, each random draw, the random median, streaming, full),
  as (KV share of the full cache, needle accuracy, loss) points ordered by keep.
- `curve_figure(series, length, quantity)`: a plotly figure of accuracy (or loss) against memory.
- `render_kv_html(evaluation, plotlyjs="embed")`: the page: settings, summary, one figure per
  length and quantity (fixed div ids `kv-accuracy-<length>`, `kv-loss-<length>`), the table.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from ..report.html import check_plotlyjs, figure_div, page, table

__all__ = ["CurveSeries", "curve_data", "curve_figure", "render_kv_html"]

COLOURS = {"headscope": "#e6550d", "reverse": "#756bb1", "random": "#bdbdbd", "random median": "#636363",
           "streaming": "#3182bd", "full": "#31a354"}


@dataclass
class CurveSeries:
    """One line or point of the curve: its name, style key, and points ordered by keep."""

    name: str
    kind: str
    kv_share: list
    accuracy: list
    loss: list
    keep: list


def curve_data(evaluation) -> dict:
    """`{length: [CurveSeries]}` from `evaluation.table` (see the module docstring)."""
    t = evaluation.table
    out = {}
    for length in sorted(t.length.unique()):
        part = t[t.length == length].sort_values("keep")
        series = []

        def add(name, kind, rows):
            series.append(CurveSeries(name, kind, [float(x) for x in rows.kv_share], [float(x) for x in rows.accuracy],
                                      [float(x) for x in rows.loss], [float(x) for x in rows.keep]))

        for draw in sorted(part[part.kind == "random"].draw.unique()):
            add(f"random draw {int(draw)}", "random", part[(part.kind == "random") & (part.draw == draw)])
        median = part[part.kind == "random"].groupby("keep", as_index=False)[["kv_share", "accuracy", "loss"]].median()
        if len(median):
            add("random (median)", "random median", median)
        for kind in ("reverse", "headscope", "streaming", "full"):
            if (part.kind == kind).any():
                add(kind, kind, part[part.kind == kind])
        out[int(length)] = series
    return out


def curve_figure(series: list, length: int, quantity: str = "accuracy"):
    """Needle accuracy (or text loss) against the KV cache kept, as a share of the full cache."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for s in series:
        y = s.accuracy if quantity == "accuracy" else s.loss
        single = len(s.kv_share) == 1
        fig.add_trace(go.Scatter(
            x=[100 * x for x in s.kv_share], y=y, name=s.name, mode="markers" if single else "lines+markers",
            line=dict(color=COLOURS[s.kind], width=3 if s.kind == "headscope" else 1.5,
                      dash="dot" if s.kind == "random" else None),
            marker=dict(size=10 if single else 6, color=COLOURS[s.kind]),
            showlegend=not (s.kind == "random" and s.name != "random draw 1"),
            legendgroup=s.kind, customdata=s.keep,
            hovertemplate="keep %{customdata}<br>KV kept %{x:.1f}%<br>" + quantity + " %{y:.3f}<extra>"
                          + html.escape(s.name) + "</extra>"))
    title = "needle accuracy" if quantity == "accuracy" else "loss on natural text (nats/token)"
    fig.update_layout(title=f"{length} tokens: {title} vs KV cache kept", template="plotly_white", height=420,
                      xaxis_title="KV cache kept (% of full attention's)", yaxis_title=title,
                      margin=dict(l=60, r=20, t=50, b=50))
    return fig


def render_kv_html(evaluation, plotlyjs: str = "embed") -> str:
    """The whole page as a string (text escaped, plotly.js once)."""
    check_plotlyjs(plotlyjs)
    meta = evaluation.meta
    data = curve_data(evaluation)
    figs, body = [], []
    policy = meta.get("policy", {})
    body.append(f"<header><h1>headscope KV-cache policy: {html.escape(str(meta.get('model', '')))}</h1>")
    settings = [["ranking", str(policy.get("rank_by", ""))], ["sink + recent keys", f"{policy.get('sink')} + {policy.get('recent')}"],
                ["prompts per length", str(meta.get("prompts_per_length", ""))],
                ["random draws per keep", str(meta.get("n_random", ""))],
                ["keep fractions", ", ".join(f"{k:g}" for k in meta.get("keeps", []))]]
    body.append(table(["setting", "value"], settings))
    body.append("<p class=\"note\">Needle accuracy: share of answer tokens predicted on held-out needle prompts. "
                "Loss: mean next-token cross-entropy on the natural text before the needle. KV kept: "
                "full heads x T + streaming heads x (sink + recent), as a share of every head x T.</p></header>")
    summary = evaluation.summary()
    body.append("<section id=\"summary\"><h2>Summary</h2>")
    body.append(table(list(summary.columns), [list(r) for r in summary.itertuples(index=False)]))
    body.append("</section>")
    for length, series in data.items():
        body.append(f"<section id=\"curve-{length}\"><h2>{length} tokens</h2><div class=\"figures\">")
        for quantity in ("accuracy", "loss"):
            fig_id = f"kv-{quantity}-{length}"
            figs.append((fig_id, curve_figure(series, length, quantity)))
            body.append(figure_div(fig_id))
        body.append("</div></section>")
    t = evaluation.table
    body.append("<section id=\"table\"><h2>Every condition</h2>")
    body.append(table(list(t.columns), [list(r) for r in t.itertuples(index=False)]))
    body.append("</section>")
    return page(f"headscope KV policy: {meta.get('model', '')}", "\n".join(body), figs, plotlyjs)
