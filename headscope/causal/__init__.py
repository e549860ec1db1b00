"""Causal checks: remove the heads a detector found and measure what breaks.

- `validate(loaded, analysis, k=3, mode="mean", n_random=5, seed=0, n_examples=8, progress=None)`:
  per label, the damage of ablating its top-k heads (zero and mean) against k random heads
  from the same layers; a DataFrame (see `validate`'s docstring and docs/validation.md).
- `write_csv(frame, path)`, `read_csv(path)`: save and load that frame without mangling it
  (defined in `headscope.tables`, which needs no torch).
- `ProbeRunner`, `EvalProbe`, `Measurement` (`headscope.detectors.measure`, where the retrieval
  detector's needle accuracy also reads them; each probe kind builds its own `EvalProbe`,
  `headscope.probes.kinds`): one probe's metric with any heads ablated.
- `metric_for(loaded)`, `METRICS`; `icl_score`, `icl_positions` (Olsson et al. 2022).

The top-level name is `headscope.validate` (the function). The package is not called
`headscope.validate`: importing a submodule of that name would make the package attribute the
module, shadowing the function.
"""
from ..detectors.measure import (
    METRICS, EvalProbe, Measurement, ProbeRunner, icl_positions, icl_score, metric_for,
)
from .validate import COLUMNS, ICL_LABEL, MODES, probe_for, read_csv, validate, write_csv

__all__ = [
    "validate", "read_csv", "write_csv", "COLUMNS", "ICL_LABEL", "MODES", "probe_for", "METRICS", "EvalProbe",
    "Measurement", "ProbeRunner", "icl_positions", "icl_score", "metric_for",
]
