"""The page of a `Circuit`: data -> figures -> HTML.

- `receiver_node(name)` -> `(node, part)`: the node a receiver belongs to and which of its inputs
  it is ("q", "k", "v"; "" for an MLP's, a mixer's or the logits' one input).
- `graph_layout(nodes)` -> `{name: (x, y)}`: every node placed by layer (pure): x grows with the
  layer (embed first, logits last), a layer's heads share a column, spread in y, and its MLP
  (or other writers) stand just right of them.
- `page_data(circuit, labels, n_edges)` -> `PageData`: the top `n_edges` edges by |score|, their
  nodes and positions, each node's label, the faithfulness curve when the circuit was evaluated.
- `graph_figure(data)`, `faithfulness_figure(data)`: plotly figures of that data (fixed div ids);
  `faithfulness_text(evaluation)`: CPR and CMD in one line.
- `render_circuit_html(circuit, labels=None, n_edges=TOP_EDGES, plotlyjs="embed")`: the page.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..detectors.section import figure_style, plotly_text
from ..report.data import HeaderField
from ..report.html import Raw, figure_div, header_list, page, table

__all__ = ["PageData", "ShownEdge", "receiver_node", "graph_layout", "label_map", "page_data", "graph_figure",
           "faithfulness_figure", "faithfulness_text", "stability_text", "render_circuit_html", "GRAPH_ID",
           "FAITHFULNESS_ID",
           "TOP_EDGES", "PARTS"]

GRAPH_ID = "hs-circuit-graph"
FAITHFULNESS_ID = "hs-circuit-faithfulness"
TOP_EDGES = 300  # edges drawn in the graph: legible at SmolLM2's size (30 x 9 heads, 30 MLPs)
TABLE_ROWS = 40  # edges listed in the table
WRITER_SPAN = 0.55  # x distance from a layer's heads to its last other writer (its MLP)
# How each receiving input is drawn: q, k, v of a head, and the one input of an MLP, mixer or the logits.
PARTS = {"q": ("dot", "into a head's query"), "k": ("dash", "into a head's key"),
         "v": ("dashdot", "into a head's value"), "": ("solid", "into an MLP, mixer or the logits")}
SIGN_COLOURS = {1: "#2166ac", -1: "#b2182b"}  # as the attribution page: blue up, red down
# |score| / largest shown |score| at or above each threshold: (line width, opacity).
STRENGTHS = ((0.5, 4.0, 0.9), (0.25, 2.6, 0.7), (0.1, 1.6, 0.5), (0.0, 0.8, 0.3))


def receiver_node(name: str) -> tuple[str, str]:
    """`(node, part)` of a receiver's name: `a3.h2.k` -> `("a3.h2", "k")`, `m3` -> `("m3", "")`."""
    base, _, part = name.rpartition(".")
    if part in ("q", "k", "v") and base.startswith("a"):
        return base, part
    return name, ""


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "<NA>"


def graph_layout(nodes) -> dict:
    """Every node's `(x, y)` on the graph (module docstring); pure.

    Args:
        nodes: a circuit's nodes table (name, kind, layer, head): `embed`, then each layer's
            senders in the order they write, then `logits`.
    Returns:
        `{name: (x, y)}`. `embed` at x = 0, layer L's heads at x = L + 1 with head h at
        y = (H - 1) / 2 - h (head 0 on top), the layer's other writers (MLP, mixer, another
        attention block) after them at x = L + 1 + up to `WRITER_SPAN`, y = 0, and `logits` at
        x = last layer + 2.
    """
    groups: dict = {}  # layer -> [group key], in the order they write; heads are one group
    heads: dict = {}  # layer -> number of heads
    for row in nodes.itertuples(index=False):
        if row.kind in ("embed", "logits") or _missing(row.layer):
            continue
        layer = int(row.layer)
        key = "heads" if row.kind == "head" else row.name
        if key not in groups.setdefault(layer, []):
            groups[layer].append(key)
        if row.kind == "head":
            heads[layer] = max(heads.get(layer, 0), int(row.head) + 1)
    last = max(groups, default=-1)
    positions = {}
    for row in nodes.itertuples(index=False):
        if row.kind == "embed" or (row.kind != "logits" and _missing(row.layer)):
            positions[row.name] = (0.0, 0.0)
        elif row.kind == "logits":
            positions[row.name] = (float(last + 2), 0.0)
        else:
            layer = int(row.layer)
            order = groups[layer]
            key = "heads" if row.kind == "head" else row.name
            x = layer + 1 + (WRITER_SPAN * order.index(key) / (len(order) - 1) if len(order) > 1 else 0.0)
            y = (heads[layer] - 1) / 2 - int(row.head) if row.kind == "head" else 0.0
            positions[row.name] = (float(x), float(y))
    return positions


