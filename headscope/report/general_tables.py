"""The report's general tables read from an analysis's frames: causal checks and OV copying.

- `validation_rows(analysis)`: the causal checks of `headscope.validate` (`ValidationRow`).
- `ov_rows(analysis)`: OV copying of every head whose label the OV qualifier reads (detectors
  with `ov_qualified`), with its qualifier (`OvRow`); `ov_lookup(analysis)`: every head's OV
  numbers by (layer, head).

A detector's own tables are its report section's (`Detector.report`, `report/detector_sections.py`).
Frames may come back from CSV (`Analysis.load`): booleans as text, missing cells as NaN.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ..detectors.labels import ov_control_best, ov_qualified_labels, ov_qualifiers
from ..detectors.section import cell_flag as _flag, cell_number as _number, cell_text as _text
from .detector_sections import table as _table

__all__ = ["ValidationRow", "OvRow", "validation_rows", "ov_rows", "ov_lookup"]


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
    table = _table(analysis, "ov")
    if table is None:
        return {}
    labels = {(int(r.layer), int(r.head)): str(r.label) for r in analysis.labels.itertuples(index=False)}
    qualifiers = ov_qualifiers(analysis.labels, table, ov_qualified_labels(analysis.meta))
    best = ov_control_best(table)
    rows = {}
    for r in table.itertuples(index=False):
        key = (int(r.layer), int(r.head))
        rows[key] = OvRow(key[0], key[1], labels.get(key, ""), qualifiers.get(key, ""), float(r.positive_eig_share),
                          float(r.copy_top1), _number(r.control_positive_eig_share), best)
    return rows


def ov_rows(analysis) -> Optional[tuple]:
    """`OvRow`s of the heads whose label the OV qualifier reads, by layer and head; None without an `ov` table."""
    if _table(analysis, "ov") is None:
        return None
    qualified = ov_qualified_labels(analysis.meta)
    return tuple(row for _, row in sorted(ov_lookup(analysis).items()) if row.label in qualified)


def validation_rows(analysis) -> Optional[tuple]:
    """The causal checks of `analysis.validation` (a `headscope.validate` frame, possibly read
    back from CSV), in its row order.

    Returns:
        `ValidationRow`s, or None when the analysis has no `validation` (or it is None).
    """
    frame = _table(analysis, "validation")
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
