"""The report's composition section as plain values, from an analysis's `composition` table (tests assert on this).

- `composition_data(analysis) -> CompositionData | None`: None when the analysis holds no
  composition table (`headscope.add_composition`).
- Types: `CompositionData`, `CompositionMap` (one kind's `[source head, destination head]` z grid),
  `CompositionPair` (one row of the top pairs).
- `TOP_PAIRS`: pairs listed, by z over every kind.

Heads on the maps' axes are the analysis's attention heads in layer order, named "layer.head";
a cell holds z where the source's layer is earlier than the destination's, NaN elsewhere.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ..detectors.section import analysis_table

__all__ = ["CompositionData", "CompositionMap", "CompositionPair", "composition_data", "TOP_PAIRS", "KIND_NAMES"]

TOP_PAIRS = 15
KIND_NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}


class CompositionMap(NamedTuple):
    """One kind's z of every pair: rows the source (earlier) heads, columns the destination heads."""

    kind: str
    heads: tuple  # ((layer, head), ...) in layer order: both axes
    z: np.ndarray  # [len(heads), len(heads)], NaN where the pair is not earlier -> later or has no score
    baseline: float  # the random baseline's mean score (the first pair's: one per shape, the same in most models)
    baseline_std: float


class CompositionPair(NamedTuple):
    """One pair among the strongest by z."""

    kind: str
    src_layer: int
    src_head: int
    src_label: str  # the head's label in the analysis ("" without a row)
    dst_layer: int
    dst_head: int
    dst_label: str
    score: float
    baseline: float
    z: float


class CompositionData(NamedTuple):
    """What the composition section shows."""

    maps: tuple  # CompositionMap per kind, in the table's order
    top: tuple  # CompositionPair, the TOP_PAIRS highest z over every kind
    settings: dict  # meta["composition"]: kinds, rotary_offsets, baseline_samples, seed, seconds


def composition_data(analysis) -> Optional[CompositionData]:
    """The section's data, or None when the analysis has no `composition` table."""
    table = analysis_table(analysis, "composition")
    if table is None or not len(table):
        return None
    labels = {(int(r.layer), int(r.head)): str(r.label) for r in analysis.labels.itertuples(index=False)}
    heads = sorted({(int(l), int(h)) for l, h in zip(table.src_layer, table.src_head)}
                   | {(int(l), int(h)) for l, h in zip(table.dst_layer, table.dst_head)})
    index = {head: i for i, head in enumerate(heads)}
    maps = []
    for kind in dict.fromkeys(table.kind):
        rows = table[table.kind == kind]
        grid = np.full((len(heads), len(heads)), np.nan)
        src = [index[(int(l), int(h))] for l, h in zip(rows.src_layer, rows.src_head)]
        dst = [index[(int(l), int(h))] for l, h in zip(rows.dst_layer, rows.dst_head)]
        grid[src, dst] = rows.z.to_numpy(dtype=float)
        maps.append(CompositionMap(str(kind), tuple(heads), grid, float(rows.baseline.iloc[0]),
                                   float(rows.baseline_std.iloc[0])))
    ranked = table[np.isfinite(table.z.to_numpy(dtype=float))].sort_values(
        ["z", "kind", "src_layer", "src_head", "dst_layer", "dst_head"],
        ascending=[False, True, True, True, True, True]).head(TOP_PAIRS)
    top = []
    for r in ranked.itertuples(index=False):
        src, dst = (int(r.src_layer), int(r.src_head)), (int(r.dst_layer), int(r.dst_head))
        top.append(CompositionPair(str(r.kind), *src, labels.get(src, ""), *dst, labels.get(dst, ""),
                                   float(r.score), float(r.baseline), float(r.z)))
    return CompositionData(tuple(maps), tuple(top), dict(analysis.meta.get("composition") or {}))
