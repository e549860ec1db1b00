"""induction: attention to the token right after earlier occurrences (see copying.py)."""
from __future__ import annotations

from ..protocol import Detector
from .copying import induction_targets, mass_on

__all__ = ["induction"]

induction = Detector(
    name="induction", probe="repeated", threshold=0.4,
    formula="mean over queries with an earlier occurrence of the attention on the tokens right after its earlier occurrences",
    source="Olsson et al. 2022 (prefix matching); threshold 0.4 as in common practice (ARENA)",
    fn=lambda pattern, batch: mass_on(pattern, induction_targets(batch)), lazy=True, outranks_resting=True,
    colour="#d62728", short="ind", icl_check=True, ov_qualified=True,
)
