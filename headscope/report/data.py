"""What the report shows, as plain values: no plotly, no HTML (tests assert on this).

- `report_data(analysis) -> ReportData`: everything one report page shows.
- `label_grid(analysis, categories)`: the `[layer][head]` label map with colours and hover text.
- `detector_grids(analysis)`: one `DetectorGrid` (scores, 95% CI, n, control, hover) per detector.
- `top_heads(analysis, k)`: each label's strongest heads with the quantity their score is and the
  control's score for the same head.
- From `detector_sections.py`: `section_data(analysis)`, each detector's own section (`Detector.report`:
  its tables, e.g. the syntactic detector's best head per relation), whose fields read as
  `ReportData` attributes (`data.syntax_best`).
- From `general_tables.py`: `validation_rows(analysis)`, `ov_rows(analysis)` (OV copying of the heads
  whose label the OV qualifier reads, with their qualifier, which the label map's hover and the
  top heads carry too).
- `label_detector(label, passing, meta)`: the detector whose score a label shows.
- From `composition_data.py`: `composition_data(analysis)`, the composition section (heatmaps of z
  and the top pairs) when `headscope.add_composition` attached scores.
- From `method.py`: `method_rows(meta)`, `label_rules(meta)`, `report_warnings(meta)`, `header_fields(meta)`.
- `label_categories(labels)`, `label_colour`, `short_label`: legend order, colours and cell
  abbreviations, read from the detectors (`Detector.colour`, `Detector.short`).
- Types: `ReportData`, `LabelGrid`, `DetectorGrid`, `TopHead`, `SectionData`, `MethodRow`,
  `MethodNote`, `HeaderField`, `ValidationRow`, `OvRow`.

"Control" numbers come from `Analysis.scores`: `control` is the control model's score for the same
head and detector, `control_max` its best score over heads (`headscope.loading.control`). Hover strings
are plotly's pseudo-HTML: label and detector names in them are escaped here.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np

from ..detectors.registry import detector_specs, registry_order
from .composition_data import CompositionData, composition_data
from .geometry_data import GeometryData, geometry_data
from .method import (
    HeaderField, MethodNote, MethodRow, detector_spec, header_fields, label_rules, method_rows, outranks_resting,
    ov_labels_text, quantity, report_warnings,
)
from .detector_sections import SectionData, section_data
from .general_tables import OvRow, ValidationRow, ov_lookup, ov_rows, validation_rows

__all__ = [
    "ReportData", "LabelGrid", "DetectorGrid", "TopHead", "SectionData", "MethodRow", "MethodNote",
    "HeaderField", "ValidationRow", "OvRow", "ov_rows",
    "report_data", "label_grid", "detector_grids", "top_heads", "section_data",
    "label_detector", "validation_rows", "method_rows", "label_rules", "report_warnings",
    "header_fields", "label_categories", "label_colour", "short_label", "OUTCOME_COLOURS", "TOP_K",
]

TOP_K = 5
# The two labels that are not detectors; a detector's own colour and abbreviation are on the
# detector (`Detector.colour`, `Detector.short`), so a label looks the same in every report.
OUTCOME_COLOURS = {"mixed": "#525252", "none": "#e8e8e8"}
_OUTCOME_SHORT = {"mixed": "mix", "none": ""}
# Labels whose detector has no colour ("syntactic:<relation>", "positional:<k>", third-party
# detectors) take these in sorted order.
EXTRA_COLOURS = ("#2ca02c", "#e377c2", "#98df8a", "#ffbb78", "#aec7e8", "#c5b0d5", "#f7b6d2",
                 "#9edae5", "#dbdb8d", "#c49c94", "#ff9896", "#637939", "#7b4173", "#3182bd")


def _fixed_colours(meta: Optional[dict] = None) -> dict:
    """label -> colour: the detectors that have one (in registry order; those an analysis recorded,
    `registry.detector_specs`), then "mixed", "none"."""
    specs = detector_specs(meta)
    return {**{name: specs[name]["colour"] for name in registry_order(specs) if specs[name].get("colour")},
            **OUTCOME_COLOURS}


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
    qualifiers: tuple = ()  # [layer][head] OV qualifier of heads whose detector is `ov_qualified` ("copies",
    # "no OV copying"), "" elsewhere; () without OV copying in the analysis


class DetectorGrid(NamedTuple):
    """One detector's `[layer, head]` scores with their 95% CI."""

    detector: str
    score: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n: np.ndarray
    threshold: Optional[float]
    hover: tuple  # [layer][head]
    quantity: str  # what the score is, e.g. "attention mass"
    control: np.ndarray  # [layer, head] the control model's score for the same head (NaN: no control)
    control_max: np.ndarray  # [layer, head] the control's best head for this detector (per head: the
    # syntactic control depends on the head's relation and direction)


