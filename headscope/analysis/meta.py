"""What `headscope.analyze` records about a run: `AnalysisMeta`.

- `AnalysisMeta`: the model, probes, detectors, control, OV settings, versions and timings of
  one analysis, typed. `to_json()` is the mapping `Analysis.meta` holds and meta.json saves
  (the keys every version of headscope wrote; readers index it as a dict);
  `AnalysisMeta.from_json(meta)` reads one back, keys it does not know kept in `detector_entries`.
- `check_saved(meta, scores, labels, folder, tables, examples)`: HeadscopeError naming the first
  defect of a saved analysis's meta.json or tables (what readers index without a default, and
  the shape of every table: rows per head, columns, finite numbers), whatever its manifest says.
No torch: a saved analysis is read without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..errors import HeadscopeError
from ..tables import LABEL_COLUMNS, SCORE_COLUMNS

__all__ = ["AnalysisMeta", "check_saved"]

# What readers of a saved analysis index without a default, and the type each must have; the
# optional keys are checked when present (older analyses lack some).
_REQUIRED = {"n_layers": int, "n_heads": int, "causal": bool}
_OPTIONAL = {"model": str, "created": str, "probes": dict, "detectors": dict, "control": dict, "ov": dict,
             "notes": list, "sites": dict}


@dataclass
class AnalysisMeta:
    """What an analysis records about how it was made (meta.json).

    Attributes:
        model, family, causal, n_layers, n_heads, n_kv_heads, parameters, device, dtype: the model.
        probes: probe name -> its settings (`meta()`) and how its patterns were computed ("patterns").
        batch_size, seed: as given to `analyze`.
        versions: headscope, torch and transformers versions.
        timings: seconds per step ("control_init", "probes", "probe_<name>", ..., "total").
        created: UTC time, ISO format.
        detectors: detector name -> `Detector.describe()`.
        control: the control model's description (`headscope.loading.control`).
        ov: the OV circuit's settings, and why it was skipped ("" when computed).
        skipped_detectors: detector -> why it could not score this model (left out when empty).
        notes: caveats in words (left out when empty).
        probe_entries: what the probes add at the top level (`extra_meta`, e.g. "treebank").
        detector_entries: what the detectors add at the top level (`Finding.meta`, e.g. "syntax_best").
        processes: torchrun processes that shared the batches (written only when more than one).
        sites: the group of attention sites analysed, outside the default stack: group
            ("decoder.cross"), kind ("cross"), modules (each layer's module path); written
            only then (analyses of the default stack have no such key, as before).
    """

    model: str
    family: str
    causal: bool
    n_layers: int
    n_heads: int
    n_kv_heads: int
    parameters: int
    device: str
    dtype: str
    probes: dict
    batch_size: int
    seed: int
    versions: dict
    timings: dict
    created: str
    detectors: dict
    control: dict
    ov: dict
    skipped_detectors: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    probe_entries: dict = field(default_factory=dict)
    detector_entries: dict = field(default_factory=dict)
    processes: int = 1
    sites: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The mapping meta.json holds; keys as headscope has always written them."""
        names = [f.name for f in fields(self)]
        out = {name: getattr(self, name) for name in names[:names.index("ov")]}  # model ... control
        out.update(self.probe_entries)
        if self.skipped_detectors:
            out["skipped_detectors"] = self.skipped_detectors
        if self.notes:
            out["notes"] = self.notes
        out["ov"] = self.ov
        out.update(self.detector_entries)
        if self.processes > 1:
            out["processes"] = self.processes
        if self.sites:
            out["sites"] = self.sites
        return out

    @classmethod
    def from_json(cls, data: dict) -> "AnalysisMeta":
        """Read `to_json()`'s mapping back (keys of its own fields; the rest in `detector_entries`)."""
        own = {f.name for f in fields(cls)} - {"probe_entries", "detector_entries"}
        known = {key: value for key, value in data.items() if key in own}
        return cls(**known, detector_entries={key: value for key, value in data.items() if key not in own})


def check_saved(meta, scores, labels, folder, tables=None, examples=()) -> None:
    """HeadscopeError naming the first thing wrong with a saved analysis (`Analysis.load`), whatever
    its manifest says: meta.json not an object, a required key missing or of the wrong type; a
    table without its columns, with heads outside the model's grid or a head twice; a detector
    meta.json lists without rows, or scoring other heads than the rest (a table cut at a line
    boundary); labels.csv listing other heads than scores.csv scores; a score, CI or control
    that is text or infinite, a score that is NaN beside a finite CI (a NaN score has a NaN CI:
    no counted example), a count `n` that is not a whole number >= 0; `tables` (name -> frame)
    with heads outside the grid; `examples` whose maps are not `[n_layers, n_heads, ...]`."""
    where = f"{folder}/meta.json"
    if not isinstance(meta, dict):
        raise HeadscopeError(f"{where} is damaged: it holds a {type(meta).__name__}, not an object; "
                             f"re-run headscope analyze")
    missing = [key for key in _REQUIRED if key not in meta]
    if missing:
        raise HeadscopeError(f"{where} is damaged: it lacks {', '.join(missing)}; re-run headscope analyze")
    for key, kind in {**_REQUIRED, **_OPTIONAL}.items():
        if key not in meta:
            continue
        value = meta[key]
        wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if wrong or (kind is int and value < 1):
            raise HeadscopeError(f"{where} is damaged: {key} is {value!r}, expected "
                                 f"{'a positive integer' if kind is int else 'a ' + kind.__name__}; re-run headscope analyze")
    for name, table, columns in (("scores.csv", scores, SCORE_COLUMNS[:4]), ("labels.csv", labels, LABEL_COLUMNS[:3])):
        absent = [column for column in columns if column not in table.columns]
        if absent:
            raise HeadscopeError(f"{folder}/{name} is damaged: it lacks the column(s) {', '.join(absent)}")
    for name, table in (("scores.csv", scores), ("labels.csv", labels), *((f"{n}.csv", t) for n, t in (tables or {}).items())):
        _check_grid(f"{folder}/{name}", table, meta["n_layers"], meta["n_heads"])
    _check_numbers(f"{folder}/scores.csv", scores, ("score", "ci_low", "ci_high", "control", "control_max"))
    _check_numbers(f"{folder}/labels.csv", labels, ("score",))
    _check_heads(meta, scores, labels, folder)
    for example in examples:
        if tuple(example.patterns.shape[:2]) != (meta["n_layers"], meta["n_heads"]):
            raise HeadscopeError(f"{folder}/examples.json is damaged: example {example.probe} #{example.index} holds "
                                 f"maps of {' x '.join(map(str, example.patterns.shape[:2]))} heads, meta.json says "
                                 f"{meta['n_layers']} x {meta['n_heads']}; re-run headscope analyze")


def _check_grid(path: str, table, n_layers: int, n_heads: int) -> None:
    """Where `table` has layer and head columns: whole numbers inside the model's grid."""
    import numpy as np
    import pandas as pd

    for axis, size in (("layer", n_layers), ("head", n_heads)):
        if axis not in table.columns:
            continue
        values = pd.to_numeric(table[axis], errors="coerce").to_numpy(dtype=float)
        if not (np.isfinite(values) & (values == np.round(values)) & (values >= 0) & (values <= size - 1)).all():
            raise HeadscopeError(f"{path} is damaged: a {axis} outside 0-{size - 1} (meta.json says {size}); "
                                 f"re-run headscope analyze")


def _check_numbers(path: str, table, columns) -> None:
    """Numeric columns hold numbers, none infinite; a NaN score has a NaN CI; n is a whole number >= 0."""
    import numpy as np
    import pandas as pd

    for column in columns:
        if column not in table.columns:
            continue
        if not pd.api.types.is_numeric_dtype(table[column]):
            raise HeadscopeError(f"{path} is damaged: its {column} column holds text where numbers belong; "
                                 f"re-run headscope analyze")
        if np.isinf(table[column].to_numpy(dtype=float)).any():
            raise HeadscopeError(f"{path} is damaged: a {column} is infinite; re-run headscope analyze")
    if {"score", "ci_low", "ci_high"} <= set(table.columns):
        lone = table.score.isna() & (table.ci_low.notna() | table.ci_high.notna())
        if lone.any():
            row = table[lone].iloc[0]
            raise HeadscopeError(f"{path} is damaged: the score of head {row.layer}.{row['head']} "
                                 f"({row.get('detector', '')}) is NaN beside a finite CI; re-run headscope analyze")
    if "n" in table.columns:
        n = pd.to_numeric(table["n"], errors="coerce").to_numpy(dtype=float)
        if not (np.isfinite(n) & (n >= 0) & (n == np.round(n))).all():
            raise HeadscopeError(f"{path} is damaged: a count n is not a whole number >= 0; re-run headscope analyze")


def _check_heads(meta, scores, labels, folder) -> None:
    """Every detector scores the same heads, each once, and labels.csv lists those heads once each."""
    def heads(frame) -> list:
        return list(zip(frame.layer.astype(int), frame["head"].astype(int)))

    listed = heads(labels)
    if len(set(listed)) != len(listed):
        raise HeadscopeError(f"{folder}/labels.csv is damaged: a head has two rows; re-run headscope analyze")
    scored = {name: heads(rows) for name, rows in scores.groupby("detector", sort=False)}
    for name in meta.get("detectors", {}) if isinstance(meta.get("detectors"), dict) else ():
        if name not in scored:
            raise HeadscopeError(f"{folder}/scores.csv is damaged: it has no rows for detector {name!r}, which "
                                 f"meta.json lists; re-run headscope analyze")
    every = set().union(*map(set, scored.values())) if scored else set()
    for name, rows in scored.items():
        if len(set(rows)) != len(rows):
            raise HeadscopeError(f"{folder}/scores.csv is damaged: detector {name!r} scores a head twice; "
                                 f"re-run headscope analyze")
        if set(rows) != every:
            raise HeadscopeError(f"{folder}/scores.csv is damaged: detector {name!r} scores {len(set(rows))} of the "
                                 f"{len(every)} heads the others score; re-run headscope analyze")
    if set(listed) != every:
        damaged = "labels.csv" if set(listed) < every else "scores.csv"
        raise HeadscopeError(f"{folder}/{damaged} is damaged: labels.csv lists {len(set(listed))} heads, scores.csv "
                             f"scores {len(every)}; re-run headscope analyze")
