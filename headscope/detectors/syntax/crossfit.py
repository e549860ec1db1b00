"""Syntactic heads that survive scrutiny: baselines, a control model and cross-fitting.

Offers:
    score_arcs  -- per (head, relation, direction): accuracy, the best baseline, the control's
                   accuracy, and the held-out margin with its 95% CI and ``significant``; per
                   head: the clearest significant relation (``head_scores``).
    THRESHOLD   -- 0.10, the held-out margin a label needs (Voita et al. 2019's 10 points).

Formulas (``g`` a relation and direction, ``h`` a head, sums over the arcs of ``g``):
    accuracy(g, h) = share of arcs whose predicted partner (word-level argmax, Clark et al. 2019)
        is the gold partner.
    baseline(g) = max( share of arcs each position-only predictor gets right (``baselines``:
        offsets -3..+3, first, last, most-pieces word, nearest content words),
        accuracy(g, h') of the control model's best head h' ).
    margin(g, h) = accuracy(g, h) - baseline(g).
    Cross-fitting: the sentences are split into two seeded halves, and a relation needs
    ``min_arcs`` arcs in each. (g, h) is *chosen on* a half when its margin there is at least
    THRESHOLD or g is h's best relation there; its held-out margin is its margin on the other
    half (both baseline and accuracy recomputed there), averaged over the halves it was chosen
    on, weighted by the measured half's arcs. 95% CI: percentile bootstrap, sentences
    resampled within each half, 1000 resamples, baselines recomputed in each.
    significant = CI lower bound of the held-out margin >= THRESHOLD.
    A head's score is the held-out margin of its chosen (g, h) with the highest CI lower bound;
    its label ``syntactic:<relation>`` needs that triple to be significant.
    Too few arcs (a small treebank: no (g) has ``min_arcs`` arcs in each half): nothing is
    chosen or held out, so no head is labelled; the table still holds every accuracy, baseline
    and control accuracy (on all sentences), each head's row names its pair of largest
    in-sample margin with the score NaN, and a note says why.
Choosing the relation and measuring the margin on different sentences removes the optimism
of taking the best of ~30 relations x directions on the same arcs; the control's best head in
the baseline removes what an untrained network of the same shape gets for free.
"""
from __future__ import annotations

import torch

from ...errors import CannotScore

from .baselines import PREDICTORS
from .report import FEW_ARCS
from ...probes.arcs import DIRECTIONS, Arcs

__all__ = ["score_arcs", "THRESHOLD", "NotEnoughArcs"]

THRESHOLD = 0.10


class NotEnoughArcs(CannotScore):
    """No relation has enough arcs in each half of the sentences to be scored."""


class _Sums:
    """Arc counts per (sentence, group): n ``[S, G]``, model / control hits ``[S, G, LH]``,
    predictor hits ``[S, G, P]``."""

    def __init__(self, arcs: Arcs, n_sentences: int, model, predictors, control):
        groups = arcs.n_groups
        key = arcs.sentence * groups + arcs.group  # (A,)
        size = n_sentences * groups

        def per_key(values):  # (A, C) -> (S, G, C)
            out = torch.zeros(size, values.shape[1]).index_add_(0, key, values.float())
            return out.view(n_sentences, groups, -1)

        self.n = torch.bincount(key, minlength=size).float().view(n_sentences, groups)
        self.model = per_key(model)
        self.predictors = per_key(predictors)
        self.control = per_key(control) if control is not None else None

    def over(self, sentences):
        """Totals over some sentences: n (G,), model (G, LH), best baseline (G,), winner (G,)."""
        n = self.n[sentences].sum(0)
        model = self.model[sentences].sum(0)
        candidates = self.predictors[sentences].sum(0)  # (G, P)
        if self.control is not None:
            candidates = torch.cat([candidates, self.control[sentences].sum(0)], dim=1)  # (G, P + LH)
        best, winner = candidates.max(1)
        return n, model, best, winner


