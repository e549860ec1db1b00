"""The report's tables read from an analysis's frames: syntactic heads and causal checks.

- `syntax_best(analysis)`: the best head per relation (`SyntaxBest`).
- `syntax_relations(analysis)`: every significant relation of each head labelled syntactic
  (`SyntaxRelation`).
- `validation_rows(analysis)`: the causal checks of `headscope.validate` (`ValidationRow`).
- `ov_rows(analysis)`: OV copying of every head labelled induction or duplicate-token, with its
  qualifier (`OvRow`); `ov_lookup(analysis)`: every head's OV numbers by (layer, head).

Frames may come back from CSV (`Analysis.load`): booleans as text, missing cells as NaN.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from ..detectors.labels import OV_QUALIFIED, ov_control_best, ov_qualifiers

__all__ = ["SyntaxBest", "SyntaxRelation", "ValidationRow", "OvRow", "syntax_best", "syntax_relations",
           "validation_rows", "ov_rows", "ov_lookup"]


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


class SyntaxRelation(NamedTuple):
    """One significant (relation, direction) of a head labelled syntactic (`analysis.syntax` row)."""

    layer: int
    head: int
    label: str  # the head's label ("syntactic:<its clearest relation>")
    relation: str
    direction: str
    accuracy: float
    baseline: float
    baseline_kind: str
    held_out_margin: float
    ci_low: float
    ci_high: float
    n: int


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


class OvRow(NamedTuple):
    """One head's OV copying (`Analysis.ov`): the model's numbers, the control twin's for the same head and
    its best head's share; `qualifier` is "copies", "no OV copying" or "" (`headscope.detectors.labels.ov_qualifier`)."""

    layer: int
    head: int
    label: str
    qualifier: str
    positive_eig_share: float
    copy_top1: float
    control_share: float  # NaN: no control
    control_best_share: float

    def text(self) -> str:
        """ "no OV copying (eig share 0.61, control 0.34; copy top-1 0.002)" for the top heads and the CLI."""
        control = "" if np.isnan(self.control_share) else f", control {self.control_share:.2f}"
        head = f"{self.qualifier} " if self.qualifier else ""
        return f"{head}(eig share {self.positive_eig_share:.2f}{control}; copy top-1 {self.copy_top1:.3f})"


def ov_lookup(analysis) -> dict:
    """(layer, head) -> `OvRow` for every head of `analysis.ov` ({} when there is none)."""
    table = analysis.ov
    if table is None:
        return {}
    labels = {(int(r.layer), int(r.head)): str(r.label) for r in analysis.labels.itertuples(index=False)}
    qualifiers = ov_qualifiers(analysis.labels, table)
    best = ov_control_best(table)
    rows = {}
    for r in table.itertuples(index=False):
        key = (int(r.layer), int(r.head))
        rows[key] = OvRow(key[0], key[1], labels.get(key, ""), qualifiers.get(key, ""), float(r.positive_eig_share),
                          float(r.copy_top1), _number(r.control_positive_eig_share), best)
    return rows


def ov_rows(analysis) -> Optional[tuple]:
    """`OvRow`s of the heads labelled induction or duplicate-token, by layer and head; None without `.ov`."""
    if analysis.ov is None:
        return None
    return tuple(row for _, row in sorted(ov_lookup(analysis).items()) if row.label in OV_QUALIFIED)


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
                       _number(b.get("held_out_margin")), _flag(b.get("significant", False)))
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


def syntax_relations(analysis) -> Optional[tuple]:
    """Every significant (relation, direction) of each head labelled syntactic, clearest first.

    Returns:
        `SyntaxRelation` rows ordered by layer, head, then CI lower bound (highest first); None when
        the analysis has no syntax scores or they have no `significant` column.
    """
    table = analysis.syntax
    if table is None or "significant" not in table:
        return None
    labels = {(int(r.layer), int(r.head)): str(r.label) for r in analysis.labels.itertuples(index=False)
              if str(r.label).startswith("syntactic:")}
    keep = [_flag(s) and (int(l), int(h)) in labels for s, l, h in zip(table["significant"], table["layer"], table["head"])]
    chosen = table[np.array(keep, dtype=bool)]
    chosen = chosen.sort_values(["layer", "head", "ci_low", "held_out_margin"], ascending=[True, True, False, False])
    return tuple(
        SyntaxRelation(int(r.layer), int(r.head), labels[(int(r.layer), int(r.head))], str(r.relation), str(r.direction),
                       float(r.accuracy), float(r.baseline), _text(getattr(r, "baseline_kind", "")),
                       float(r.held_out_margin), float(r.ci_low), float(r.ci_high), int(r.n))
        for r in chosen.itertuples(index=False)
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


def _text(value: Any) -> str:
    """A CSV cell as text ("" for a missing one)."""
    return "" if _missing(value) else str(value)


def _number(value: Any) -> float:
    """A float cell (NaN for a missing one: None in JSON, empty in CSV)."""
    return np.nan if _missing(value) else float(value)


def _flag(value: Any) -> bool:
    """A bool cell, also when read back from CSV as text."""
    return value.strip().lower() == "true" if isinstance(value, str) else bool(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))
