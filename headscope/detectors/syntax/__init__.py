"""Syntactic heads: which heads attend along dependency arcs (Clark et al. 2019, Voita et al. 2019).

Offers:
    THRESHOLD = 0.10   margin over the baseline for the label ``syntactic:<relation>``.
    MIN_ARCS = 30      arcs a (relation, direction) needs to count.
Modules: ``detector`` (the syntactic detector's reduce and finalize), ``scoring``, ``baselines``,
``crossfit``, ``report`` (its report section). The treebank probe is `headscope.probes.treebank`; `headscope.run_syntax`
(`headscope.detectors.syntax.standalone`) runs the detector alone.

Method (Clark, Khandelwal, Levy, Manning 2019, "What Does BERT Look At?", section 4.1):
    word attention W = P^T A S: attention *to* a word sums over its pieces, attention *from* a
    word is the mean of its pieces' rows (rows still sum to <= 1); special tokens are dropped,
    not renormalised, and W[i, i] = 0. The predicted partner of word i is argmax_j W[i, j].
    accuracy(head, relation, direction) = share of arcs whose predicted partner is the gold one,
    for "dep->head" (the dependent attends to its head) and "head->dep". Root and punct arcs
    are not scored; in a causal model only arcs whose partner precedes the attending word are.
    baseline(relation, direction) = the best of the position-only predictors (fixed offsets
    -3..+3 as Clark et al.; first, last and most-pieces word; nearest content words) and the
    untrained control model's best head, on the same arcs (``baselines``, ``crossfit``).
    Cross-fitting: the relation and direction of a head are chosen on one half of the sentences
    and its margin (accuracy - baseline) measured on the other, both ways; the label
    ``syntactic:<relation>`` needs the held-out margin's 95% CI lower bound >= 0.10 (Voita et
    al. 2019's 10 points), with sentences resampled within halves (1000 resamples).
"""
from ..._lazy import lazy_exports

__all__ = ["THRESHOLD", "MIN_ARCS"]


# lazily: the report reads `report.py` here without torch
__getattr__, __dir__ = lazy_exports(__name__, {"THRESHOLD": "crossfit", "MIN_ARCS": "scoring"})
