"""Detectors that score several variants at once (e.g. `positional`, one per offset).

Such a detector's `fn` returns `[batch, head, variant]`. Each head keeps the variant with the
highest mean over probe examples, and its per-example scores become those of that variant, so
the rest of the pipeline (bootstrap, control, labels) sees one score per head as for any other
detector. The choice is made on the same examples the score is measured on, which biases the
score up a little (a max over variants); the control twin goes through the same choice, so its
best head carries the same bias.

- `best_variant(per_layer, variants)`: the chosen variant's scores and the label suffixes.
"""
from __future__ import annotations

import torch

__all__ = ["best_variant"]


def best_variant(per_layer: dict[int, torch.Tensor], variants: tuple[str, ...]):
    """Keep each head's best variant.

    Args:
        per_layer: `{layer: [example, head, variant]}` per-example scores (NaN where a variant
            has no query, e.g. a forward offset in a causal model).
        variants: the detector's variant suffixes, in the order of the last axis.
    Returns:
        `({layer: [example, head]}, {(layer, head): variant})`.
    """
    scores, chosen = {}, {}
    for layer, values in per_layer.items():
        means = values.nanmean(dim=0).nan_to_num(nan=-float("inf"))  # (H, V); all-NaN variants never win
        best = means.argmax(dim=-1)  # (H,)
        scores[layer] = values.gather(-1, best[None, :, None].expand(values.shape[0], -1, 1)).squeeze(-1)
        chosen.update({(layer, head): variants[int(v)] for head, v in enumerate(best.tolist())})
    return scores, chosen
