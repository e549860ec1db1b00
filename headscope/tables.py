"""The columns of the tables an analysis saves, and the validation table's CSV form.

- `SCORE_COLUMNS`: the scores table (a detector's `Finding.rows`, `Analysis.scores`).
- `LABEL_COLUMNS`: the labels table (`headscope.detectors.labels.label_heads`, `Analysis.labels`).
- `SITE`, `with_sites(frame, modules)`: an analysis's tables name each head's attention site,
  the module path of its layer's attention (`headscope.hf.sites.Site.name`), in a last column
  `site` beside `layer` and `head`; `Analysis.scores` and `.labels` are the columns above plus it.
- `read_table(path, **pandas_options)`: a CSV table headscope wrote, checked for shape before
  pandas reads it (pandas fills a row cut short with NaN without a word).
- `VALIDATION_COLUMNS`, `write_csv(frame, path)`, `read_csv(path)`: the table of
  `headscope.validate` (`Analysis.validation`), saved and loaded without mangling it; its
  `sites` names the module of each of `heads` (";"-joined in the same order).

No torch, and no headscope import but its errors: the detectors, `headscope.causal` and the `Analysis` reading
a saved folder (`headscope report`, which needs no model) all share these.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from .errors import HeadscopeError

__all__ = ["SCORE_COLUMNS", "LABEL_COLUMNS", "SITE", "with_sites", "read_table", "VALIDATION_COLUMNS", "write_csv",
           "read_csv"]

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


def read_table(path, **options):
    """`pandas.read_csv(path, **options)` after checking the file's shape: it ends with a line
    break (pandas ends every row with one, so a file without is cut) and every row has the
    header's number of fields. HeadscopeError naming the file and the line otherwise."""
    import pandas as pd

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise HeadscopeError(f"cannot read {path} ({type(err).__name__}: {err})") from None
    again = "write it again with headscope"
    if not text:
        raise HeadscopeError(f"{path} is damaged: it is empty; {again}")
    if not text.endswith("\n"):
        raise HeadscopeError(f"{path} is damaged: its last line is cut (the file does not end with a line break); {again}")
    rows = csv.reader(io.StringIO(text))
    try:
        header = next(rows, [])
        for row in rows:
            if len(row) != len(header) and not (row == [] and len(header) == 1):  # one column: NaN is a blank line
                raise HeadscopeError(f"{path} is damaged: line {rows.line_num} has {len(row)} fields, the header "
                                     f"{len(header)}; {again}")
    except csv.Error as err:
        raise HeadscopeError(f"{path} is damaged: line {rows.line_num}: {err}; {again}") from None
    if not header:
        raise HeadscopeError(f"{path} is damaged: it has no header line; {again}")
    try:
        return pd.read_csv(io.StringIO(text), **options)
    except (ValueError, pd.errors.ParserError) as err:
        raise HeadscopeError(f"{path} is damaged: {str(err).strip().splitlines()[0]}; {again}") from None


def write_csv(frame, path) -> None:
    """Write a `validate` frame as CSV (its `attrs` are not kept)."""
    frame[VALIDATION_COLUMNS].to_csv(path, index=False)


def read_csv(path):
    """Read a frame written by `write_csv`: head lists stay text ("10.10" is not the float 10.1),
    `primary` and `hurts_more` are bools, the numbers floats (inf and NaN included)."""
    frame = read_table(path, dtype={name: str for name in TEXT_COLUMNS}, keep_default_na=True)
    for name in TEXT_COLUMNS:  # files written before `sites` lack it: read as "" (not known)
        frame[name] = frame[name].fillna("") if name in frame else ""
    for name in ("primary", "hurts_more"):
        frame[name] = frame[name].astype(str).str.lower().eq("true")
    return frame[VALIDATION_COLUMNS]