class TopHead(NamedTuple):
    """One of a label's strongest heads; `score` is in `quantity`, the unit of `detector`'s score."""

    label: str
    rank: int  # 1-based
    layer: int
    head: int
    score: float
    passing: str
    detector: str  # the detector whose score the label shows ("syntactic" for "syntactic:obj";
    # for "mixed" the clearest candidate)
    quantity: str
    ci_low: float
    ci_high: float
    control: float  # the control model's score for this head and detector (NaN: no control)
    control_max: float  # the control's best head for this detector
    ov: Optional[OvRow] = None  # the head's OV copying (None: not computed)

    @property
    def qualifier(self) -> str:
        """ "copies" or "no OV copying" for heads whose label the OV qualifier reads, else ""."""
        return self.ov.qualifier if self.ov is not None else ""

    def ov_text(self) -> str:
        """ ", no OV copying (eig share 0.61, control 0.34; copy top-1 0.002)" for qualified heads, else ""."""
        return f", {self.ov.text()}" if self.qualifier else ""

    def text(self, name_detector: bool = False) -> str:
        """ "0.912 (control 0.050)", the detector named first when asked (as it passed: "syntactic:cc");
        no bracket without a control."""
        passed = [name for name in self.passing.split(";") if name.split(":")[0] == self.detector]
        text = (f"{passed[0] if passed else self.detector} " if name_detector else "") + f"{self.score:.3f}"
        return text if np.isnan(self.control) else text + f" (control {self.control:.3f})"


@dataclass(frozen=True)
class ReportData:
    """Everything the report page shows. `created` is the only field that varies between runs.

    The detectors' own sections are in `sections` (`SectionData`); their data's fields read as
    attributes of this object too (`data.syntax_best` is the syntactic section's).
    """

    title: str
    header: tuple  # HeaderField, "Created" excluded
    created: str
    n_layers: int
    n_heads: int
    label_grid: LabelGrid
    detector_grids: tuple  # DetectorGrid
    top_heads: tuple  # TopHead
    methods: tuple  # MethodRow
    examples: tuple  # headscope.analysis.Example
    validation: Optional[tuple] = None  # ValidationRow; None when the analysis has no causal checks
    rules: tuple = ()  # MethodNote: the labelling rule in sentences
    warnings: tuple = ()  # str: shown prominently (no control model, a detector skipped)
    geometry: Optional[GeometryData] = None  # None when the analysis holds no geometry (report/geometry_data.py)
    composition: Optional[CompositionData] = None  # None without a composition table (report/composition_data.py)
    ov: Optional[tuple] = None  # OvRow of heads whose label the OV qualifier reads; None without OV copying
    ov_labels: str = ""  # those detectors in words ("induction and duplicate-token"), for the page's hints
    sections: tuple = ()  # SectionData: each detector's own section (`Detector.report`), in detector order

    def __getattr__(self, name: str):
        """A section's field, e.g. `syntax_best` (only called for names the dataclass lacks)."""
        if not name.startswith("__"):
            for section in self.__dict__.get("sections", ()):
                if name in getattr(section.data, "_fields", ()):
                    return getattr(section.data, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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
        methods=method_rows(meta, analysis.detectors),
        examples=tuple(analysis.examples),
        validation=validation_rows(analysis),
        rules=label_rules(meta),
        warnings=report_warnings(meta),
        geometry=geometry_data(analysis),
        composition=composition_data(analysis),
        ov=ov_rows(analysis),
        ov_labels=ov_labels_text(meta),
        sections=section_data(analysis),
    )


def label_categories(labels, meta: Optional[dict] = None) -> tuple:
    """Order labels for the legend: headscope's detectors, other labels sorted, "mixed", "none"
    (`meta`: the analysis's, whose recorded detectors are read instead of the registry)."""
    present = set(labels) - {""}
    colours = _fixed_colours(meta)
    fixed = [label for label in colours if label in present and label not in OUTCOME_COLOURS]
    others = sorted(present - set(colours))
    return tuple(fixed + others + [label for label in ("mixed", "none") if label in present])


def label_colour(label: str, categories: tuple, meta: Optional[dict] = None) -> str:
    """A label's colour: its detector's own (`Detector.colour`), else by its rank among the other labels."""
    colours = _fixed_colours(meta)
    if label in colours:
        return colours[label]
    others = [c for c in categories if c not in colours]
    return EXTRA_COLOURS[others.index(label) % len(EXTRA_COLOURS)]


