"""A timeline folder's HTML page: data -> figures -> html, as `headscope.report` does for one analysis.

- `timeline_data(scores, labels, steps, meta)` -> `TimelineData`: what the page shows, with no
  plotly (tests assert on it): each detector's top heads (best final score) and their score and
  95% CI over the steps, the step at which each head first earns each label, the ICL score and
  the training loss over the steps, and the label of every head at every step.
- `score_figure(data, detector)`, `icl_figure(data)`, `label_map_figure(data)` (a slider over
  the steps): plotly figures.
- `render_timeline(data, plotlyjs)` -> the page (plotly.js once, fixed div ids, text escaped).
- `write_timeline_report(folder, plotlyjs)`: index.html from the folder's tables, and the folder's
  card for `headscope report --index` (`timeline_headline(data)`).
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..atomic import write_card
from ..report.html import figure_div, page, table

__all__ = ["TimelineData", "timeline_data", "score_figure", "icl_figure", "label_map_figure", "render_timeline",
           "write_timeline_report", "timeline_headline", "TOP_HEADS", "FIGURE_IDS"]

TOP_HEADS = 4  # heads drawn per detector
FIGURE_IDS = {"icl": "hs-timeline-icl", "labels": "hs-timeline-labels"}  # plus "hs-timeline-score-<i>" per detector
PALETTE = ["#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


class TimelineData(NamedTuple):
    steps: list  # recorded steps, ascending
    detectors: list  # detector names, in the table's order
    top: dict  # detector -> [{"head": "L.H", "score": [...], "ci_low": [...], "ci_high": [...]}]
    controls: dict  # detector -> the control's best head score (the first step's)
    first_labels: list  # [{"label", "head", "step", "score"}], by step
    icl: dict  # {"icl_score": [...], "loss": [...], "train_loss": [...]} over `steps`
    label_names: list  # labels that occur, "none" first
    label_map: list  # [step][layer][head] label
    n_layers: int
    n_heads: int
    control: str  # what the control was


def timeline_data(scores: pd.DataFrame, labels: pd.DataFrame, steps: pd.DataFrame, meta: dict) -> TimelineData:
    steps = steps.sort_values("step")
    order = [int(s) for s in steps.step]
    n_layers, n_heads = int(scores.layer.max()) + 1, int(scores["head"].max()) + 1
    top, controls = {}, {}
    present = list(dict.fromkeys(scores.detector))
    detectors = [d for d in meta.get("detectors", []) if d in present] + \
        [d for d in present if d not in meta.get("detectors", [])]  # the order they were asked for
    for det in detectors:
        rows = scores[scores.detector == det]
        final = rows[rows.step == order[-1]].sort_values("score", ascending=False).head(TOP_HEADS)
        series = []
        for layer, head in zip(final.layer, final["head"]):
            one = rows[(rows.layer == layer) & (rows["head"] == head)].set_index("step").reindex(order)
            series.append({"head": f"{int(layer)}.{int(head)}", "score": _floats(one.score),
                           "ci_low": _floats(one.ci_low), "ci_high": _floats(one.ci_high)})
        top[det] = series
        controls[det] = float(rows[rows.step == order[0]].control.max())
    named = labels[labels.label != "none"].sort_values("step", kind="stable")
    first = named.drop_duplicates(["layer", "head", "label"])
    keyed = scores.set_index(["step", "layer", "head", "detector"]).score
    first_labels = [{"label": r.label, "head": f"{int(r.layer)}.{int(r.head)}", "step": int(r.step),
                     "score": float(keyed.get((r.step, r.layer, r.head, r.label), float("nan")))}
                    for r in first.itertuples()]
    label_names = ["none"] + sorted(set(labels.label) - {"none"})
    grid = labels.set_index(["step", "layer", "head"]).label
    label_map = [[[str(grid.get((s, l, h), "none")) for h in range(n_heads)] for l in range(n_layers)] for s in order]
    icl = {name: _floats(steps[name]) for name in ("icl_score", "loss", "train_loss")}
    return TimelineData(order, detectors, top, controls, first_labels, icl, label_names, label_map, n_layers, n_heads,
                        str(meta.get("control", "")))


def _floats(series) -> list:
    return [None if pd.isna(v) else round(float(v), 5) for v in series]


def score_figure(data: TimelineData, detector: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, head in enumerate(data.top[detector]):
        colour = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=data.steps, y=head["score"], name=f"head {head['head']}", mode="lines+markers",
                                 line={"color": colour}, error_y={"type": "data", "symmetric": False, "visible": True,
                                 "array": [None if s is None or h is None else h - s
                                           for s, h in zip(head["score"], head["ci_high"])],
                                 "arrayminus": [None if s is None or lo is None else s - lo
                                                for s, lo in zip(head["score"], head["ci_low"])]}))
    fig.add_hline(y=data.controls[detector], line_dash="dot", line_color="#888",
                  annotation_text="control's best head", annotation_position="top left")
    fig.update_layout(title=f"{detector}: top heads over training", xaxis_title="step", yaxis_title="score",
                      height=320, margin={"t": 40, "b": 40, "l": 50, "r": 10})
    return fig


def icl_figure(data: TimelineData):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=data.steps, y=data.icl["icl_score"], name="ICL score", mode="lines+markers",
                             line={"color": "#d62728"}), secondary_y=False)
    fig.add_trace(go.Scatter(x=data.steps, y=data.icl["loss"], name="probe loss", mode="lines",
                             line={"color": "#1f77b4"}), secondary_y=True)
    if any(v is not None for v in data.icl["train_loss"]):
        fig.add_trace(go.Scatter(x=data.steps, y=data.icl["train_loss"], name="training loss", mode="lines",
                                 line={"color": "#7f7f7f", "dash": "dot"}), secondary_y=True)
    fig.update_layout(title="ICL score (loss late - loss early) and loss", height=320,
                      margin={"t": 40, "b": 40, "l": 50, "r": 50})
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="ICL score (nats)", secondary_y=False)
    fig.update_yaxes(title_text="loss (nats)", secondary_y=True)
    return fig


def label_map_figure(data: TimelineData):
    """Layers x heads coloured by label, one slider position per recorded step."""
    import plotly.graph_objects as go

    index = {name: i for i, name in enumerate(data.label_names)}
    k = len(data.label_names)
    colours = ["#eeeeee"] + [PALETTE[i % len(PALETTE)] for i in range(k - 1)]
    scale = []
    for i, colour in enumerate(colours):  # discrete bands: value i in [i, i + 1) / k
        scale += [[i / k, colour], [(i + 1) / k, colour]]
    z = lambda s: [[index[label] + 0.5 for label in row] for row in data.label_map[s]]
    text = lambda s: [[html.escape(label) for label in row] for row in data.label_map[s]]
    fig = go.Figure(go.Heatmap(z=z(-1), text=text(-1), texttemplate="%{text}", zmin=0, zmax=k, colorscale=scale,
                               showscale=False, x=[f"H{h}" for h in range(data.n_heads)],
                               y=[f"L{l}" for l in range(data.n_layers)],
                               hovertemplate="%{y} %{x}: %{text}<extra></extra>"))
    slider = {"active": len(data.steps) - 1, "currentvalue": {"prefix": "step "}, "pad": {"t": 30},
              "steps": [{"label": str(step), "method": "restyle", "args": [{"z": [z(i)], "text": [text(i)]}]}
                        for i, step in enumerate(data.steps)]}
    fig.update_layout(title="labels at a step", sliders=[slider], height=160 + 40 * data.n_layers,
                      yaxis={"autorange": "reversed"}, margin={"t": 40, "b": 10, "l": 40, "r": 10})
    return fig


def render_timeline(data: TimelineData, plotlyjs: str = "embed", title: str = "timeline") -> str:
    figs = [(FIGURE_IDS["icl"], icl_figure(data)), (FIGURE_IDS["labels"], label_map_figure(data))]
    figs += [(f"hs-timeline-score-{i}", score_figure(data, det)) for i, det in enumerate(data.detectors)]
    rows = [[r["label"], r["head"], r["step"], r["score"]] for r in data.first_labels]
    body = [
        "<header>", f"<h1>headscope timeline: {html.escape(title)}</h1>",
        f"<p>{len(data.steps)} steps ({data.steps[0]} to {data.steps[-1]}), {data.n_layers} layers x "
        f"{data.n_heads} heads; control: {html.escape(data.control)}.</p>", "<p id=\"hs-error\"></p>", "</header>",
        "<section><h2>In-context learning</h2>", figure_div(FIGURE_IDS["icl"]), "</section>",
        "<section><h2>Labels</h2>", figure_div(FIGURE_IDS["labels"]),
        "<h3>The step at which each head first earns its label</h3>",
        table(["label", "head", "step", "score"], rows) if rows else "<p>No head earned a label.</p>", "</section>",
        "<section><h2>Scores of each detector's top heads</h2>",
        *[figure_div(f"hs-timeline-score-{i}") for i in range(len(data.detectors))], "</section>",
    ]
    return page(f"headscope timeline: {title}", "\n".join(body), figs, plotlyjs)


def write_timeline_report(folder, plotlyjs: str = "embed", title: str = "timeline") -> Path:
    """index.html in `folder` (a timeline folder, or the temporary one being written)."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    data = timeline_data(pd.read_csv(folder / "timeline.csv"), pd.read_csv(folder / "labels.csv"),
                         pd.read_csv(folder / "steps.csv"), meta)
    path = folder / "index.html"
    path.write_text(render_timeline(data, plotlyjs, title), encoding="utf-8")
    write_card(folder, "timeline", title=title, headline=timeline_headline(data))
    return path


def timeline_headline(data: TimelineData) -> list:
    """`(name, value)` pairs for a list of reports: the steps, the last ICL score, labelled heads."""
    icl = next((v for v in reversed(data.icl["icl_score"]) if v is not None), None)
    labelled = sum(label != "none" for row in data.label_map[-1] for label in row)
    return [("steps", f"{len(data.steps)} ({data.steps[0]} to {data.steps[-1]})"),
            ("last ICL score", "–" if icl is None else f"{icl:.3f}"),
            ("heads labelled at the last step", f"{labelled} of {data.n_layers * data.n_heads}")]
