"""syntactic: heads that attend along dependency arcs (Clark et al. 2019; Voita et al. 2019).

Unlike the other detectors it does not score one layer's pattern on its own: it needs word
alignments and gold arcs, so `headscope.analyze` runs it through `headscope.syntax.run_syntax`
on the treebank probe. Score: the held-out margin (accuracy - best baseline, the relation and
direction chosen on the other half of the sentences, `headscope.syntax.crossfit`); label
`syntactic:<relation>` when its 95% CI lower bound is at least 0.10.
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
    formula="held-out margin: accuracy(argmax word attention = gold partner) - best baseline (offsets -3..+3, "
            "first/last/most-pieces word, nearest content words, the control's best head), the relation and "
            "direction chosen on one half of the sentences and measured on the other; label when its 95% CI "
            "lower bound >= 0.10",
    source="Clark et al. 2019 (word-level attention, Table 1); Voita et al. 2019 (10-point margin over the baseline)",
    fn=_needs_a_treebank, gate="ci_low", quantity="held-out margin over the baseline",
))