def short_label(label: str, meta: Optional[dict] = None) -> str:
    """The abbreviation printed inside a label-map cell: the detector's own (`Detector.short`),
    else the part after a colon ("syntactic:obj" -> "obj") or the first five letters."""
    if label in _OUTCOME_SHORT:
        return _OUTCOME_SHORT[label]
    spec = detector_specs(meta).get(label, {})
    if spec.get("short"):
        return spec["short"]
    return label.split(":", 1)[1][:6] if ":" in label else label[:5]


def label_grid(analysis, categories: Optional[tuple] = None, meta: Optional[dict] = None) -> LabelGrid:
    """The label map of an analysis.

    Args:
        analysis: a `headscope.analysis.Analysis`.
        categories: the legend's labels (default: those present); pass the union of two
            analyses' labels so both maps share colours.
        meta: whose detectors' colours and abbreviations to use (default: the analysis's);
            two analyses drawn side by side pass both analyses' detectors.
    Returns:
        A `LabelGrid`.
    """
    meta = analysis.meta if meta is None else meta
    n_layers, n_heads = analysis.n_layers, analysis.n_heads
    labels = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    passing = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    scores = np.full((n_layers, n_heads), np.nan)
    sites = {}  # layer -> the module path of its attention (labels saved before tables named sites: none)
    for row in analysis.labels.itertuples(index=False):
        if not _missing(getattr(row, "site", None)):
            sites[row.layer] = str(row.site)
        labels[row.layer][row.head] = str(row.label)
        passing[row.layer][row.head] = "" if _missing(row.labels) else str(row.labels)
        scores[row.layer, row.head] = float(row.score)
    categories = categories or label_categories((label for row in labels for label in row), meta)
    index = np.array([[categories.index(label) if label else -1 for label in row] for row in labels], dtype=int)
    detector_lines = _detector_lines(analysis)
    ov = ov_lookup(analysis)
    qualifiers = tuple(tuple(ov[(l, h)].qualifier if (l, h) in ov else "" for h in range(n_heads))
                       for l in range(n_layers)) if ov else ()
    hover = tuple(
        tuple(_label_hover(layer, head, labels[layer][head], passing[layer][head], detector_lines.get((layer, head), []),
                           ov.get((layer, head)), sites.get(layer, ""))
              for head in range(n_heads))
        for layer in range(n_layers)
    )
    return LabelGrid(
        labels=tuple(map(tuple, labels)), passing=tuple(map(tuple, passing)), scores=scores, index=index,
        categories=categories, colours=tuple(label_colour(c, categories, meta) for c in categories),
        short=tuple(tuple(short_label(label, meta) for label in row) for row in labels), hover=hover,
        qualifiers=qualifiers,
    )


def detector_grids(analysis) -> tuple:
    """One `DetectorGrid` per detector, in the order of `analysis.detectors`."""
    meta = analysis.meta
    grids = []
    for detector in analysis.detectors:
        score, low, high, n, control, control_max = (
            _grid(analysis, detector, column) for column in ("score", "ci_low", "ci_high", "n", "control", "control_max"))
        unit = quantity(meta, detector)
        hover = tuple(
            tuple(_score_hover(layer, head, detector, unit, score[layer, head], low[layer, head], high[layer, head],
                               n[layer, head], control[layer, head], control_max[layer, head])
                  for head in range(analysis.n_heads))
            for layer in range(analysis.n_layers)
        )
        threshold = detector_spec(meta, detector).get("threshold")  # "syntactic:obj" -> "syntactic"
        grids.append(DetectorGrid(detector, score, low, high, n, threshold, hover, unit, control, control_max))
    return tuple(grids)


def label_detector(label: str, passing: str, meta: dict) -> str:
    """The detector whose score a label shows: the label's own ("syntactic:obj" -> "syntactic"), or for
    "mixed" the clearest candidate, as `headscope.detectors.labels` picks it (`passing` lists the passed
    detectors clearest first; resting behaviours yield to detectors that outrank them)."""
    if label != "mixed":
        return label if label in meta.get("detectors", {}) else label.split(":")[0]
    names = [name for name in passing.split(";") if name]
    base = [name if name in meta.get("detectors", {}) else name.split(":")[0] for name in names]
    resting = [b for b in base if not detector_spec(meta, b).get("learned", True)]
    outranking = [b for b in base if outranks_resting(meta, b)]
    if outranking and resting:
        return outranking[0]
    return base[0] if base else ""