def score_arcs(model_hits: torch.Tensor, arcs: Arcs, n_sentences: int, shape: tuple[int, int],
               predictor_hits: torch.Tensor, control_hits=None, *, min_arcs: int, threshold: float = THRESHOLD,
               seed: int = 0, n_resamples: int = 1000, level: float = 0.95, layers=None):
    """Score every head on every relation and direction, with a control and cross-fitting.

    Args:
        model_hits: ``[arc, layer * head]`` bool, the head's predicted partner is the gold one.
        arcs: the arcs (``scoring.collect_arcs``).
        n_sentences: sentences the arcs come from.
        shape: (layers, heads).
        layers: the model's number of each of those layers (default 0..layers-1; a hybrid's
            attention layers are not).
        predictor_hits: ``[arc, len(PREDICTORS)]`` from ``baselines.predictor_hits``.
        control_hits: ``[arc, layer * head]`` for the control model, or None (no control).
        min_arcs: arcs a (relation, direction) needs in each half.
        threshold: held-out margin for ``significant`` and the label.
        seed: the halves and the bootstrap.
        n_resamples, level: the bootstrap.
    Returns:
        (table, heads, note): ``table`` has layer, head, relation, direction, accuracy, baseline,
        baseline_kind, control_accuracy, n, held_out_margin, ci_low, ci_high, significant,
        causal_only (one row per head and (relation, direction) with arcs; held-out columns
        NaN where the pair was chosen on neither half); ``heads`` has layer, head, detector,
        score, ci_low, ci_high, n, relation, direction, label, control, control_max; ``note``
        is "" or, when no (relation, direction) has ``min_arcs`` arcs in each half, why no
        head has a held-out margin or a label (the scores are then NaN, the accuracies kept).
    Raises:
        NotEnoughArcs: there are no scored arcs at all.
    """
    import pandas as pd

    n_layers, n_heads = shape
    if arcs.sentence.numel() == 0:
        _not_enough(arcs, torch.zeros(2, 0), min_arcs)  # nothing to show
    sums = _Sums(arcs, n_sentences, model_hits, predictor_hits, control_hits)
    order = torch.randperm(n_sentences, generator=torch.Generator().manual_seed(seed))
    halves = (order[: n_sentences // 2].sort().values, order[n_sentences // 2:].sort().values)
    per_half = [sums.over(h) for h in halves]
    counts = torch.stack([p[0] for p in per_half])  # (2, G)
    eligible = (counts >= min_arcs).all(0)  # (G,)
    note = ""
    if not eligible.any():
        note = _few_arcs(arcs, counts, min_arcs, n_sentences, threshold)  # degrade: accuracies, no held-out margin
    margins = torch.stack([model / n.clamp(min=1)[:, None] - (best / n.clamp(min=1))[:, None]
                           for n, model, best, _ in per_half])  # (2, G, LH)
    margins = margins.masked_fill(~eligible[None, :, None], float("-inf"))
    best_group = margins.argmax(1, keepdim=True)  # (2, 1, LH): each head's best pair on each half
    chosen = (margins >= threshold) | torch.zeros_like(margins, dtype=torch.bool).scatter_(1, best_group, True)
    chosen &= eligible[None, :, None]  # (2, G, LH): chosen on half k, measured on half 1 - k
    held_out = _held_out(margins.flip(0), counts.flip(0), chosen)
    low, high = _bootstrap(sums, halves, chosen, n_resamples, level, seed)

    n, model, best, winner = sums.over(torch.arange(n_sentences))
    accuracy = model / n.clamp(min=1)[:, None]  # (G, LH)
    baseline = best / n.clamp(min=1)
    control = sums.control.sum(0) / n.clamp(min=1)[:, None] if sums.control is not None else None
    numbers = torch.arange(n_layers) if layers is None else torch.tensor(list(layers))
    kinds = [_kind(int(w), n_heads, numbers) for w in winner]
    significant = low >= threshold

    layer_of = numbers.repeat_interleave(n_heads).numpy()
    head_of = torch.arange(n_heads).repeat(n_layers).numpy()
    frames = []
    for g in range(arcs.n_groups):
        if n[g] == 0:
            continue
        frames.append(pd.DataFrame({
            "layer": layer_of, "head": head_of,
            "relation": arcs.relations[g // 2], "direction": DIRECTIONS[g % 2],
            "accuracy": accuracy[g].numpy(), "baseline": float(baseline[g]), "baseline_kind": kinds[g],
            "control_accuracy": control[g].numpy() if control is not None else float("nan"),
            "n": int(n[g]), "held_out_margin": held_out[g].numpy(), "ci_low": low[g].numpy(),
            "ci_high": high[g].numpy(), "significant": significant[g].numpy(), "causal_only": arcs.causal_only,
        }))
    table = pd.concat(frames, ignore_index=True).sort_values(["layer", "head", "relation", "direction"],
                                                             ignore_index=True)
    heads = _head_rows(table, threshold, sums.control is not None)
    return table, heads, note


def _held_out(measured_margins, measured_counts, chosen) -> torch.Tensor:
    """``[G, LH]`` arc-weighted mean of the margins on the measured halves (NaN if never chosen)."""
    weights = chosen.float() * measured_counts[:, :, None]  # (2, G, LH)
    total = (weights * measured_margins.masked_fill(~chosen, 0.0)).sum(0)
    return torch.where(chosen.any(0), total / weights.sum(0).clamp(min=1), torch.tensor(float("nan")))


def _bootstrap(sums: _Sums, halves, chosen, n_resamples: int, level: float, seed: int):
    """Percentile interval ``[G, LH]`` of the held-out margin, sentences resampled within halves."""
    gen = torch.Generator().manual_seed(seed + 1)
    weights = []
    for half in halves:
        draws = torch.randint(0, len(half), (n_resamples, len(half)), generator=gen)
        weights.append(torch.zeros(n_resamples, len(half)).scatter_add_(1, draws, torch.ones(draws.shape)))
    groups, lh = chosen.shape[1:]
    low = torch.full((groups, lh), float("nan"))
    high = torch.full((groups, lh), float("nan"))
    alpha = (1 - level) / 2
    for g in torch.nonzero(chosen.any(0).any(1)).flatten().tolist():
        cols = torch.nonzero(chosen[:, g].any(0)).flatten()  # heads chosen on either half
        measured = []
        for half, w in zip(halves, weights):  # margin of each resample on this half, (R, cols)
            n = w @ sums.n[half, g]
            model = w @ sums.model[half, g][:, cols]
            best = (w @ sums.predictors[half, g]).amax(1)
            if sums.control is not None:
                best = torch.maximum(best, (w @ sums.control[half, g]).amax(1))
            measured.append(((model - best[:, None]) / n[:, None], n))
        # chosen on half k -> measured on half 1 - k
        (m0, n0), (m1, n1) = measured
        c0, c1 = chosen[0, g, cols].float(), chosen[1, g, cols].float()
        weight = c0 * n1[:, None] + c1 * n0[:, None]
        value = (c0 * n1[:, None] * m1.nan_to_num() + c1 * n0[:, None] * m0.nan_to_num()) / weight
        low[g, cols] = torch.quantile(value, alpha, dim=0)
        high[g, cols] = torch.quantile(value, 1 - alpha, dim=0)
    return low, high


def _head_rows(table, threshold: float, has_control: bool):
    """One row per head: its chosen pair with the highest held-out CI lower bound."""
    import pandas as pd

    candidates = table[table.held_out_margin.notna()]
    if candidates.empty:  # too few arcs to hold any out: each head's pair of largest in-sample margin, unscored
        return _unscored_head_rows(table, has_control)
    best = (candidates.sort_values(["layer", "head", "ci_low", "held_out_margin", "n"],
                                   ascending=[True, True, False, False, False], kind="stable")
            .groupby(["layer", "head"], sort=True).head(1).reset_index(drop=True))
    if has_control:
        # The control on the same quantity: its heads' accuracy on the head's pair minus the baseline.
        control_best = table.groupby(["relation", "direction"]).control_accuracy.max()
        control = best.control_accuracy - best.baseline
        control_max = [control_best[(r, d)] - b for r, d, b in zip(best.relation, best.direction, best.baseline)]
    else:
        control = control_max = float("nan")
    return pd.DataFrame({
        "layer": best.layer.astype(int), "head": best["head"].astype(int), "detector": "syntactic",
        "score": best.held_out_margin.astype(float), "ci_low": best.ci_low.astype(float),
        "ci_high": best.ci_high.astype(float), "n": best.n.astype(int), "relation": best.relation,
        "direction": best.direction,
        "label": ["syntactic:" + r if s else "none" for r, s in zip(best.relation, best.significant)],
        "control": control, "control_max": control_max,
    })


def _unscored_head_rows(table, has_control: bool):
    """One row per head when nothing could be held out: its (relation, direction) of largest
    in-sample margin (accuracy - baseline, more arcs first on ties), score and CI NaN, no label."""
    import pandas as pd

    best = (table.assign(_margin=table.accuracy - table.baseline)
            .sort_values(["layer", "head", "_margin", "n"], ascending=[True, True, False, False], kind="stable")
            .groupby(["layer", "head"], sort=True).head(1).reset_index(drop=True))
    nan = float("nan")
    if has_control:
        control_best = table.groupby(["relation", "direction"]).control_accuracy.max()
        control = best.control_accuracy - best.baseline
        control_max = [control_best[(r, d)] - b for r, d, b in zip(best.relation, best.direction, best.baseline)]
    else:
        control = control_max = nan
    return pd.DataFrame({
        "layer": best.layer.astype(int), "head": best["head"].astype(int), "detector": "syntactic",
        "score": nan, "ci_low": nan, "ci_high": nan, "n": best.n.astype(int), "relation": best.relation,
        "direction": best.direction, "label": "none", "control": control, "control_max": control_max,
    })


def _few_arcs(arcs: Arcs, counts: torch.Tensor, min_arcs: int, n_sentences: int, threshold: float) -> str:
    fewest = counts.min(0).values
    g = int(fewest.argmax())
    return (f"no relation has the {min_arcs} arcs in each half of the {n_sentences} sentences that the held-out "
            f"significance rule needs (the most is {arcs.relations[g // 2]} {DIRECTIONS[g % 2]} with {int(fewest[g])}), "
            f"so {FEW_ARCS} (its syntactic score is NaN); each head's accuracy, baselines and "
            f"control accuracy per relation are on all sentences (in-sample); give more sentences for labels "
            f"(a margin of {threshold:g} needs about {2 * min_arcs} arcs of a relation)")


def _kind(winner: int, n_heads: int, numbers: torch.Tensor) -> str:
    if winner < len(PREDICTORS):
        return PREDICTORS[winner]
    row, head = divmod(winner - len(PREDICTORS), n_heads)
    return f"control {int(numbers[row])}.{head}"  # the model's layer number


def _not_enough(arcs: Arcs, counts: torch.Tensor, min_arcs: int):
    """Raised only when there is no scored arc at all (fewer than ``min_arcs`` degrade instead)."""
    raise NotEnoughArcs("the treebank sentences have no scored dependency arc (none were found: root and punct arcs "
                        "are not scored, and a causal model scores an arc only towards an earlier word); "
                        "give sentences with dependency arcs")
