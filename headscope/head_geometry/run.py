"""Heads as subspaces and as patterns, together: which heads differ, which are copies, which matter.

- `geometry(loaded, ...)` -> `GeometryResult`: subspace overlaps and circuit ranks from the
  weights (`headscope.head_geometry.subspaces`), pairwise JS divergence of patterns on the text probe with an
  MDS map and clusters (`headscope.head_geometry.similarity`), redundant pairs, and for causal LMs Michel et
  al.'s importance and the pruning curve (`headscope.head_geometry.importance`).
- `redundant_pairs(subspace_pairs, divergence, n_heads, js_max, overlap_min, layers)`: within-layer
  pairs with their JS, flagged redundant when JS <= js_max bits AND overlap >= overlap_min.
- `attention_modules(model)`: `[(layer, MultiHeadAttention)]` of the attention layers.
- `plot_geometry(result)`: the MDS map coloured by cluster, sized by importance (plotly).
- `write_geometry(result, out)`: the tables (`headscope.head_geometry.geometry_result`) and geometry.html in `out`.

Hybrids (attention in some layers only, `Loaded.attention_layers`): every table holds the
attention layers under the model's own numbers, the divergence matrix is over their heads in
order (`headscope.head_geometry.geometry_result`), importance and the pruning curve cover attention
heads only.

Redundancy thresholds (defaults): JS <= 0.05 bits (max 1) means the two heads' rows are nearly
the same distribution; overlap >= 0.5, the mean over Q, K, V, O of the mean squared cosine of
principal angles (roles whose subspace is empty for either head are skipped), is at least half
way to identical subspaces and far above chance d_head / d_model for models with many heads.
Both are needed: random small-init heads all attend near-uniformly (JS ~ 0) yet read and write
unrelated subspaces; heads may also reach the same pattern from different subspaces.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..checks import check_count, check_loaded
from ..errors import HeadscopeError
from ..attention.module import MultiHeadAttention
from ..hf.adapters import attention_blocks
from ..tables import with_sites
from .geometry_result import GeometryResult, write_geometry_tables
from .importance import head_importance, normalize_per_layer, pruning_curve
from ..probes.base import text_probe
from .similarity import average_linkage_clusters, classical_mds, pattern_divergence
from .subspaces import subspace_tables

__all__ = ["geometry", "GeometryResult", "redundant_pairs", "plot_geometry", "write_geometry", "attention_modules"]

JS_MAX, OVERLAP_MIN, CLUSTER_THRESHOLD = 0.05, 0.5, 0.3


def attention_modules(model) -> list[tuple[int, MultiHeadAttention]]:
    """`(layer, MultiHeadAttention)` holding the weights of each attention block of a Hugging Face
    model, under the model's layer numbers (a hybrid's attention layers only)."""
    return [(layer, MultiHeadAttention.from_hf(block, model.config, layer)) for layer, block in attention_blocks(model)]


def redundant_pairs(subspace_pairs, divergence: np.ndarray, n_heads: int, js_max: float = JS_MAX,
                    overlap_min: float = OVERLAP_MIN, layers: Optional[Sequence[int]] = None):
    """Add `js` and `redundant` to the within-layer pair table (a copy).

    Args:
        layers: the model's numbers of the divergence matrix's layers, in order (default 0, 1, ...).
    """
    pairs = subspace_pairs.copy()
    position = pairs.layer if layers is None else pairs.layer.map({int(l): i for i, l in enumerate(layers)})
    a = position * n_heads + pairs.head_a
    b = position * n_heads + pairs.head_b
    pairs["js"] = np.asarray(divergence)[a.to_numpy(), b.to_numpy()]
    pairs["redundant"] = (pairs.js <= js_max) & (pairs.overlap >= overlap_min)  # overlap: roles with empty bases skipped
    return pairs


def geometry(loaded, n_examples: int = 8, seq_len: int = 128, batch_size: int = 4, top_k: int = 8,
             cluster_threshold: float = CLUSTER_THRESHOLD, js_max: float = JS_MAX, overlap_min: float = OVERLAP_MIN,
             importance: bool = True, pruning_steps: int = 10, seeds: Sequence[int] = (0, 1, 2),
             normalize: bool = False) -> GeometryResult:
    """Subspaces, pattern similarity, redundancy and importance of every attention head of `loaded`.

    A hybrid's layers without attention are left out; its tables keep the model's layer numbers.

    Args:
        loaded: a `headscope.Loaded` of a family with a `from_hf` adapter.
        n_examples, seq_len, batch_size: the text probe (natural English windows).
        top_k: keys per row kept for cross-layer JS (see `headscope.head_geometry.similarity`).
        cluster_threshold: average-linkage clusters merge while mean JS < this (bits).
        js_max, overlap_min: redundancy thresholds (module docstring).
        importance: compute Michel et al.'s importance and the pruning curve (causal LMs only).
        pruning_steps, seeds: points and random orders of the pruning curve.
        normalize: order the pruning curve by the importance normalised per layer
            (`headscope.head_geometry.importance.normalize_per_layer`, as Michel et al. prune) instead of the
            raw proxy. Both are always in `heads` (importance, importance_normalized).
    Returns:
        A `GeometryResult`.
    """
    check_loaded(loaded, "geometry")
    for name, value in (("n_examples", n_examples), ("batch_size", batch_size), ("top_k", top_k)):
        check_count(name, value)
    check_count("seq_len", seq_len, least=2)
    if importance:
        check_count("pruning_steps", pruning_steps)
    started = time.perf_counter()
    layers, modules = zip(*attention_modules(loaded.model))  # a hybrid's attention layers only
    if layers != loaded.attention_layers:
        raise HeadscopeError(f"{loaded.name}'s adapter finds attention in layers {', '.join(map(str, layers))}, "
                             f"its captures in {', '.join(map(str, loaded.attention_layers))}")
    subspace_pairs, heads = subspace_tables(modules, layers)
    probe = text_probe(loaded.tokenizer, n_examples, seq_len)
    acc = pattern_divergence(loaded, probe, batch_size, top_k)
    js = acc.divergence().numpy()
    heads["cluster"] = average_linkage_clusters(js, cluster_threshold)
    coords = classical_mds(np.sqrt(js))  # sqrt(JS) is a metric
    heads["mds_x"], heads["mds_y"] = coords[:, 0], coords[:, 1]
    curve = None
    heads["importance"] = heads["importance_normalized"] = np.nan
    if importance and loaded.causal:
        scores = head_importance(loaded, probe, batch_size)
        heads["importance"] = scores.ravel()
        heads["importance_normalized"] = normalize_per_layer(scores).ravel()
        if pruning_steps:
            order = normalize_per_layer(scores) if normalize else scores
            curve = pruning_curve(loaded, probe, order, pruning_steps, list(seeds), batch_size)
    pairs = redundant_pairs(subspace_pairs, js, loaded.n_heads, js_max, overlap_min, layers)
    settings = dict(n_examples=n_examples, seq_len=seq_len, top_k=top_k, cluster_threshold=cluster_threshold,
                    js_max=js_max, overlap_min=overlap_min, batch_size=batch_size,
                    pruning_order="importance_normalized" if normalize else "importance", seeds=list(seeds),
                    seconds=round(time.perf_counter() - started, 2))
    heads = with_sites(heads, loaded.site_names)  # each head's attention module, as an analysis's tables name it
    return GeometryResult(heads, pairs, js, acc.approximation_error(), curve, settings)


def plot_geometry(result: GeometryResult):
    """The MDS map of heads: each head a point placed by its attention-pattern similarity.

    Args:
        result: what `headscope.geometry` returns.
    Returns:
        A plotly `go.Figure` (colour: cluster; size: importance when measured).
    """
    import plotly.graph_objects as go

    if not isinstance(result, GeometryResult):
        raise HeadscopeError(f"plot_geometry takes what headscope.geometry returns, got {type(result).__name__}")
    heads = result.heads
    imp = heads.importance.to_numpy(dtype=float)
    size = 8 + 22 * imp / np.nanmax(imp) if np.isfinite(imp).any() and np.nanmax(imp) > 0 else 10
    text = [f"{r.layer}.{r.head} cluster {r.cluster} importance {r.importance:.3g}" for r in heads.itertuples()]
    fig = go.Figure(go.Scatter(x=heads.mds_x, y=heads.mds_y, mode="markers", text=text, hoverinfo="text",
                               marker=dict(color=heads.cluster, size=size, colorscale="Turbo", showscale=False)))
    fig.update_layout(title="Heads by attention-pattern similarity (classical MDS of sqrt JS)",
                      xaxis_title="MDS 1", yaxis_title="MDS 2")
    return fig


def write_geometry(result: GeometryResult, out) -> list:
    """Write heads.csv, pairs.csv, similarity.csv, pruning.csv (when measured), settings.json and
    geometry.html into folder `out`."""
    from pathlib import Path

    out = Path(out)
    written = write_geometry_tables(result, out)
    written.append(out / "geometry.html")
    plot_geometry(result).write_html(written[-1], include_plotlyjs=True, div_id="headscope-geometry")
    return written
