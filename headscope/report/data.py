"""What the report shows, as plain values: no plotly, no HTML (tests assert on this).

- `report_data(analysis) -> ReportData`: everything one report page shows.
- `label_grid(analysis, categories)`: the `[layer][head]` label map with colours and hover text.
- `detector_grids(analysis)`: one `DetectorGrid` (scores, 95% CI, n, hover) per detector.
- `top_heads(analysis, k)`, `syntax_best(analysis)`, `method_rows(meta)`, `header_fields(meta)`.
- `validation_rows(analysis)`: the causal checks (`headscope.validate`), when the analysis has them.
- `label_categories(labels)`, `LABEL_COLOURS`: the fixed label -> colour mapping.
- Types: `ReportData`, `LabelGrid`, `DetectorGrid`, `TopHead`, `SyntaxBest`, `MethodRow`,
  `HeaderField`, `ValidationRow`.

Hover strings are plotly's pseudo-HTML: label and detector names in them are escaped here.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = [
    "ReportData", "LabelGrid", "DetectorGrid", "TopHead", "SyntaxBest", "MethodRow", "HeaderField",
    "ValidationRow", "report_data", "label_grid", "detector_grids", "top_heads", "syntax_best",
    "validation_rows", "method_rows",
    "header_fields", "label_categories", "label_colour", "short_label", "LABEL_COLOURS", "TOP_K",
]

TOP_K = 5
# Fixed colours for the detector labels headscope ships, so a label looks the same in every report.
LABEL_COLOURS = {
    "previous_token": "#1f77b4", "induction": "#d62728", "duplicate_token": "#ff7f0e",
    "self": "#9467bd", "next_token": "#17becf", "sink": "#8c564b", "uniform": "#bcbd22",
    "mixed": "#525252", "none": "#e8e8e8",
}
# Other labels ("syntactic:<relation>", third-party detectors) take these in sorted order.
EXTRA_COLOURS = ("#2ca02c", "#e377c2", "#98df8a", "#ffbb78", "#aec7e8", "#c5b0d5", "#f7b6d2",
                 "#9edae5", "#dbdb8d", "#c49c94", "#ff9896", "#637939", "#7b4173", "#3182bd")
_SHORT = {"previous_token": "prev", "induction": "ind", "duplicate_token": "dup", "self": "self",
          "next_token": "next", "sink": "sink", "uniform": "unif", "mixed": "mix", "none": ""}


class LabelGrid(NamedTuple):
    """The label map. Per-cell fields are `[layer][head]`; `index` points into `categories`."""

    labels: tuple  # [layer][head] label ("" where the head has no row)
    passing: tuple  # [layer][head] ";"-joined labels that passed their thresholds
    scores: np.ndarray  # [layer, head] the label's score (NaN where missing)
    index: np.ndarray  # [layer, head] int, index into categories, -1 where missing
    categories: tuple  # labels present, in the fixed order
    colours: tuple  # one colour per category
    short: tuple  # [layer][head] abbreviation shown in the cell
    hover: tuple  # [layer][head] every detector's score with CI (plotly pseudo-HTML)


class DetectorGrid(NamedTuple):
    """One detector's `[layer, head]` scores with their 95% CI."""

    detector: str
    score: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n: np.ndarray
    threshold: Optional[float]
    hover: tuple  # [layer][head]


class TopHead(NamedTuple):
    label: str
    rank: int  # 1-based
    layer: int
    head: int
    score: float
    passing: str


class SyntaxBest(NamedTuple):
    """The most accurate head for one dependency relation and the baseline it must beat."""

    relation: str
    layer: int
    head: int
    direction: str
    accuracy: float
    baseline_accuracy: float
    baseline_kind: str  # the predictor that sets the baseline ("offset -1", "control 2.3", ...)
    n: int
    held_out_margin: float  # NaN when the pair was chosen on neither half
    significant: bool


