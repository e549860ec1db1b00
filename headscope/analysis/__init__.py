"""Analysis: every head of a model scored by the detectors, and the result.

- `analyze`: `analyze(loaded, ...)` -> `Analysis`, in steps: plan, run, score, assemble.
- `meta`: `AnalysisMeta` (what a run records; `to_json()` is `Analysis.meta`) and `Timings`.
- `runner`: one probe's batches through a model inside `capture(reduce=...)`.
- `distributed`: batches dealt to torchrun processes and their statistics gathered.
- `result`: `Analysis` (scores, labels, tables, meta, examples; save and load) and `Example`.
- `attach_geometry`: `add_geometry(analysis, loaded)`.

`Analysis` and `Example` are re-exported here lazily, so `import headscope.analysis` costs
nothing until one is used.
"""
from .._lazy import lazy_exports

__all__ = ["Analysis", "Example"]


__getattr__, __dir__ = lazy_exports(__name__, {"Analysis": "result", "Example": "result"})
