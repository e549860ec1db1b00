"""Word-level attention, predicted partners, dependency arcs and per-relation accuracy.

Offers:
    word_attention       -- token attention -> word attention (Clark et al. 2019, section 4.1).
    predicted_partners   -- the word each word attends to most, own word and special tokens out.
    offset_baseline      -- best fixed offset in -3..+3 per relation and direction.
    best_heads           -- the best head per relation (Clark et al.'s Table 1).
    OFFSETS, MIN_ARCS (30: arcs a relation and direction need in each
    half of the sentences)

Formulas:
    to a word:   W[i, j] = sum over pieces q of word j of  A_word-i[q]
    from a word: A_word-i = mean over pieces p of word i of the token row A[p, :]
    so W = P^T A S with S[t, j] = 1 if token t is a piece of word j, P = S with each column
    divided by its number of pieces. Rows of W sum to at most 1; special tokens have no column
    and are dropped, not renormalised. Before the argmax W[i, i] = 0.
    accuracy(head, relation, direction) = share of arcs with argmax_j W[attending, j] = partner;
    "dep->head": the dependent attends (partner = its head); "head->dep": the head attends.
    Root arcs and punct arcs are not scored. In a causal model an arc is scored in a direction
    only when the partner precedes the attending word (a causal head cannot look ahead).
    offset baseline(relation, direction) = max over offsets k in -3..+3, k != 0, of the share of
    arcs with partner = attending + k (Clark et al.'s baseline; the baseline a head must beat
    adds other position-only predictors and a control model, see ``baselines`` and ``crossfit``).
"""
from __future__ import annotations

import torch

from ...probes.arcs import DIRECTIONS, Arcs

__all__ = ["word_attention", "predicted_partners", "offset_baseline", "arc_hits", "offset_hits", "best_heads",
           "OFFSETS", "MIN_ARCS"]

# Offsets in the order ties are broken: nearer first, then the left one.
OFFSETS = (-1, 1, -2, 2, -3, 3)
MIN_ARCS = 30  # per half: fewer arcs give accuracies too noisy to rank heads by


def word_attention(pattern: torch.Tensor, token_words: torch.Tensor, n_words: int) -> torch.Tensor:
    """Word-to-word attention: sum over the pieces attended to, mean over the attending pieces.

    Args:
        pattern: ``[batch, head, query, key]`` token attention.
        token_words: ``[batch, token]`` long, the word of each token or -1 (special token,
            padding); tokens at -1 lose their row and column.
        n_words: number of word slots (the longest sentence's word count).
    Returns:
        ``[batch, head, word_from, word_to]``; a word without tokens has an all-zero row and
        column.
    """
    pieces = _piece_matrix(token_words, n_words).to(pattern)  # (B, T, W)
    counts = pieces.sum(1, keepdim=True).clamp(min=1)  # (B, 1, W)
    to_words = torch.einsum("bhqk,bkw->bhqw", pattern, pieces)  # (B, H, T, W)
    return torch.einsum("bqv,bhqw->bhvw", pieces / counts, to_words)  # (B, H, W, W)


def predicted_partners(words_attention: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """For each word, the other word it attends to most.

    Args:
        words_attention: ``[batch, head, word, word]`` from ``word_attention``; not modified.
        present: ``[batch, word]`` bool, words that own at least one token.
    Returns:
        ``[batch, head, word]`` long; the attending word's own column counts as 0 and absent
        words never win (ties go to the first word).
    """
    scores = words_attention.clone()
    scores.diagonal(dim1=-2, dim2=-1).zero_()
    scores = scores.masked_fill(~present[:, None, None, :], -1.0)
    return scores.argmax(-1)


def _piece_matrix(token_words: torch.Tensor, n_words: int) -> torch.Tensor:
    """``[batch, token, word]`` 0/1: token t is a piece of word j."""
    valid = token_words >= 0
    one_hot = torch.nn.functional.one_hot(token_words.clamp(min=0), n_words)  # (B, T, W)
    return (one_hot * valid[..., None]).float()


def offset_hits(arcs: Arcs) -> torch.Tensor:
    """``[arc, offset]`` bool: partner = attending + OFFSETS[k]."""
    delta = arcs.partner - arcs.attending
    return delta[:, None] == torch.tensor(OFFSETS)[None, :]


def offset_baseline(arcs: Arcs):
    """The best fixed offset per relation and direction.

    Args:
        arcs: from ``collect_arcs``.
    Returns:
        DataFrame relation, direction, n, baseline (accuracy of the best offset),
        baseline_offset, and acc_<k> for each offset (e.g. ``acc_-1``); ties go to the
        nearer offset, then the left one.
    """
    import pandas as pd

    n = torch.bincount(arcs.group, minlength=arcs.n_groups)  # (G,)
    hits = torch.zeros(arcs.n_groups, len(OFFSETS)).index_add_(0, arcs.group, offset_hits(arcs).float())
    shares = hits / n.clamp(min=1)[:, None]  # (G, K)
    best = shares.argmax(1)  # first maximum = preferred offset on ties
    rows = []
    for group in range(arcs.n_groups):
        if n[group] == 0:
            continue
        relation, direction = divmod(group, len(DIRECTIONS))
        row = {"relation": arcs.relations[relation], "direction": DIRECTIONS[direction], "n": int(n[group]),
               "baseline": float(shares[group, best[group]]), "baseline_offset": OFFSETS[int(best[group])]}
        row.update({f"acc_{k:+d}": float(shares[group, i]) for i, k in enumerate(OFFSETS)})
        rows.append(row)
    return pd.DataFrame(rows)


def arc_hits(predictions: torch.Tensor, arcs: Arcs) -> torch.Tensor:
    """``[arc, layer, head]`` bool: the head's predicted partner is the gold partner.

    Args:
        predictions: ``[sentence, layer, head, word]`` predicted partners (padding -1).
        arcs: from ``collect_arcs``.
    """
    predicted = predictions[arcs.sentence, :, :, arcs.attending]  # (A, L, H)
    return predicted == arcs.partner[:, None, None]


def best_heads(table, min_arcs: int):
    """The most accurate head per relation over both directions (Clark et al. 2019, Table 1).

    Args:
        table: the per-pair table of ``crossfit.score_arcs``.
        min_arcs: only (relation, direction) pairs with at least this many arcs compete (all
            pairs when none has that many: a small treebank still shows its best heads).
    Returns:
        DataFrame relation, layer, head, direction, accuracy, baseline_kind, baseline_accuracy,
        held_out_margin, significant, n; most frequent relation first. Ties go to the lower
        layer, head.
    """
    frequent = table[table.n >= min_arcs]
    if frequent.empty:
        frequent = table
    ordered = frequent.sort_values(["relation", "accuracy", "layer", "head"], ascending=[True, False, True, True],
                                   kind="stable")
    best = ordered.groupby("relation", sort=False).head(1).rename(columns={"baseline": "baseline_accuracy"})
    n_by_relation = table.drop_duplicates(["relation", "direction"]).groupby("relation").n.sum()
    best = best.assign(_total=best.relation.map(n_by_relation)).sort_values(["_total", "relation"],
                                                                            ascending=[False, True])
    columns = ["relation", "layer", "head", "direction", "accuracy", "baseline_kind", "baseline_accuracy",
               "held_out_margin", "significant", "n"]
    return best[columns].reset_index(drop=True)