class ValidationRow(NamedTuple):
    """One causal check: a label's top heads ablated in one mode, against random heads."""

    label: str
    mode: str  # "zero" or "mean"
    primary: bool  # the mode that drives the verdict
    metric: str
    heads: tuple  # ((layer, head), ...)
    baseline: float
    ablated: float
    delta: float
    random_deltas: tuple  # floats, one per random draw
    random_mean: float
    ratio: float
    hurts_more: bool
    baseline_accuracy: float  # NaN when the metric has none
    ablated_accuracy: float


class MethodRow(NamedTuple):
    detector: str
    formula: str
    threshold: Optional[float]
    source: str
    probe: str


class HeaderField(NamedTuple):
    name: str
    value: str


@dataclass(frozen=True)
class ReportData:
    """Everything the report page shows. `created` is the only field that varies between runs."""

    title: str
    header: tuple  # HeaderField, "Created" excluded
    created: str
    n_layers: int
    n_heads: int
    label_grid: LabelGrid
    detector_grids: tuple  # DetectorGrid
    top_heads: tuple  # TopHead
    syntax_best: Optional[tuple]  # SyntaxBest; None when the analysis has no syntax scores
    methods: tuple  # MethodRow
    examples: tuple  # headscope.analysis.Example
    validation: Optional[tuple] = None  # ValidationRow; None when the analysis has no causal checks


def report_data(analysis) -> ReportData:
    """Collect the report's data from an analysis.

    Args:
        analysis: a `headscope.analysis.Analysis`.
    Returns:
        A `ReportData`.
    """
    meta = analysis.meta
    return ReportData(
        title=str(meta.get("model", "model")),
        header=header_fields(meta),
        created=str(meta.get("created", "")),
        n_layers=analysis.n_layers,
        n_heads=analysis.n_heads,
        label_grid=label_grid(analysis),
        detector_grids=detector_grids(analysis),
        top_heads=top_heads(analysis),
        syntax_best=syntax_best(analysis),
        methods=method_rows(meta, analysis.detectors),
        examples=tuple(analysis.examples),
        validation=validation_rows(analysis),
    )


def label_categories(labels) -> tuple:
    """Order labels for the legend: headscope's detectors, other labels sorted, "mixed", "none"."""
    present = set(labels) - {""}
    fixed = [label for label in LABEL_COLOURS if label in present and label not in ("mixed", "none")]
    others = sorted(present - set(LABEL_COLOURS))
    return tuple(fixed + others + [label for label in ("mixed", "none") if label in present])


def label_colour(label: str, categories: tuple) -> str:
    """A label's colour: fixed for headscope's labels, else by its rank among the other labels."""
    if label in LABEL_COLOURS:
        return LABEL_COLOURS[label]
    others = [c for c in categories if c not in LABEL_COLOURS]
    return EXTRA_COLOURS[others.index(label) % len(EXTRA_COLOURS)]


def short_label(label: str) -> str:
    """The abbreviation printed inside a label-map cell ("syntactic:obj" -> "obj")."""
    if label in _SHORT:
        return _SHORT[label]
    return label.split(":", 1)[1][:6] if ":" in label else label[:5]


def label_grid(analysis, categories: Optional[tuple] = None) -> LabelGrid:
    """The label map of an analysis.

    Args:
        analysis: a `headscope.analysis.Analysis`.
        categories: the legend's labels (default: those present); pass the union of two
            analyses' labels so both maps share colours.
    Returns:
        A `LabelGrid`.
    """
    n_layers, n_heads = analysis.n_layers, analysis.n_heads
    labels = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    passing = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    scores = np.full((n_layers, n_heads), np.nan)
    for row in analysis.labels.itertuples(index=False):
        labels[row.layer][row.head] = str(row.label)
        passing[row.layer][row.head] = "" if _missing(row.labels) else str(row.labels)
        scores[row.layer, row.head] = float(row.score)
    categories = categories or label_categories(label for row in labels for label in row)
    index = np.array([[categories.index(label) if label else -1 for label in row] for row in labels], dtype=int)
    detector_lines = _detector_lines(analysis)
    hover = tuple(
        tuple(_label_hover(layer, head, labels[layer][head], passing[layer][head], detector_lines.get((layer, head), []))
              for head in range(n_heads))
        for layer in range(n_layers)
    )
    return LabelGrid(
        labels=tuple(map(tuple, labels)), passing=tuple(map(tuple, passing)), scores=scores, index=index,
        categories=categories, colours=tuple(label_colour(c, categories) for c in categories),
        short=tuple(tuple(short_label(label) for label in row) for row in labels), hover=hover,
    )


