"""next_token: mean over queries i < n-1 of A[i, i+1], bidirectional models (see positional.py)."""
from __future__ import annotations

from ..protocol import Detector
from .offsets import offset_score

__all__ = ["next_token"]

next_token = Detector(
    name="next_token", probe="text", threshold=0.5,
    formula="mean over queries i < n-1 of A[i, i+1] (bidirectional models)",
    source="Clark et al. 2019 (five next-token heads in BERT; threshold 0.5)",
    fn=lambda pattern, batch: offset_score(pattern, batch, +1), lazy=True, applies_to=("bidirectional",),
    colour="#17becf", short="next",
)