"""Heads as geometry: weights and patterns compared across heads.

- `run`: `geometry(loaded)` -> `GeometryResult`, and `plot_geometry`.
- `subspaces`: overlaps of heads' QK and OV subspaces, their ranks.
- `similarity`: pattern divergence (Jensen-Shannon), MDS and clusters.
- `importance`: loss rise per ablated head and the pruning curve.
- `ov_circuit`: OV copying (eigenvalue share, top-1 copying).
- `norm_gains`: norm weights folded into a head's circuits.
- `geometry_result`: `GeometryResult` and its CSV form (no torch).

Named `head_geometry`, not `geometry`: `headscope.geometry` is the function. `geometry`,
`plot_geometry` and `write_geometry` are re-exported lazily, so importing the package loads no torch.
"""
from .._lazy import lazy_exports

__all__ = ["geometry", "plot_geometry", "write_geometry"]

__getattr__, __dir__ = lazy_exports(__name__, {name: "run" for name in __all__})
