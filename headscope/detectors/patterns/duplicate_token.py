"""duplicate_token: attention to earlier occurrences of the token (see copying.py)."""
from __future__ import annotations

from ..protocol import Detector
from .copying import earlier_copies, mass_on

__all__ = ["duplicate_token"]

duplicate_token = Detector(
    name="duplicate_token", probe="repeated", threshold=0.4,
    formula="mean over queries with an earlier occurrence of the attention on its earlier occurrences",
    source="Wang et al. 2022 (IOI duplicate-token heads); threshold 0.4 by analogy with induction",
    fn=lambda pattern, batch: mass_on(pattern, earlier_copies(batch)), lazy=True, outranks_resting=True,
    colour="#ff7f0e", short="dup", ov_qualified=True,
)
