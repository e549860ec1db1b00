"""Turning detector scores into one label per head.

A head passes a detector when its value reaches the detector's threshold, the value being the
mean score (``gate="score"``) or, for detectors whose score is itself a held-out estimate (the
syntactic detector), its 95% CI lower bound (``gate="ci_low"``). A detector that claims a
*learned* behaviour (every built-in one but sink and uniform) also needs the head's CI lower
bound to be above ``control_max``, the best score any head of the untrained control model
reaches on the same probes (``headscope.loading.control``): a max-statistic rule, so a head of an
untrained network of the same shape passes only by beating all L x H heads of another one,
and with the lower bound rather than the mean it is conservative. Without a control
(``control_max`` missing or NaN) only the threshold applies.

Among the detectors a head passes, its label is the one passed most clearly, measured as the
share of the way from the threshold to a perfect score: clarity = (value - threshold) /
(1 - threshold). Detectors with ``learned=False`` (sink, uniform) describe resting behaviours: a
head that passes one of them and a detector with ``outranks_resting`` (induction and
duplicate-token, measured on the repeated-token probe) is labelled by the latter, since LLM
induction heads rest on the first token of natural text without repeats. Otherwise the clearest
wins, so a sink head stays a sink even if the little attention it has left happens to follow
syntax. When the two clearest
candidates differ in clarity by less than `MIXED_MARGIN` the label is "mixed"; when the head
passes nothing it is "none". Every passing detector is listed in `labels` (";"-joined),
clearest first. A label's `score` is the detector's score (mean or held-out margin).

OV qualifier (`ov_qualifier`): the label of a detector with `ov_qualified` (induction and
duplicate-token) says where a head looks, not what it writes. Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits") read
copying off the OV circuit W_E W_V W_O W_U: a copying head's circuit has mostly positive
eigenvalues (`headscope.head_geometry.ov_circuit`, positive_eig_share). Such a head is qualified "copies" when
its share is at least `OV_COPIES_SHARE` (0.9) and above the control twin's best head, else
"no OV copying". 0.9 because random circuits score 0.3-0.5 (0.33-0.36 measured on random-init
models) and Elhage et al.'s copying heads sit near 1; the control clause is the same
max-statistic rule the labels use. The qualifier never changes a label. `ov_qualified_labels(meta)`
names the detectors it reads, as an analysis recorded them (`meta["detectors"]`) or as registered.
"""
from __future__ import annotations

import math
from typing import Optional

from ..tables import LABEL_COLUMNS
from .registry import detector_specs

__all__ = ["label_heads", "passes", "ov_qualifier", "ov_qualifiers", "ov_qualified_labels", "ov_control_best",
           "MIXED_MARGIN", "OV_COPIES_SHARE"]

MIXED_MARGIN = 0.05
OV_COPIES_SHARE = 0.9  # positive eigenvalue share a copying head reaches (random circuits: 0.3-0.5)


def ov_qualified_labels(meta: Optional[dict] = None) -> tuple:
    """Names of the detectors whose labels claim a head copies what it attends to (`Detector.ov_qualified`).

    Args:
        meta: an analysis's metadata: its recorded detectors (`registry.detector_specs`; the
            registered description fills in what an older analysis did not record). None: the
            registered detectors.
    """
    return tuple(name for name, spec in detector_specs(meta).items() if spec.get("ov_qualified"))


def ov_qualifier(label: str, share: float, control_best: float = float("nan"), qualified=None) -> str:
    """"copies", "no OV copying", or "" for labels the OV circuit does not qualify.

    Args:
        label: the head's label.
        share: its OV circuit's positive eigenvalue share (NaN: not computed -> "").
        control_best: the control twin's highest share over heads (NaN: no control).
        qualified: the labels the qualifier reads (default: `ov_qualified_labels()`).
    """
    if label not in (ov_qualified_labels() if qualified is None else qualified) or math.isnan(share):
        return ""
    copies = share >= OV_COPIES_SHARE and (math.isnan(control_best) or share > control_best)
    return "copies" if copies else "no OV copying"


