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
from importlib import import_module

__all__ = ["Analysis", "Example"]


def __getattr__(name):
    if name in __all__:
        return getattr(import_module("headscope.analysis.result"), name)
    raise AttributeError(f"module 'headscope.analysis' has no attribute {name!r}")
