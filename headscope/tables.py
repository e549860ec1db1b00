"""The columns of the tables an analysis saves, and the validation table's CSV form.

- `SCORE_COLUMNS`: the scores table (a detector's `Finding.rows`, `Analysis.scores`).
- `LABEL_COLUMNS`: the labels table (`headscope.detectors.labels.label_heads`, `Analysis.labels`).
- `SITE`, `with_sites(frame, modules)`: an analysis's tables name each head's attention site,
  the module path of its layer's attention (`headscope.hf.sites.Site.name`), in a last column
  `site` beside `layer` and `head`; `Analysis.scores` and `.labels` are the columns above plus it.
- `VALIDATION_COLUMNS`, `write_csv(frame, path)`, `read_csv(path)`: the table of
  `headscope.validate` (`Analysis.validation`), saved and loaded without mangling it; its
  `sites` names the module of each of `heads` (";"-joined in the same order).

No torch and no headscope import: the detectors, `headscope.causal` and the `Analysis` reading
a saved folder (`headscope report`, which needs no model) all share these.
"""
from __future__ import annotations

__all__ = ["SCORE_COLUMNS", "LABEL_COLUMNS", "SITE", "with_sites", "VALIDATION_COLUMNS", "write_csv", "read_csv"]

SCORE_COLUMNS = ["layer", "head", "detector", "score", "ci_low", "ci_high", "n", "control", "control_max"]
LABEL_COLUMNS = ["layer", "head", "label", "score", "labels"]
SITE = "site"  # the column naming a head's attention module (its module path)
VALIDATION_COLUMNS = [
    "label", "mode", "primary", "metric", "probe", "heads", "n_heads", "baseline", "ablated", "delta",
    "baseline_accuracy", "ablated_accuracy", "random_deltas", "random_mean", "random_max", "ratio",
    "hurts_more", "random_heads", "sites",
]
TEXT_COLUMNS = ("heads", "random_deltas", "random_heads", "sites")  # "10.10" must not come back as 10.1


def with_sites(frame, modules: dict):
    """`frame` with a last column `site`: each row's layer's module path in `modules`
    (`{layer: path}`; None where the layer has none). A frame without `layer` and `head`, or
    with a `site` column already, comes back as it was."""
    if SITE in frame.columns or not {"layer", "head"} <= set(frame.columns):
        return frame
    out = frame.copy()
    out[SITE] = [modules.get(int(layer)) for layer in out["layer"]]
    return out


def write_csv(frame, path) -> None:
    """Write a `validate` frame as CSV (its `attrs` are not kept)."""
    frame[VALIDATION_COLUMNS].to_csv(path, index=False)


def read_csv(path):
    """Read a frame written by `write_csv`: head lists stay text ("10.10" is not the float 10.1),
    `primary` and `hurts_more` are bools, the numbers floats (inf and NaN included)."""
    import pandas as pd

    frame = pd.read_csv(path, dtype={name: str for name in TEXT_COLUMNS}, keep_default_na=True)
    for name in TEXT_COLUMNS:  # files written before `sites` lack it: read as "" (not known)
        frame[name] = frame[name].fillna("") if name in frame else ""
    for name in ("primary", "hurts_more"):
        frame[name] = frame[name].astype(str).str.lower().eq("true")
    return frame[VALIDATION_COLUMNS]