def label_map(labels) -> dict:
    """`{(layer, head): label}` from a mapping or a labels table (layer, head, label); {} for None."""
    if labels is None:
        return {}
    if hasattr(labels, "itertuples"):
        return {(int(r.layer), int(r.head)): str(r.label) for r in labels.itertuples() if str(r.label) != "none"}
    return {(int(layer), int(head)): str(label) for (layer, head), label in dict(labels).items()}


@dataclass
class ShownEdge:
    """One drawn edge: sender, receiver, score, the receiver's node and which input (`PARTS`)."""

    src: str
    dst: str
    score: float
    node: str
    part: str


@dataclass
class PageData:
    """What the page shows (module docstring)."""

    edges: list  # [ShownEdge], largest |score| first
    positions: dict  # node name -> (x, y), every node
    touched: set  # nodes an edge shown touches
    labels: dict  # node name -> label ("" without one)
    n_edges: int  # all edges of the graph
    evaluation: Any  # the evaluation table or None


def page_data(circuit, labels=None, n_edges: int = TOP_EDGES) -> PageData:
    """The page's data: the top `n_edges` edges of `circuit`, placed by `graph_layout`."""
    by_head = label_map(labels)
    names = {}
    for row in circuit.nodes.itertuples(index=False):
        if row.kind == "head" and not _missing(row.layer):
            names[row.name] = by_head.get((int(row.layer), int(row.head)), "")
    shown = []
    for row in circuit.top(n_edges).itertuples(index=False):
        node, part = receiver_node(row.dst)
        shown.append(ShownEdge(str(row.src), str(row.dst), float(row.score), node, part))
    touched = {e.src for e in shown} | {e.node for e in shown}
    return PageData(shown, graph_layout(circuit.nodes), touched, names, len(circuit.edges), circuit.evaluation)


def _strength(ratio: float) -> tuple[float, float]:
    return next((width, opacity) for least, width, opacity in STRENGTHS if ratio >= least)


def _curve(start, end, points: int = 9) -> tuple[list, list]:
    """A gentle arc from `start` to `end` (a quadratic Bezier), so that long edges pass beside
    the nodes they skip instead of through them."""
    (x0, y0), (x1, y1) = start, end
    bend = 0.12 * (x1 - x0) if abs(x1 - x0) > 1.01 else 0.0
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2 + bend
    xs, ys = [], []
    for i in range(points):
        t = i / (points - 1)
        xs.append((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t ** 2 * x1)
        ys.append((1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y1)
    return xs, ys


def _node_text(name: str, label: str) -> str:
    return plotly_text(name + (f" ({label})" if label else ""))


def graph_figure(data: PageData, title: str = ""):
    """The edges as lines (width and opacity by |score|, colour by sign, dash by the receiving
    input), every node dimly and the nodes they touch in full, labels on the hover and beside heads."""
    import plotly.graph_objects as go

    fig = go.Figure()
    largest = max((abs(e.score) for e in data.edges), default=0.0) or 1.0
    buckets: dict = {}  # (part, sign, width, opacity) -> (xs, ys)
    mid_x, mid_y, mid_text = [], [], []
    for edge in reversed(data.edges):  # the strongest drawn last, on top
        width, opacity = _strength(abs(edge.score) / largest)
        key = (edge.part, 1 if edge.score >= 0 else -1, width, opacity)
        xs, ys = _curve(data.positions[edge.src], data.positions[edge.node])
        bucket = buckets.setdefault(key, ([], []))
        bucket[0].extend(xs + [None])
        bucket[1].extend(ys + [None])
        mid_x.append(xs[len(xs) // 2])
        mid_y.append(ys[len(ys) // 2])
        mid_text.append(f"{_node_text(edge.src, data.labels.get(edge.src, ''))} → "
                        f"{_node_text(edge.dst, data.labels.get(edge.node, ''))}<br>score {edge.score:+.4g}")
    for (part, sign, width, opacity), (xs, ys) in sorted(buckets.items(), key=lambda item: item[0][2]):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False, opacity=opacity,
                                 line={"color": SIGN_COLOURS[sign], "width": width, "dash": PARTS[part][0]}))
    fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers", marker={"size": 6, "color": "rgba(0,0,0,0)"},
                             hovertext=mid_text, hoverinfo="text", showlegend=False))
    for touched in (False, True):
        names = [name for name in data.positions if (name in data.touched) == touched]
        fig.add_trace(go.Scatter(
            x=[data.positions[n][0] for n in names], y=[data.positions[n][1] for n in names],
            mode="markers+text" if touched else "markers", showlegend=False,
            text=[plotly_text(data.labels.get(n, "")) for n in names] if touched else None,
            textposition="top center", textfont={"size": 9, "color": "#444"},
            hovertext=[_node_text(n, data.labels.get(n, "")) for n in names], hoverinfo="text",
            marker={"size": 9 if touched else 5, "color": "#333" if touched else "#ccc",
                    "symbol": [_symbol(n) for n in names], "line": {"width": 0}}))
    for part, (dash, words) in PARTS.items():  # the legend: one entry per receiving input, per sign
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=words,
                                 line={"color": "#555", "dash": dash, "width": 2}))
    for sign, words in ((1, "score > 0: corrupting it raises the metric"),
                        (-1, "score < 0: corrupting it lowers the metric")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=words,
                                 line={"color": SIGN_COLOURS[sign], "width": 3}))
    xs = [x for x, _ in data.positions.values()] or [0.0]
    ys = [y for _, y in data.positions.values()] or [0.0]
    last = max(xs)
    ticks = [0.0] + [float(x) for x in range(1, int(last))] + [last]
    text = ["embed"] + [str(x - 1) for x in range(1, int(last))] + ["logits"]
    fig.update_layout(title={"text": plotly_text(title), "y": 0.97},
                      xaxis={"title": {"text": "layer"}, "tickvals": ticks, "ticktext": text, "showgrid": False,
                             "zeroline": False, "range": [-0.6, last + 0.6]},
                      yaxis={"visible": False, "range": [min(ys) - 0.8, max(ys) + 0.8]},
                      height=max(380, 48 * (max(ys) - min(ys) + 1) + 160), margin={"t": 70, "l": 20, "r": 20},
                      legend={"orientation": "h", "y": -0.15}, hovermode="closest", **figure_style())
    return fig