def ov_control_best(ov) -> float:
    """The control twin's highest positive eigenvalue share over heads in an OV table (NaN: no control)."""
    control = ov["control_positive_eig_share"].dropna() if "control_positive_eig_share" in ov else ()
    return float(control.max()) if len(control) else float("nan")


def ov_qualifiers(labels, ov, qualified=None) -> dict:
    """{(layer, head): qualifier} for every head `ov_qualifier` qualifies.

    Args:
        labels: `Analysis.labels` (layer, head, label).
        ov: `Analysis.ov` (layer, head, positive_eig_share, control_positive_eig_share), or None.
        qualified: the labels the qualifier reads (default: `ov_qualified_labels()`).
    Returns:
        {} without an OV table; the control's best head is its highest share over all heads.
    """
    if ov is None:
        return {}
    qualified = ov_qualified_labels() if qualified is None else tuple(qualified)
    best = ov_control_best(ov)
    share = {(int(l), int(h)): float(s) for l, h, s in zip(ov["layer"], ov["head"], ov["positive_eig_share"])}
    out = {}
    for layer, head, label in zip(labels["layer"], labels["head"], labels["label"].astype(str)):
        qualifier = ov_qualifier(label, share.get((int(layer), int(head)), float("nan")), best, qualified)
        if qualifier:
            out[(int(layer), int(head))] = qualifier
    return out


def passes(rule, score: float, ci_low: float, control_max: float) -> bool:
    """Whether one head's scores earn a detector's label (see the module docstring).

    Args:
        rule: the detector (threshold, learned, gate).
        score, ci_low: the head's score and the lower bound of its 95% CI.
        control_max: the control model's best score for this detector (NaN: no control).
    """
    value = ci_low if rule.gate == "ci_low" else score
    if not value >= rule.threshold:  # NaN never passes
        return False
    if rule.learned and not math.isnan(control_max):
        return ci_low > control_max
    return True


def label_heads(scores, rules: dict, names: dict | None = None):
    """One row per head: layer, head, label, score, labels.

    Args:
        scores: DataFrame with layer, head, detector, score and, when there was a control,
            ci_low and control_max.
        rules: detector name -> the detector (threshold, learned, gate, outranks_resting).
        names: {(layer, head, detector): label} to show instead of the detector name
            (e.g. "syntactic:obj").
    Returns:
        pandas DataFrame sorted by layer and head.
    """
    import pandas as pd

    names = names or {}
    nan = [float("nan")] * len(scores)
    low = scores["ci_low"].tolist() if "ci_low" in scores else nan
    ceiling = scores["control_max"].tolist() if "control_max" in scores else nan
    by_head: dict[tuple[int, int], list[tuple]] = {}  # plain dicts: pandas groupby cost 90 ms
    for layer, head, det, score, ci_low, control_max in zip(
            scores["layer"].tolist(), scores["head"].tolist(), scores["detector"].tolist(), scores["score"].tolist(),
            low, ceiling):
        by_head.setdefault((int(layer), int(head)), []).append((det, float(score), float(ci_low), float(control_max)))
    rows = []
    for (layer, head), group in sorted(by_head.items()):
        passing = []
        for det, score, ci_low, control_max in group:
            rule = rules[det]
            if passes(rule, score, ci_low, control_max):
                value = ci_low if rule.gate == "ci_low" else score
                clarity = (value - rule.threshold) / max(1e-9, 1 - rule.threshold)
                passing.append((clarity, names.get((layer, head, det), det), score, det))
        passing.sort(reverse=True)
        resting = any(not rules[p[3]].learned for p in passing)
        outranking = [p for p in passing if rules[p[3]].outranks_resting]
        candidates = outranking if resting and outranking else passing
        if not candidates:
            known = [score for _, score, _, _ in group if score == score]
            label, score = "none", max(known) if known else float("nan")
        elif len(candidates) > 1 and candidates[0][0] - candidates[1][0] < MIXED_MARGIN:
            label, score = "mixed", candidates[0][2]
        else:
            label, score = candidates[0][1], candidates[0][2]
        rows.append({"layer": layer, "head": head, "label": label, "score": score,
                     "labels": ";".join(p[1] for p in passing)})
    return pd.DataFrame(rows, columns=LABEL_COLUMNS)
