"""Turning detector scores into one label per head.

A head passes a detector when its mean score is at least the detector's threshold. Among the
detectors it passes, its label is the one passed most clearly, measured as the share of the
way from the threshold to a perfect score: clarity = (score - threshold) / (1 - threshold).
"sink" and "uniform" are resting behaviours: a head that passes a specific detector (induction,
previous-token, ...) on one probe and rests on the first token of another (as LLM induction
heads do on text without repeats) is labelled by the specific one. On one probe both cannot
pass together, since a row of attention sums to 1. When the two clearest candidates differ by
less than `MIXED_MARGIN` the label is "mixed"; when the head passes nothing it is "none".
Every passing detector is listed in `labels` (";"-joined), clearest first.
"""
from __future__ import annotations

__all__ = ["label_heads", "MIXED_MARGIN", "RESTING"]

MIXED_MARGIN = 0.05
RESTING = frozenset({"sink", "uniform"})


def label_heads(scores, thresholds: dict[str, float]):
    """One row per head: layer, head, label, score, labels.

    Args:
        scores: DataFrame with layer, head, detector, score.
        thresholds: detector -> threshold (labels like "syntactic:obj" use their prefix's).
    Returns:
        pandas DataFrame sorted by layer and head.
    """
    import pandas as pd

    rows = []
    for (layer, head), group in scores.groupby(["layer", "head"], sort=True):
        passing = []
        for det, score in zip(group.detector, group.score):
            threshold = thresholds[det.split(":")[0]]
            if score == score and score >= threshold:  # NaN never passes
                clarity = (score - threshold) / max(1e-9, 1 - threshold)
                passing.append((clarity, det, float(score)))
        passing.sort(reverse=True)
        candidates = [p for p in passing if p[1] not in RESTING] or passing
        if not candidates:
            label, score = "none", float(group.score.max()) if group.score.notna().any() else float("nan")
        elif len(candidates) > 1 and candidates[0][0] - candidates[1][0] < MIXED_MARGIN:
            label, score = "mixed", candidates[0][2]
        else:
            label, score = candidates[0][1], candidates[0][2]
        rows.append({"layer": int(layer), "head": int(head), "label": label, "score": score,
                     "labels": ";".join(det for _, det, _ in passing)})
    return pd.DataFrame(rows, columns=["layer", "head", "label", "score", "labels"])