def _symbol(name: str) -> str:
    if name in ("embed", "logits"):
        return "diamond"
    return "circle" if name.startswith("a") else "square"


def faithfulness_figure(data: PageData):
    """Faithfulness against circuit size (% of edges, log x): the circuit's, and the random
    circuits' mean with their range as a band."""
    import plotly.graph_objects as go

    table = data.evaluation
    sizes = [float(s) for s in table["size"]]
    fig = go.Figure()
    if "random_mean" in table.columns:
        fig.add_trace(go.Scatter(x=sizes + sizes[::-1], y=list(table.random_hi) + list(table.random_lo)[::-1],
                                 fill="toself", fillcolor="rgba(150,150,150,0.25)", line={"width": 0},
                                 hoverinfo="skip", name="random circuits: range"))
        fig.add_trace(go.Scatter(x=sizes, y=list(table.random_mean), mode="lines+markers", name="random circuits: mean",
                                 line={"color": "#888", "dash": "dash"},
                                 hovertemplate="%{x}% of edges<br>random mean %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=sizes, y=list(table.faithfulness), mode="lines+markers",
                             name="top edges by signed score (CPR)", line={"color": "#2166ac", "width": 3},
                             customdata=list(table.n_edges),
                             hovertemplate="%{x}% of edges (%{customdata})<br>faithfulness %{y:.3f}<extra></extra>"))
    if "faithfulness_abs" in table.columns:
        fig.add_trace(go.Scatter(x=sizes, y=list(table.faithfulness_abs), mode="lines+markers",
                                 name="top edges by |score| (CMD)", line={"color": "#b2182b", "width": 2},
                                 customdata=list(table.n_edges),
                                 hovertemplate="%{x}% of edges (%{customdata})<br>faithfulness %{y:.3f}<extra></extra>"))
    for level in (0.0, 1.0):
        fig.add_hline(y=level, line={"color": "#bbb", "width": 1, "dash": "dot"})
    fig.update_layout(title={"text": "Faithfulness against circuit size", "y": 0.97},
                      xaxis={"title": {"text": "circuit size (% of edges, log scale)"}, "type": "log"},
                      yaxis={"title": {"text": "faithfulness f(C)"}}, height=420, margin={"t": 70},
                      legend={"orientation": "h", "y": -0.2}, **figure_style())
    return fig


def _fmt(value: Optional[float]) -> str:
    return "?" if value is None or _missing(value) else f"{float(value):.3f}"


def faithfulness_text(evaluation) -> str:
    """CPR and CMD of an evaluation, and the random circuits' (one line)."""
    attrs = evaluation.attrs
    text = (f"CPR {_fmt(attrs.get('cpr'))} (top edges by signed score; higher better), "
            f"CMD {_fmt(attrs.get('cmd'))} (top edges by |score|; 0 best)")
    if "random_cpr" in attrs:
        text += (f"; random circuits of the same sizes: CPR {_fmt(attrs.get('random_cpr'))}, "
                 f"CMD {_fmt(attrs.get('random_cmd'))}")
    return text