def detector_grids(analysis) -> tuple:
    """One `DetectorGrid` per detector, in the order of `analysis.detectors`."""
    thresholds = {name: spec.get("threshold") for name, spec in analysis.meta.get("detectors", {}).items()}
    grids = []
    for detector in analysis.detectors:
        score, low, high, n = (analysis.score_grid(detector, column) for column in ("score", "ci_low", "ci_high", "n"))
        hover = tuple(
            tuple(_score_hover(layer, head, detector, score[layer, head], low[layer, head], high[layer, head], n[layer, head])
                  for head in range(analysis.n_heads))
            for layer in range(analysis.n_layers)
        )
        threshold = thresholds.get(detector, thresholds.get(detector.split(":")[0]))  # "syntactic:obj" -> "syntactic"
        grids.append(DetectorGrid(detector, score, low, high, n, threshold, hover))
    return tuple(grids)


def top_heads(analysis, k: int = TOP_K) -> tuple:
    """The `k` strongest heads of every label but "none", strongest first (ties: lower layer, head).

    Returns:
        `TopHead` rows, grouped by label in legend order.
    """
    rows = []
    for label in label_categories(analysis.labels["label"].astype(str)):
        if label == "none":
            continue
        heads = analysis.labels[analysis.labels["label"] == label]
        heads = heads.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(k)
        for rank, row in enumerate(heads.itertuples(index=False), start=1):
            rows.append(TopHead(label, rank, int(row.layer), int(row.head), float(row.score),
                                "" if _missing(row.labels) else str(row.labels)))
    return tuple(rows)


def syntax_best(analysis) -> Optional[tuple]:
    """Best head per relation: `meta["syntax_best"]` if present, else the argmax of `.syntax`.

    Returns:
        `SyntaxBest` rows, or None when `analysis.syntax` is None.
    """
    if analysis.syntax is None:
        return None
    stored = analysis.meta.get("syntax_best")
    if stored:
        return tuple(
            SyntaxBest(str(b["relation"]), int(b["layer"]), int(b["head"]), str(b["direction"]), float(b["accuracy"]),
                       float(b["baseline_accuracy"]), _text(b.get("baseline_kind")), int(b["n"]),
                       float(b.get("held_out_margin", np.nan)), _flag(b.get("significant", False)))
            for b in stored
        )
    frame = analysis.syntax.sort_values(["relation", "accuracy", "layer", "head", "direction"],
                                        ascending=[True, False, True, True, True])
    best = frame.groupby("relation", sort=True).head(1)
    return tuple(
        SyntaxBest(str(r.relation), int(r.layer), int(r.head), str(r.direction), float(r.accuracy),
                   float(r.baseline), _text(getattr(r, "baseline_kind", "")), int(r.n),
                   float(getattr(r, "held_out_margin", np.nan)), _flag(getattr(r, "significant", False)))
        for r in best.itertuples(index=False)
    )


def validation_rows(analysis) -> Optional[tuple]:
    """The causal checks of `analysis.validation` (a `headscope.validate` frame, possibly read
    back from CSV), in its row order.

    Returns:
        `ValidationRow`s, or None when the analysis has no `validation` (or it is None).
    """
    frame = getattr(analysis, "validation", None)
    if frame is None:
        return None
    rows = []
    for r in frame.itertuples(index=False):
        heads = tuple(tuple(int(x) for x in h.split(".")) for h in _text(r.heads).split(";") if h)
        deltas = r.random_deltas if isinstance(r.random_deltas, (list, tuple)) else _text(r.random_deltas).split(";")
        rows.append(ValidationRow(
            str(r.label), str(r.mode), _flag(r.primary), str(r.metric), heads, float(r.baseline), float(r.ablated),
            float(r.delta), tuple(float(d) for d in deltas if str(d) != ""), float(r.random_mean), float(r.ratio),
            _flag(r.hurts_more), float(getattr(r, "baseline_accuracy", np.nan)), float(getattr(r, "ablated_accuracy", np.nan)),
        ))
    return tuple(rows)


