"""syntactic: heads that attend along dependency arcs (Clark et al. 2019; Voita et al. 2019).

An ordinary detector on the treebank probe: each layer's pattern is reduced to every word's
predicted partner, and its finalize scores the held-out margin (accuracy - best baseline, the
relation and direction chosen on the other half of the sentences, `headscope.detectors.syntax.crossfit`);
label `syntactic:<relation>` when its 95% CI lower bound is at least 0.10. Defined in
`headscope.detectors.syntax.detector`; formulas and sources in `headscope.detectors.syntax` and docs/syntax.md.
"""
from __future__ import annotations

from .protocol import register
from .syntax.detector import syntactic

__all__ = ["syntactic"]

register(syntactic)
