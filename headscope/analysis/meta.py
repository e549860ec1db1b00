"""What `headscope.analyze` records about a run: `AnalysisMeta`.

- `AnalysisMeta`: the model, probes, detectors, control, OV settings, versions and timings of
  one analysis, typed. `to_json()` is the mapping `Analysis.meta` holds and meta.json saves
  (the keys every version of headscope wrote; readers index it as a dict);
  `AnalysisMeta.from_json(meta)` reads one back, keys it does not know kept in `detector_entries`.
- `check_saved(meta, scores, labels, folder)`: HeadscopeError naming the first defect of a
  saved analysis's meta.json or tables (what readers index without a default).
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


def check_saved(meta, scores, labels, folder) -> None:
    """HeadscopeError naming the first thing wrong with a saved analysis: meta.json not an
    object, a required key missing or of the wrong type, or a table without its columns or
    with heads outside the model's grid (`Analysis.load`)."""
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
        for axis, size in (("layer", meta["n_layers"]), ("head", meta["n_heads"])):
            values = table[axis]
            if values.isna().any() or not values.between(0, size - 1).all():
                raise HeadscopeError(f"{folder}/{name} is damaged: a {axis} outside 0-{size - 1} "
                                     f"(meta.json says {size}); re-run headscope analyze")
