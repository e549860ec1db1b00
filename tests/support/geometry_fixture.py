"""The planted model's geometry, computed once per test process and shared by the geometry
report tests (`test_geometry_report.py`, `test_geometry_browser.py`).

- `planted_geometry()`: `(loaded, GeometryResult)` on the planted 2 x 4 model (8 text windows of
  32 tokens, pruning curve in 4 steps, random seeds 0 and 1).
- `planted_analysis(result)`: a synthetic 2 x 4 analysis (`fake_analysis`) holding it.
"""
import functools
import tempfile
from pathlib import Path

import headscope
from tests.support.fake_analysis import fake_analysis
from tests.support.planted import save_planted

SETTINGS = dict(n_examples=8, seq_len=32, pruning_steps=4, seeds=(0, 1))


@functools.lru_cache(maxsize=1)
def planted_geometry():
    folder = Path(tempfile.mkdtemp(prefix="hs-planted-geometry-"))
    loaded = headscope.load(str(save_planted(folder / "planted")), device="cpu")
    return loaded, headscope.geometry(loaded, **SETTINGS)


def planted_analysis(result, **kwargs):
    return fake_analysis(2, 4, seed=1, **kwargs).with_geometry(result)
