"""Calling a detector from a notebook on a loaded model or on captured patterns.

- `score_loaded(detector, loaded, **analyze_kwargs)`: `headscope.analyze` with one detector.
- `score_patterns(detector, patterns, input_ids=None, attention_mask=None, causal=True)`:
  scores patterns the user captured on their own text.
"""
from __future__ import annotations

import torch

from ..errors import HeadscopeError
from ..probes import ProbeBatch
from .variants import best_variant

__all__ = ["score_loaded", "score_patterns"]


def score_loaded(detector, loaded, **kwargs):
    """Scores DataFrame (layer, head, detector, score, ci_low, ci_high, n) of one detector."""
    from ..pipeline import analyze

    kwargs.setdefault("explorer_examples", 0)
    return analyze(loaded, detectors=[detector.name], **kwargs).scores


def score_patterns(detector, patterns, input_ids=None, attention_mask=None, causal: bool = True,
                   content_start: int = 0):
    """Mean score per head of captured patterns.

    Args:
        detector: a `Detector`.
        patterns: `{layer: [batch, head, query, key]}` (e.g. `cap.patterns`) or one tensor
            (`[batch, head, query, key]` or `[head, query, key]`, reported as layer 0).
        input_ids: `[batch, pos]` tokens the patterns were computed on; needed by detectors
            that compare tokens (induction, duplicate_token).
        attention_mask: `[batch, pos]`, 1 for real tokens (default all real).
        causal: whether the model was causal.
        content_start: index of the first non-special token (1 after a BOS).
    Returns:
        pandas DataFrame layer, head, detector, score (and variant, the head's best one, for
        detectors with variants such as positional).
    """
    import pandas as pd

    layers = patterns if isinstance(patterns, dict) else {0: patterns}
    rows = []
    for layer, pattern in layers.items():
        pattern = pattern[None] if pattern.dim() == 3 else pattern  # (B, H, Q, K)
        b, _, q, _ = pattern.shape
        ids = input_ids
        if ids is None:
            if detector.probe == "repeated":
                raise HeadscopeError(f"detector {detector.name!r} compares tokens: pass input_ids=")
            ids = torch.zeros(b, q, dtype=torch.long)
        ids = torch.as_tensor(ids).reshape(b, q).to(pattern.device)
        mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else torch.as_tensor(attention_mask).bool().to(pattern.device)
        per_example = detector.score(pattern.float(), ProbeBatch(ids, mask, causal, content_start))  # (B, H[, V])
        chosen = {}
        if detector.variants:
            scores, chosen = best_variant({int(layer): per_example}, detector.variants)
            per_example = scores[int(layer)]
        means = per_example.nanmean(dim=0)
        rows += [{"layer": int(layer), "head": h, "detector": detector.name, "score": float(s),
                  **({"variant": chosen[(int(layer), h)]} if chosen else {})}
                 for h, s in enumerate(means.tolist())]
    columns = ["layer", "head", "detector", "score"] + (["variant"] if detector.variants else [])
    return pd.DataFrame(rows, columns=columns)
