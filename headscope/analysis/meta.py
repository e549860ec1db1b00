"""What `headscope.analyze` records about a run: `AnalysisMeta`.

- `AnalysisMeta`: the model, probes, detectors, control, OV settings, versions and timings of
  one analysis, typed. `to_json()` is the mapping `Analysis.meta` holds and meta.json saves
  (the keys every version of headscope wrote; readers index it as a dict);
  `AnalysisMeta.from_json(meta)` reads one back, keys it does not know kept in `detector_entries`.
No torch: a saved analysis is read without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = ["AnalysisMeta"]


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
        return out

    @classmethod
    def from_json(cls, data: dict) -> "AnalysisMeta":
        """Read `to_json()`'s mapping back (keys of its own fields; the rest in `detector_entries`)."""
        own = {f.name for f in fields(cls)} - {"probe_entries", "detector_entries"}
        known = {key: value for key, value in data.items() if key in own}
        return cls(**known, detector_entries={key: value for key, value in data.items() if key not in own})