def top_heads(analysis, k: int = TOP_K) -> tuple:
    """The `k` strongest heads of every label but "none", strongest first (ties: lower layer, head).

    Returns:
        `TopHead` rows, grouped by label in legend order, each with its detector's quantity, CI
        and the control's scores for the same detector (`analysis.scores`).
    """
    rows = []
    lookup = _score_rows(analysis)
    ov = ov_lookup(analysis)
    for label in label_categories(analysis.labels["label"].astype(str), analysis.meta):
        if label == "none":
            continue
        heads = analysis.labels[analysis.labels["label"] == label]
        heads = heads.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(k)
        for rank, row in enumerate(heads.itertuples(index=False), start=1):
            passing = "" if _missing(row.labels) else str(row.labels)
            detector = label_detector(label, passing, analysis.meta)
            layer, head = int(row.layer), int(row.head)
            found = lookup.get((layer, head, label)) or lookup.get((layer, head, detector)) or {}
            rows.append(TopHead(label, rank, layer, head, float(row.score), passing, detector,
                                quantity(analysis.meta, detector), *(float(found.get(c, np.nan)) for c in _STATS),
                                ov.get((layer, head))))
    return tuple(rows)


_STATS = ("ci_low", "ci_high", "control", "control_max")


def _score_rows(analysis) -> dict:
    """(layer, head, detector) -> {ci_low, ci_high, control, control_max} from `analysis.scores`."""
    frame = analysis.scores
    columns = {c: frame[c].tolist() if c in frame else [np.nan] * len(frame) for c in _STATS}
    keys = zip(frame["layer"].tolist(), frame["head"].tolist(), frame["detector"].astype(str).tolist())
    return {(int(l), int(h), d): {c: columns[c][i] for c in _STATS} for i, (l, h, d) in enumerate(keys)}


def _grid(analysis, detector: str, column: str) -> np.ndarray:
    """`analysis.score_grid`, all NaN for a column the scores lack (analyses saved before controls)."""
    if column not in analysis.scores:
        return np.full((analysis.n_layers, analysis.n_heads), np.nan)
    return analysis.score_grid(detector, column)


def _detector_lines(analysis) -> dict:
    """(layer, head) -> hover lines "detector: quantity score [low, high]" (and the control) in detector order."""
    lines: dict = {}
    frame = analysis.scores
    nan = [np.nan] * len(frame)
    control = frame["control"].tolist() if "control" in frame else nan
    control_max = frame["control_max"].tolist() if "control_max" in frame else nan
    for row, same, best in zip(frame.itertuples(index=False), control, control_max):
        unit = html.escape(quantity(analysis.meta, str(row.detector)))
        text = "no score" if np.isnan(row.score) else f"{unit} {row.score:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
        text += _control_text(same, best, "; ")
        lines.setdefault((int(row.layer), int(row.head)), []).append(f"{html.escape(str(row.detector))}: {text}")
    return lines


def _control_text(same: float, best: float, lead: str) -> str:
    """ "control (same head): x, control best head: y", or "" without a control."""
    if np.isnan(same) and np.isnan(best):
        return ""
    return f"{lead}control (same head): {_num(same)}, control best head: {_num(best)}"


def _num(value: float) -> str:
    return "–" if np.isnan(value) else f"{value:.3f}"


def _label_hover(layer: int, head: int, label: str, passing: str, lines: list, ov: Optional[OvRow] = None,
                 site: str = "") -> str:
    """Label (with its OV qualifier), the head's attention module, what else passed, every
    detector's score and the head's OV copying."""
    qualified = f"{label}, {ov.qualifier}" if ov is not None and ov.qualifier else (label or "no label")
    top = f"<b>layer {layer} head {head}</b>: {html.escape(qualified)}"
    if site:
        top += f"<br>{html.escape(site)}"
    if passing and passing != label:
        top += f"<br>passing: {html.escape(passing)}"
    if ov is not None:
        control = ("" if np.isnan(ov.control_share) else
                   f" (control {ov.control_share:.3f}, control best head {ov.control_best_share:.3f})")
        top1 = "" if np.isnan(ov.copy_top1) else f"; copy top-1 {ov.copy_top1:.3f}"
        lines = lines + [f"OV copying: eig share {ov.positive_eig_share:.3f}{control}{top1}"]
    return "<br>".join([top] + lines)


def _score_hover(layer, head, detector, unit, score, low, high, n, control, control_max) -> str:
    name = f"{html.escape(detector)} ({html.escape(unit)})"
    if np.isnan(score):
        return f"<b>layer {layer} head {head}</b><br>{name}: no score"
    count = "" if np.isnan(n) else f" (n={int(n)})"
    return (f"<b>layer {layer} head {head}</b><br>{name}: {score:.3f}"
            f"<br>95% CI [{low:.3f}, {high:.3f}]{count}{_control_text(control, control_max, '<br>')}")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))