def stability_text(rows) -> str:
    """The bootstrap Jaccard of the top edges (`Circuit.stability`'s rows) in one line."""
    parts = [f"top {float(r['size']):g}% ({int(r['n_edges'])} edges): Jaccard {_fmt(r['jaccard'])} "
             f"[{_fmt(r['jaccard_lo'])}, {_fmt(r['jaccard_hi'])}]" for r in rows]
    first = rows[0]
    return "; ".join(parts) + f" between circuits of {int(first['n_boot'])} pairs of resampled prompt sets"


def render_circuit_html(circuit, labels=None, n_edges: int = TOP_EDGES, plotlyjs: str = "embed") -> str:
    """The whole page of a circuit (module docstring).

    Args:
        circuit: a `Circuit` (evaluated or not).
        labels: head labels of an analysis: `{(layer, head): label}` or a table (layer, head, label).
        n_edges: edges drawn in the graph.
        plotlyjs: "embed" (offline) or "cdn".
    Returns:
        The page's HTML.
    """
    data = page_data(circuit, labels, n_edges)
    meta = circuit.meta
    method = str(meta.get("method", "?"))
    steps = f", {meta['steps']} steps" if method == "eap-ig" and "steps" in meta else ""
    passes = meta.get("passes") or {}
    fields = [HeaderField("model", str(meta.get("model", "?"))),
              HeaderField("task", f"{meta.get('task', '?')} ({meta.get('n', '?')} prompt pairs)"),
              HeaderField("method", method + steps),
              HeaderField("metric", f"{meta.get('metric', '?')}: clean {_fmt(meta.get('clean_metric'))}, "
                                    f"corrupted {_fmt(meta.get('corrupted_metric'))}"),
              HeaderField("passes", f"{passes.get('forward', '?')} forward, {passes.get('backward', '?')} backward"),
              HeaderField("edges", f"{data.n_edges} scored; the graph draws the top {len(data.edges)} by |score|")]
    if data.evaluation is not None:
        fields.append(HeaderField("faithfulness", faithfulness_text(data.evaluation)))
    if meta.get("stability"):
        fields.append(HeaderField("stability", stability_text(meta["stability"])))
    title = f"headscope circuit: {meta.get('model', '?')}, {meta.get('task', '?')}"
    figs = [(GRAPH_ID, graph_figure(data, f"Top {len(data.edges)} of {data.n_edges} edges ({method})"))]
    faithfulness = ""
    if data.evaluation is not None:
        figs.append((FAITHFULNESS_ID, faithfulness_figure(data)))
        faithfulness = "\n".join([
            "<section><h2>Faithfulness</h2>",
            "<p class=\"hint\">f(C) = (m(C) - m(empty)) / (m(model) - m(empty)): the metric with only the circuit's "
            "edges clean and every other edge carrying the corrupted run's value (counterfactual ablation), "
            "between the corrupted run (0) and the model (1). As MIB defines them, CPR is the area under f of the "
            "circuits made of the top edges by signed score (those whose corruption moves the metric away from the "
            "clean run), CMD the area under |1 - f| of those made of the top edges by |score|, both from the smallest "
            "size to 100%; the random circuits draw as many edges uniformly.</p>",
            f"<p>{html.escape(faithfulness_text(data.evaluation))}</p>", figure_div(FAITHFULNESS_ID), "</section>"])
    rows = [[i + 1, e.src, e.dst, PARTS[e.part][1].removeprefix("into "), Raw(f"{e.score:+.4g}"),
             data.labels.get(e.src, ""), data.labels.get(e.node, "")]
            for i, e in enumerate(data.edges[:TABLE_ROWS])]
    body = "\n".join([
        "<header><h1>" + html.escape(title) + "</h1>", header_list(fields), "<p id=\"hs-error\"></p></header>",
        "<section><h2>The graph</h2>",
        "<p class=\"hint\">Nodes by layer: the embeddings, each head's output (circles), each MLP or other writer "
        "(squares, right of its layer's heads), the logits. An edge's score estimates the change of the metric when "
        "that one edge carries the corrupted run's value: width and opacity by |score|, colour by sign, dash by the "
        "input it reaches. Grey nodes touch no edge drawn. Hover a node or an edge's middle for its name.</p>",
        figure_div(GRAPH_ID), "</section>", faithfulness,
        f"<section><h2>Top {min(TABLE_ROWS, len(data.edges))} edges</h2>",
        table(["#", "from", "to", "input", "score", "from label", "to label"], rows), "</section>",
    ])
    return page(title, body, figs, plotlyjs)
