"""previous_token: mean over queries i >= 1 of A[i, i-1] (see positional.py for sources)."""
from __future__ import annotations

from ..protocol import Detector
from .offsets import offset_score

__all__ = ["previous_token"]

previous_token = Detector(
    name="previous_token", probe="text", threshold=0.5,
    formula="mean over queries i >= 1 of A[i, i-1]",
    source="Voita et al. 2019 (positional heads); Clark et al. 2019 (threshold 0.5 of attention at the offset)",
    fn=lambda pattern, batch: offset_score(pattern, batch, -1), lazy=True, colour="#1f77b4", short="prev",
)