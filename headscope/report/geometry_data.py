"""The report's geometry section as plain values, from `Analysis.geometry` (tests assert on this).

- `geometry_data(analysis) -> GeometryData | None`: None when the analysis holds no geometry.
- Types: `GeometryData`, `MapPoint` (one head on the MDS map), `ImportanceRow` (a head's rank by
  importance), `LabelRanks` (where each label's heads rank), `PruningLine` (one order of the
  pruning curve), `RedundantPair`.
- `LOSS_RISE`: the loss rise (10%) up to which heads count as removable.

The pruning curve's "importance" order is the one `headscope.geometry` used
(`settings["pruning_order"]`: the raw proxy or its per-layer normalisation); the ranking table
sorts by the same scores. Hover strings are plotly pseudo-HTML: labels in them are escaped here.
"""
from __future__ import annotations

import html
from typing import NamedTuple, Optional

import numpy as np

from ..head_geometry.geometry_result import removable_heads

__all__ = ["GeometryData", "MapPoint", "ImportanceRow", "LabelRanks", "PruningLine", "RedundantPair", "geometry_data",
           "LOSS_RISE", "TOP_IMPORTANT"]

LOSS_RISE = 0.10
TOP_IMPORTANT = 10


class MapPoint(NamedTuple):
    """One head on the MDS map of attention-pattern similarity."""

    layer: int
    head: int
    x: float
    y: float
    label: str  # the head's label in the analysis ("" without a row)
    cluster: int
    importance: float  # by the curve's order; NaN without a LM loss
    rank: int  # 1 = most important by that order; 0 without a LM loss
    hover: str


class ImportanceRow(NamedTuple):
    """A head ranked by importance (1 = most important)."""

    rank: int
    layer: int
    head: int
    label: str
    importance: float  # Michel et al.'s raw proxy E_x |dL/d xi_h|
    importance_normalized: float  # divided by its layer's l2 norm


class LabelRanks(NamedTuple):
    """Where the heads of one label rank by importance (1 = most important, of `n_total`)."""

    label: str
    heads: tuple  # ((layer, head), ...) in rank order
    ranks: tuple  # their ranks, ascending
    n_total: int


class PruningLine(NamedTuple):
    """Loss as heads are removed in one order ("importance", or "random" with its seed)."""

    order: str
    seed: int  # -1 for the importance order
    removed: tuple  # heads removed at each point
    loss: tuple
    removable: int  # most heads removed with loss within (1 + LOSS_RISE) x the unablated loss


class RedundantPair(NamedTuple):
    layer: int
    head_a: int
    head_b: int
    js: float
    overlap: float


class GeometryData(NamedTuple):
    """What the geometry section shows."""

    points: tuple  # MapPoint, layer-major
    importance: Optional[np.ndarray]  # [layer, head] over the model's layers by the curve's order, NaN in a
    # hybrid's layers without attention; None without a LM loss
    importance_kind: str  # "importance" or "importance_normalized"
    ranking: tuple  # ImportanceRow, the TOP_IMPORTANT most important
    label_ranks: tuple  # LabelRanks per label but "none", the label with the best-ranked head first; ()
    # without a LM loss
    curve: tuple  # PruningLine: importance first, then random by seed; () without a curve
    baseline_loss: float  # unablated probe loss (NaN without a curve)
    random_removable_mean: float  # mean over random seeds of PruningLine.removable (NaN without)
    redundant: tuple  # RedundantPair
    n_clusters: int
    approximation_error: float
    settings: dict


def geometry_data(analysis) -> Optional[GeometryData]:
    """The geometry section's data, or None when `analysis.geometry` is None."""
    result = analysis.geometry
    if result is None:
        return None
    heads = result.heads.sort_values(["layer", "head"]).reset_index(drop=True)
    labels = {(int(r.layer), int(r.head)): str(r.label) for r in analysis.labels.itertuples(index=False)}
    kind = str(result.settings.get("pruning_order", "importance"))
    kind = kind if kind in heads else "importance"
    scores = heads[kind].to_numpy(dtype=float)
    has_importance = bool(np.isfinite(scores).any())
    order = np.lexsort((heads["head"].to_numpy(), heads.layer.to_numpy(), -np.nan_to_num(scores, nan=-np.inf)))
    ranks = np.zeros(len(heads), dtype=int)
    if has_importance:
        ranks[order] = np.arange(1, len(heads) + 1)  # ties: lower layer, then lower head first
    points = []
    for row, score, rank in zip(heads.itertuples(index=False), scores, ranks):
        layer, head = int(row.layer), int(row.head)
        label = labels.get((layer, head), "")
        hover = (f"<b>layer {layer} head {head}</b>: {html.escape(label or 'no label')}<br>cluster {int(row.cluster)}"
                 + (f"<br>{kind.replace('_', ' ')} {score:.3g} (rank {rank} of {len(heads)})" if has_importance else ""))
        points.append(MapPoint(layer, head, float(row.mds_x), float(row.mds_y), label, int(row.cluster), float(score),
                               int(rank), hover))
    ranking, label_ranks = (), ()
    if has_importance:
        ranking = tuple(
            ImportanceRow(int(ranks[i]), int(heads.layer[i]), int(heads["head"][i]),
                          labels.get((int(heads.layer[i]), int(heads["head"][i])), ""),
                          float(heads.importance[i]), float(heads.importance_normalized[i]))
            for i in order[:TOP_IMPORTANT])
        by_label: dict = {}
        for p in sorted(points, key=lambda p: p.rank):
            by_label.setdefault(p.label, []).append(p)
        label_ranks = tuple(
            LabelRanks(label, tuple((p.layer, p.head) for p in by_label[label]), tuple(p.rank for p in by_label[label]),
                       len(points))
            for label in by_label if label not in ("none", ""))  # in order of each label's best rank
    curve, baseline, random_mean = _curve(result.curve)
    redundant = tuple(RedundantPair(int(r.layer), int(r.head_a), int(r.head_b), float(r.js), float(r.overlap))
                      for r in result.redundant.itertuples(index=False))
    grid = None
    if has_importance:  # the label map's grid: every layer of the model, blank where there is no attention
        grid = np.full((max(analysis.n_layers, max(result.layers) + 1), result.shape[1]), np.nan)
        grid[heads.layer.to_numpy(), heads["head"].to_numpy()] = scores
    return GeometryData(
        points=tuple(points), importance=grid,
        importance_kind=kind, ranking=ranking, label_ranks=label_ranks, curve=curve, baseline_loss=baseline,
        random_removable_mean=random_mean, redundant=redundant, n_clusters=int(heads.cluster.nunique()),
        approximation_error=float(result.approximation_error), settings=dict(result.settings),
    )


def _curve(frame) -> tuple:
    """(PruningLines, unablated loss, mean removable over random seeds) from the pruning table."""
    if frame is None or not len(frame):
        return (), float("nan"), float("nan")
    removable = removable_heads(frame, LOSS_RISE)
    lines = []
    for (order, seed), group in frame.groupby(["order", "seed"], sort=False):
        group = group.sort_values("removed")
        lines.append(PruningLine(str(order), int(seed), tuple(int(n) for n in group.removed),
                                 tuple(float(v) for v in group.loss), removable[(order, seed)]))
    lines.sort(key=lambda line: (line.order != "importance", line.seed))
    baseline = float(frame[frame.removed == 0].loss.iloc[0])
    random = [line.removable for line in lines if line.order == "random"]
    return tuple(lines), baseline, float(np.mean(random)) if random else float("nan")
