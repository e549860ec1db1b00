"""One syntactic score per head: its best margin over the offset baseline, with a bootstrap CI.

Offers:
    THRESHOLD   -- 0.10, the margin for the label ``syntactic:<relation>`` (Voita et al. 2019).
    head_scores -- per head: the (relation, direction) with the largest accuracy - baseline
                   among those with at least ``min_arcs`` arcs, that margin, and a 95%
                   percentile-bootstrap interval over sentences.

The margin criterion is Voita et al. 2019's (a syntactic head beats the most frequent offset
by at least 10 points); accuracy and baseline follow Clark et al. 2019 (see ``scoring``). In
each bootstrap resample the sentences are drawn with replacement and both the head's accuracy
and the best-offset baseline are recomputed on the drawn arcs (the winning offset may change).
"""
from __future__ import annotations

import torch

from headscope.errors import HeadscopeError

from .scoring import DIRECTIONS, Arcs, arc_hits, offset_hits

__all__ = ["head_scores", "THRESHOLD"]

THRESHOLD = 0.10


def head_scores(predictions: torch.Tensor, arcs: Arcs, table, min_arcs: int, threshold: float,
                n_resamples: int = 1000, level: float = 0.95, seed: int = 0):
    """The syntactic score of every head.

    Args:
        predictions: ``[sentence, layer, head, word]`` predicted partners.
        arcs: the arcs ``table`` was computed on.
        table: from ``scoring.accuracy_table``.
        min_arcs: (relation, direction) pairs with fewer arcs are not considered.
        threshold: margin at which a head is labelled ``syntactic:<relation>``.
        n_resamples, level, seed: the percentile bootstrap over sentences.
    Returns:
        DataFrame layer, head, detector ("syntactic"), score (the margin), ci_low, ci_high,
        n (arcs of the chosen relation and direction), relation, direction, label
        ("syntactic:<relation>" when score >= threshold, else "none"); one row per head.
    Raises:
        HeadscopeError: no (relation, direction) has ``min_arcs`` arcs.
    """
    import pandas as pd

    frequent = table[table.n >= min_arcs]
    if frequent.empty:
        most = table.sort_values("n", ascending=False).iloc[0] if len(table) else None
        seen = f"the most is {most.relation} {most.direction} with {most.n}" if most is not None else "none were found"
        raise HeadscopeError(f"no relation has at least {min_arcs} scored arcs ({seen}); "
                             "give more sentences or lower min_arcs")
    margin = frequent.accuracy - frequent.baseline
    chosen = (frequent.assign(score=margin)
              .sort_values(["layer", "head", "score", "n"], ascending=[True, True, False, False], kind="stable")
              .groupby(["layer", "head"], sort=True).head(1).reset_index(drop=True))
    group_of = {(r, d): i * len(DIRECTIONS) + DIRECTIONS.index(d)
                for i, r in enumerate(arcs.relations) for d in DIRECTIONS}
    groups = torch.tensor([group_of[(r, d)] for r, d in zip(chosen.relation, chosen.direction)])  # (LH,)
    low, high = _bootstrap(predictions, arcs, groups, n_resamples, level, seed)
    return pd.DataFrame({
        "layer": chosen.layer.astype(int), "head": chosen["head"].astype(int), "detector": "syntactic",
        "score": chosen.score.astype(float), "ci_low": low.numpy(), "ci_high": high.numpy(),
        "n": chosen.n.astype(int), "relation": chosen.relation, "direction": chosen.direction,
        "label": ["syntactic:" + r if s >= threshold else "none" for r, s in zip(chosen.relation, chosen.score)],
    })


def _bootstrap(predictions, arcs: Arcs, groups: torch.Tensor, n_resamples: int, level: float, seed: int):
    """Percentile interval of each head's margin on its own group, resampling sentences."""
    n_sentences = predictions.shape[0]
    mine = arcs.group[:, None] == groups[None, :]  # (A, LH): arc counts for this head
    hits = arc_hits(predictions, arcs).flatten(1) & mine  # (A, LH)
    per_sentence = lambda values: torch.zeros(n_sentences, values.shape[1], dtype=torch.float64).index_add_(
        0, arcs.sentence, values.double())
    hits_s = per_sentence(hits)  # (S, LH)
    n_s = per_sentence(mine)  # (S, LH)
    offsets = offset_hits(arcs)  # (A, K)
    offsets_s = torch.stack([per_sentence(mine & offsets[:, k:k + 1]) for k in range(offsets.shape[1])], -1)

    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n_sentences, (n_resamples, n_sentences), generator=gen)
    weights = torch.zeros(n_resamples, n_sentences, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64))  # (R, S): times each sentence is drawn
    n = weights @ n_s  # (R, LH)
    accuracy = (weights @ hits_s) / n
    baseline = torch.einsum("rs,shk->rhk", weights, offsets_s).amax(-1) / n  # (R, LH)
    margins = accuracy - baseline  # NaN where a resample drew none of the head's arcs
    alpha = (1 - level) / 2
    return torch.nanquantile(margins, alpha, dim=0), torch.nanquantile(margins, 1 - alpha, dim=0)
