"""Two analyses side by side: data, then the page.

- `compare_data(a, b) -> CompareData`: label maps with shared colours, `b - a` score grids per
  shared detector (same shape only), heads whose label changed (with the quantity each label's
  score is in), each detector's top heads in both, and label counts. Notes say what could not be
  compared (shapes, detectors) and when only one analysis had a control model.
- `render_compare_html(a, b, plotlyjs=)`, `write_compare(a, b, out_dir, plotlyjs=, force=)`.
- Types: `CompareData`, `DiffGrid`, `ChangedHead`, `TopPair`, `LabelCount`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np

from ..atomic import atomic_dir, write_card
from . import figures
from .data import TOP_K, header_fields, label_categories, label_detector, label_grid
from .html import check_plotlyjs, header_list, page, table
from .method import control_text, has_control, quantity

__all__ = ["CompareData", "DiffGrid", "ChangedHead", "TopPair", "LabelCount", "compare_data",
           "render_compare_html", "write_compare"]


class DiffGrid(NamedTuple):
    detector: str
    quantity: str  # what the scores are (from a's meta)
    a: np.ndarray  # [layer, head]
    b: np.ndarray
    diff: np.ndarray  # b - a
    hover: tuple  # [layer][head]


class ChangedHead(NamedTuple):
    layer: int
    head: int
    label_a: str
    score_a: float
    label_b: str
    score_b: float
    quantity_a: str  # what score_a is: the quantity of label_a's detector
    quantity_b: str


class TopPair(NamedTuple):
    """The rank-th strongest head of one detector in a and in b (None past the end)."""

    detector: str
    quantity: str  # what the scores are (from a's meta)
    rank: int
    a_head: Optional[tuple]  # (layer, head)
    a_score: Optional[float]
    b_head: Optional[tuple]
    b_score: Optional[float]


class LabelCount(NamedTuple):
    label: str
    count_a: int
    count_b: int


@dataclass(frozen=True)
class CompareData:
    name_a: str
    name_b: str
    header_a: tuple
    header_b: tuple
    same_shape: bool
    notes: tuple  # str
    grid_a: object  # LabelGrid
    grid_b: object
    diffs: tuple  # DiffGrid; empty when the shapes differ
    changed: tuple  # ChangedHead; empty when the shapes differ
    top: tuple  # TopPair
    label_counts: tuple  # LabelCount


def _sites_of(analysis) -> str:
    """The group of attention sites an analysis read (`meta["sites"]`; "the default sites" without one)."""
    sites = analysis.meta.get("sites")
    return str(sites["group"]) if isinstance(sites, dict) and sites.get("group") else "the default sites"


def compare_data(a, b) -> CompareData:
    """Compare two analyses.

    Args:
        a, b: `headscope.analysis.Analysis` objects ("before" and "after"); differences are b - a.
    Returns:
        A `CompareData`.
    """
    sites_a, sites_b = _sites_of(a), _sites_of(b)
    same_shape = (a.n_layers, a.n_heads) == (b.n_layers, b.n_heads) and sites_a == sites_b
    shared = [d for d in a.detectors if d in set(b.detectors)]
    notes = []
    if sites_a != sites_b:
        notes.append(f"The analyses read different attention sites (a: {sites_a}; b: {sites_b}): their layer.head "
                     "numbers name different modules, so scores and labels are not compared head by head, only each "
                     "detector's top heads.")
    elif not same_shape:
        notes.append(f"The models have different shapes (a: {a.n_layers} layers × {a.n_heads} heads, "
                     f"b: {b.n_layers} × {b.n_heads}): scores and labels are not compared head by head, "
                     "only each detector's top heads.")
    only_a, only_b = sorted(set(a.detectors) - set(shared)), sorted(set(b.detectors) - set(shared))
    if only_a or only_b:
        notes.append("Not compared: detectors only in a: " + (", ".join(only_a) or "none")
                     + "; only in b: " + (", ".join(only_b) or "none") + ".")
    if has_control(a.meta) != has_control(b.meta):
        notes.append(f"Controls differ (a: {control_text(a.meta)}; b: {control_text(b.meta)}): learned-behaviour "
                     "labels were checked against an untrained twin in one analysis only, so label changes may come "
                     "from that alone.")
    both = {"detectors": {**a.meta.get("detectors", {}), **b.meta.get("detectors", {})}}
    categories = label_categories(list(a.labels["label"].astype(str)) + list(b.labels["label"].astype(str)), both)
    grid_a, grid_b = label_grid(a, categories, both), label_grid(b, categories, both)

    diffs, changed = (), ()
    if same_shape:
        diffs = tuple(_diff_grid(a, b, detector) for detector in shared)
        changed = tuple(
            ChangedHead(layer, head, grid_a.labels[layer][head], float(grid_a.scores[layer, head]),
                        grid_b.labels[layer][head], float(grid_b.scores[layer, head]),
                        _label_quantity(a, grid_a, layer, head), _label_quantity(b, grid_b, layer, head))
            for layer in range(a.n_layers) for head in range(a.n_heads)
            if grid_a.labels[layer][head] != grid_b.labels[layer][head]
        )
    counts_a, counts_b = a.labels["label"].astype(str).value_counts(), b.labels["label"].astype(str).value_counts()
    return CompareData(
        name_a=str(a.meta.get("model", "a")), name_b=str(b.meta.get("model", "b")),
        header_a=header_fields(a.meta), header_b=header_fields(b.meta), same_shape=same_shape, notes=tuple(notes),
        grid_a=grid_a, grid_b=grid_b, diffs=diffs, changed=changed,
        top=tuple(pair for detector in shared for pair in _top_pairs(a, b, detector)),
        label_counts=tuple(LabelCount(c, int(counts_a.get(c, 0)), int(counts_b.get(c, 0))) for c in categories),
    )


def render_compare_html(a, b, plotlyjs: str = "embed") -> str:
    """The compare page of two analyses (see `compare_data`).

    Args:
        a, b: `headscope.analysis.Analysis` objects.
        plotlyjs: "embed" or "cdn".
    Returns:
        The page's HTML.
    """

    check_plotlyjs(plotlyjs)
    return _compare_page(compare_data(a, b), plotlyjs)


def _compare_page(data: CompareData, plotlyjs: str) -> str:
    figs = [("hs-compare-a", figures.label_map_figure(data.grid_a, "a: " + html.escape(data.name_a, quote=False))),
            ("hs-compare-b", figures.label_map_figure(data.grid_b, "b: " + html.escape(data.name_b, quote=False)))]
    figs += [(f"hs-diff-{i}", figures.diff_figure(d.detector, d.diff, d.hover)) for i, d in enumerate(data.diffs)]
    body = [
        f"<header>\n<h1>headscope comparison: {html.escape(data.name_a)} vs {html.escape(data.name_b)}</h1>",
        "<div class=\"columns\"><div><h2>a</h2>", header_list(data.header_a), "</div><div><h2>b</h2>",
        header_list(data.header_b), "</div></div>", "<p id=\"hs-error\"></p>\n</header>",
        *[f"<p class=\"note\">{html.escape(note)}</p>" for note in data.notes],
        "<section id=\"labels\"><h2>Label maps</h2>\n<div class=\"figures\">",
        "<div id=\"hs-compare-a\" class=\"figure\"></div>", "<div id=\"hs-compare-b\" class=\"figure\"></div>", "</div>",
        table(["label", "heads in a", "heads in b"], [list(c) for c in data.label_counts]), "</section>",
    ]
    if data.diffs:
        body += ["<section id=\"differences\"><h2>Score differences (b − a)</h2>\n<div class=\"figures\">",
                 *[f"<div id=\"hs-diff-{i}\" class=\"figure\"></div>" for i in range(len(data.diffs))],
                 "</div>\n</section>"]
    if data.same_shape:
        body += ["<section id=\"changed\"><h2>Heads that changed label</h2>",
                 table(["layer", "head", "label in a", "score in a", "quantity in a", "label in b", "score in b",
                        "quantity in b"],
                       [[c.layer, c.head, c.label_a, c.score_a, c.quantity_a, c.label_b, c.score_b, c.quantity_b]
                        for c in data.changed]) if data.changed else "<p>No head changed label.</p>",
                 "</section>"]
    top: dict = {}
    for t in data.top:
        row = top.setdefault((t.detector, t.quantity), ([], []))
        for heads, head, score in ((row[0], t.a_head, t.a_score), (row[1], t.b_head, t.b_score)):
            if head is not None:
                heads.append(f"L{head[0]} H{head[1]} {score:.3f}")
    body += ["<section id=\"top\"><h2>Top heads per detector</h2><p class=\"hint\">Strongest first.</p>",
             table(["detector", "quantity", "a", "b"], [[name, unit, " · ".join(a_heads), " · ".join(b_heads)]
                                                       for (name, unit), (a_heads, b_heads) in top.items()]),
             "</section>"]
    return page(f"headscope: {data.name_a} vs {data.name_b}", "\n".join(body), figs, plotlyjs)


def write_compare(a, b, out_dir, *, plotlyjs: str = "embed", force: bool = False, protect=()) -> Path:
    """Write the compare page to `out_dir/index.html`, atomically.

    Args:
        a, b: `headscope.analysis.Analysis` objects.
        out_dir: the folder to create; must not exist unless `force`.
        plotlyjs: "embed" or "cdn".
        force: replace an existing folder headscope wrote (`headscope.atomic`).
        protect: folders being read (the two analyses' own), which `out_dir` must neither be nor hold.
    Returns:
        The path of `index.html`.
    """
    check_plotlyjs(plotlyjs)
    data = compare_data(a, b)
    with atomic_dir(out_dir, force=force, protect=protect) as tmp:
        (tmp / "index.html").write_text(_compare_page(data, plotlyjs), encoding="utf-8")
        changed = str(len(data.changed)) if data.same_shape else "not compared (shapes differ)"
        write_card(tmp, "comparison", title=f"{data.name_a} vs {data.name_b}",
                   headline=[("a", data.name_a), ("b", data.name_b), ("heads that changed label", changed)])
    return Path(out_dir) / "index.html"


def _label_quantity(analysis, grid, layer: int, head: int) -> str:
    """What a head's label score is: its detector's quantity ("none": the highest score of any detector)."""
    label = grid.labels[layer][head]
    if label in ("", "none"):
        return "highest score of any detector" if label else ""
    return quantity(analysis.meta, label_detector(label, grid.passing[layer][head], analysis.meta))


def _diff_grid(a, b, detector: str) -> DiffGrid:
    score_a, score_b = a.score_grid(detector), b.score_grid(detector)
    diff = score_b - score_a
    unit = quantity(a.meta, detector)
    name = f"{html.escape(detector)} ({html.escape(unit)})"
    hover = tuple(
        tuple(f"<b>layer {layer} head {head}</b><br>{name}<br>a: {_num(score_a[layer, head])}"
              f"<br>b: {_num(score_b[layer, head])}<br>b − a: {_num(diff[layer, head], signed=True)}"
              for head in range(a.n_heads))
        for layer in range(a.n_layers)
    )
    return DiffGrid(detector, unit, score_a, score_b, diff, hover)


def _top_pairs(a, b, detector: str, k: int = TOP_K) -> list:
    def top(analysis):
        rows = analysis.scores[analysis.scores["detector"] == detector]
        rows = rows.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(k)
        return [((int(r.layer), int(r.head)), float(r.score)) for r in rows.itertuples(index=False)]

    top_a, top_b = top(a), top(b)
    pairs = []
    for rank in range(max(len(top_a), len(top_b))):
        head_a, score_a = top_a[rank] if rank < len(top_a) else (None, None)
        head_b, score_b = top_b[rank] if rank < len(top_b) else (None, None)
        pairs.append(TopPair(detector, quantity(a.meta, detector), rank + 1, head_a, score_a, head_b, score_b))
    return pairs


def _num(value: float, signed: bool = False) -> str:
    if np.isnan(value):
        return "–"
    return f"{value:+.3f}" if signed else f"{value:.3f}"
