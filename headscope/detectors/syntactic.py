"""syntactic: heads that attend along dependency arcs (Clark et al. 2019; Voita et al. 2019).

Unlike the other detectors it does not score one layer's pattern on its own: it needs word
alignments and gold arcs, so `headscope.analyze` runs it through `headscope.syntax.run_syntax`
on the treebank probe. Score: the largest (accuracy - best fixed-offset baseline) over
relations and directions with >= 30 arcs; label `syntactic:<relation>` at a margin of 0.10.
Formulas and sources in `headscope.syntax` and docs/syntax.md.
"""
from __future__ import annotations

from ..errors import HeadscopeError
from .base import Detector, register

__all__ = ["syntactic"]


def _needs_a_treebank(pattern, batch):
    raise HeadscopeError("the syntactic detector scores sentences with their dependency arcs: "
                         "use headscope.analyze(..., detectors=['syntactic']) or headscope.syntax.run_syntax")


syntactic = register(Detector(
    name="syntactic", probe="treebank", threshold=0.10,
    formula="max over relations (>= 30 arcs) and directions of accuracy(argmax word attention = gold partner) - best fixed-offset baseline (-3..+3)",
    source="Clark et al. 2019 (word-level attention, Table 1); Voita et al. 2019 (10-point margin over the baseline)",
    fn=_needs_a_treebank,
))
