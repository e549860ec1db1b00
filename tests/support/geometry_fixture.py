"""The planted model's geometry, shared by the geometry report tests
(`tests/report/test_geometry_report.py`, `tests/report/test_geometry_browser.py`) through the
session fixture `planted_geometry_result` (tests/report/conftest.py).

- `planted_geometry(folder)`: `(loaded, GeometryResult)` on the planted 2 x 4 model saved in
  `folder` (the session's `planted_dir`), loaded afresh (8 text windows of 32 tokens, pruning
  curve in 4 steps, random seeds 0 and 1).
- `fake_analysis_with_geometry(result)`: a synthetic 2 x 4 analysis (`fake_analysis`) holding it.
"""
import headscope
from tests.support.fake_analysis import fake_analysis

SETTINGS = dict(n_examples=8, seq_len=32, pruning_steps=4, seeds=(0, 1))


def planted_geometry(folder):
    loaded = headscope.load(str(folder), device="cpu")
    return loaded, headscope.geometry(loaded, **SETTINGS)


def fake_analysis_with_geometry(result, **kwargs):
    return fake_analysis(2, 4, seed=1, **kwargs).with_geometry(result)
