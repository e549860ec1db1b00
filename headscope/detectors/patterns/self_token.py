"""self: mean over queries i >= 1 of A[i, i] (see positional.py for sources)."""
from __future__ import annotations

from ..protocol import Detector
from .offsets import offset_score

__all__ = ["self_attention"]

self_attention = Detector(
    name="self", probe="text", threshold=0.5,
    formula="mean over queries i >= 1 of A[i, i]",
    source="Clark et al. 2019 (attention to the token itself; threshold 0.5 as for offsets)",
    fn=lambda pattern, batch: offset_score(pattern, batch, 0), lazy=True, colour="#9467bd", short="self",
)