"""`GeometryResult` (what `headscope.geometry` measured) and its tidy tables on disk.

- `GeometryResult`: per-head table, within-layer pair table, the `[N, N]` JS divergence, the
  pruning curve and the settings; light (numpy and pandas only), so `Analysis` can hold one.
- `write_geometry_tables(result, folder)` / `read_geometry_tables(folder)`: a folder of
  heads.csv, pairs.csv, similarity.csv, pruning.csv (when measured) and settings.json. An
  analysis keeps these in its `geometry/` subfolder (`Analysis.save`, `Analysis.load`).
- `removable_heads(curve, rise)`: read off the pruning curve, the most heads removed within a
  loss rise.

similarity.csv is the divergence matrix as a tidy table: one row per pair of heads a < b with
layer_a, head_a, layer_b, head_b, js (bits),
within_layer (exact) or not (top-k approximation, see `headscope.head_geometry.similarity`). The diagonal
(a head against itself) is 0 and not stored.

How heads are indexed in the matrix: the attention layers in the model's order, their heads in
order, i.e. the rows of heads.csv: head h of the i-th attention layer is i * n_heads + h. For a
dense model that is layer * n_heads + head; a hybrid with attention in layers 1 and 3 has layer
1's heads first, then layer 3's, and its tables keep the numbers 1 and 3.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..tables import read_table

__all__ = ["GeometryResult", "write_geometry_tables", "read_geometry_tables", "similarity_table", "removable_heads",
           "GEOMETRY_FOLDER"]

GEOMETRY_FOLDER = "geometry"  # an analysis's subfolder


@dataclass
class GeometryResult:
    """What `headscope.geometry` measured.

    Attributes:
        heads: one row per head: layer, head, kv_head, dim_q/k/v/o, qk_effective_rank,
            ov_effective_rank, cluster, mds_x, mds_y, importance and importance_normalized
            (Michel et al.'s proxy raw and divided by its layer's l2 norm; NaN without a LM loss),
            site (the module path of the head's attention; absent in folders saved before it).
        pairs: within-layer pairs: subspace overlaps, js (bits), redundant.
        divergence: `[n_heads_total, n_heads_total]` mean JS in bits over the attention heads, in
            the order of `heads` (position of the layer in `layers` * H + head; exact within
            layers, top-k approximation across layers).
        approximation_error: mean |approx - exact| JS over within-layer pairs.
        curve: pruning curve (None without a LM loss).
        settings: thresholds, probe sizes, which importance ordered the curve, seconds taken.
    """

    heads: Any
    pairs: Any
    divergence: np.ndarray
    approximation_error: float
    curve: Optional[Any] = None
    settings: dict = field(default_factory=dict)

    @property
    def redundant(self):
        """The pairs flagged redundant."""
        return self.pairs[self.pairs.redundant].reset_index(drop=True)

    @property
    def layers(self) -> tuple[int, ...]:
        """The attention layers measured, in the model's numbering (0..L-1 but in hybrids)."""
        return tuple(sorted(int(l) for l in set(self.heads.layer)))

    @property
    def shape(self) -> tuple[int, int]:
        """(attention layers, heads per layer): the model's (n_layers, n_heads) for a dense model."""
        return len(self.layers), int(self.heads["head"].max()) + 1


def similarity_table(divergence: np.ndarray, n_heads: int, layers: Optional[Sequence[int]] = None):
    """The divergence matrix as tidy rows a < b (see the module docstring).

    Args:
        divergence: `[len(layers) * n_heads]` squared.
        n_heads: heads per layer.
        layers: the model's number of each attention layer, in matrix order (default 0, 1, ...).
    """
    import pandas as pd

    a, b = np.triu_indices(len(divergence), k=1)
    number = np.arange(len(divergence) // n_heads) if layers is None else np.asarray(layers, dtype=int)
    return pd.DataFrame({"layer_a": number[a // n_heads], "head_a": a % n_heads, "layer_b": number[b // n_heads],
                         "head_b": b % n_heads, "js": np.asarray(divergence)[a, b],
                         "within_layer": a // n_heads == b // n_heads})


def write_geometry_tables(result: GeometryResult, folder) -> list[Path]:
    """Write the tables into `folder` (created if missing; no atomicity of its own).

    Returns:
        The paths written.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _, n_heads = result.shape
    written = [folder / "heads.csv", folder / "pairs.csv", folder / "similarity.csv"]
    result.heads.to_csv(written[0], index=False)
    result.pairs.to_csv(written[1], index=False)
    similarity_table(result.divergence, n_heads, result.layers).to_csv(written[2], index=False)
    if result.curve is not None:
        written.append(folder / "pruning.csv")
        result.curve.to_csv(written[-1], index=False)
    written.append(folder / "settings.json")
    written[-1].write_text(json.dumps({"approximation_error": result.approximation_error, "settings": result.settings},
                                      indent=2, default=str))
    return written


def read_geometry_tables(folder) -> GeometryResult:
    """Read a folder written by `write_geometry_tables` (each table shape-checked: `read_table`)."""
    folder = Path(folder)
    heads = read_table(folder / "heads.csv")
    pairs = read_table(folder / "pairs.csv")
    pairs["redundant"] = pairs["redundant"].astype(str).str.lower().eq("true")
    similarity = read_table(folder / "similarity.csv")
    n_heads = int(heads["head"].max()) + 1
    position = {layer: i for i, layer in enumerate(sorted(set(heads.layer)))}  # matrix order (module docstring)
    total = len(heads)
    divergence = np.zeros((total, total))
    a = (similarity.layer_a.map(position) * n_heads + similarity.head_a).to_numpy()
    b = (similarity.layer_b.map(position) * n_heads + similarity.head_b).to_numpy()
    divergence[a, b] = divergence[b, a] = similarity.js.to_numpy()
    curve = read_table(folder / "pruning.csv") if (folder / "pruning.csv").exists() else None
    stored = json.loads((folder / "settings.json").read_text())
    return GeometryResult(heads, pairs, divergence, float(stored["approximation_error"]), curve, stored["settings"])


def removable_heads(curve, rise: float = 0.10) -> dict:
    """Per order (and seed), the most heads removed with loss still within (1 + rise) x baseline."""
    out = {}
    for (name, seed), group in curve.groupby(["order", "seed"]):
        group = group.sort_values("removed")
        limit = group.loss.iloc[0] * (1 + rise)
        above = group[group.loss > limit]
        first_above = above.removed.min() if len(above) else None
        out[(name, seed)] = int(group[group.removed < first_above].removed.max()) if first_above is not None \
            else int(group.removed.max())
    return out