def method_rows(meta: dict, detectors: Optional[list] = None) -> tuple:
    """Formula, threshold, source and probe of each detector in `meta["detectors"]`.

    Args:
        meta: the analysis metadata.
        detectors: preferred order (the scores' order; "syntactic:obj" stands for "syntactic");
            detectors not in it follow, sorted.
    """
    specs = meta.get("detectors", {})
    named = [name for d in (detectors or []) for name in (d, d.split(":")[0]) if name in specs]
    order = list(dict.fromkeys(named)) + sorted(set(specs) - set(named))
    return tuple(
        MethodRow(name, str(specs[name].get("formula", "")), specs[name].get("threshold"),
                  str(specs[name].get("source", "")), str(specs[name].get("probe", "")))
        for name in order
    )


def header_fields(meta: dict) -> tuple:
    """The header's name/value pairs (all but "created", which the page prints on its own line)."""
    versions = meta.get("versions", {})
    timings = meta.get("timings", {})
    probes = meta.get("probes", {})
    heads = f"{meta.get('n_layers', '?')} layers × {meta.get('n_heads', '?')} heads"
    if meta.get("n_kv_heads") not in (None, meta.get("n_heads")):
        heads += f" ({meta['n_kv_heads']} KV heads)"
    if "causal" in meta:
        heads += ", causal" if meta["causal"] else ", bidirectional"
    stages = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in timings.items() if stage != "total")
    run_time = f"{timings['total']:.1f} s" if "total" in timings else "?"
    return (
        HeaderField("Model", str(meta.get("model", "?"))),
        HeaderField("Family", str(meta.get("family", "?"))),
        HeaderField("Parameters", _count(meta.get("parameters"))),
        HeaderField("Heads", heads),
        HeaderField("Probes", "; ".join(
            f"{name}: {p.get('n_examples', '?')} examples × {p.get('seq_len', '?')} tokens ({p.get('description', '')})"
            for name, p in probes.items()) or "?"),
        HeaderField("Seed", str(meta.get("seed", "?"))),
        HeaderField("Versions", ", ".join(f"{name} {version}" for name, version in versions.items()) or "?"),
        HeaderField("Run time", run_time + (f" ({stages})" if stages else "")),
    ) + tuple(HeaderField("Note", str(note)) for note in meta.get("notes", ()))


def _detector_lines(analysis) -> dict:
    """(layer, head) -> hover lines "detector: score [low, high]" in detector order."""
    lines: dict = {}
    for row in analysis.scores.itertuples(index=False):
        text = "no score" if np.isnan(row.score) else f"{row.score:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
        lines.setdefault((int(row.layer), int(row.head)), []).append(f"{html.escape(str(row.detector))}: {text}")
    return lines


def _label_hover(layer: int, head: int, label: str, passing: str, lines: list) -> str:
    top = f"<b>layer {layer} head {head}</b>: {html.escape(label or 'no label')}"
    if passing and passing != label:
        top += f"<br>passing: {html.escape(passing)}"
    return "<br>".join([top] + lines)


def _score_hover(layer, head, detector, score, low, high, n) -> str:
    if np.isnan(score):
        return f"<b>layer {layer} head {head}</b><br>{html.escape(detector)}: no score"
    count = "" if np.isnan(n) else f" (n={int(n)})"
    return (f"<b>layer {layer} head {head}</b><br>{html.escape(detector)}: {score:.3f}"
            f"<br>95% CI [{low:.3f}, {high:.3f}]{count}")


def _text(value: Any) -> str:
    """A CSV cell as text ("" for a missing one)."""
    return "" if _missing(value) else str(value)


def _flag(value: Any) -> bool:
    """A bool cell, also when read back from CSV as text."""
    return value.strip().lower() == "true" if isinstance(value, str) else bool(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _count(value) -> str:
    if value is None:
        return "?"
    value = int(value)
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit} ({value:,})"
    return str(value)
