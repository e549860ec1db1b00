"""Syntactic heads: which heads attend along dependency arcs (Clark et al. 2019, Voita et al. 2019).

Offers:
    run_syntax(loaded, sentences=None, ...) -> SyntaxResult   score every head of a model.
    SyntaxResult   table (every head x relation x direction), best (best head per relation,
                   like Clark et al.'s Table 1), head_scores (one row per head), notes.
    align_words(tokenizer, sentence) -> Alignment   sub-word tokens -> words via offsets.
    THRESHOLD = 0.10   margin over the baseline for the label ``syntactic:<relation>``.
    MIN_ARCS = 30      arcs a (relation, direction) needs to count.

Method (Clark, Khandelwal, Levy, Manning 2019, "What Does BERT Look At?", section 4.1):
    word attention W = P^T A S: attention *to* a word sums over its pieces, attention *from* a
    word is the mean of its pieces' rows (rows still sum to <= 1); special tokens are dropped,
    not renormalised, and W[i, i] = 0. The predicted partner of word i is argmax_j W[i, j].
    accuracy(head, relation, direction) = share of arcs whose predicted partner is the gold one,
    for "dep->head" (the dependent attends to its head) and "head->dep". Root and punct arcs
    are not scored; in a causal model only arcs whose partner precedes the attending word are.
    baseline(relation, direction) = max over fixed offsets k in -3..+3 (k != 0) of the share of
    the same arcs with partner = attending + k (Clark et al. tried -3..+2; Table 1 reports the
    best head per relation against it, e.g. det 94.3 vs 51.7 in BERT-base).
    A head's score = max over (relation, direction) with >= MIN_ARCS arcs of accuracy - baseline
    (Voita et al. 2019, "Analyzing Multi-Head Self-Attention": a syntactic head beats the
    most-frequent-offset baseline by at least 10 points), with a 95% percentile bootstrap over
    sentences (1000 resamples, baseline recomputed on each).
"""
from .align import Alignment, align_words
from .margins import THRESHOLD
from .run import SyntaxResult, run_syntax
from .scoring import MIN_ARCS

__all__ = ["run_syntax", "SyntaxResult", "align_words", "Alignment", "THRESHOLD", "MIN_ARCS"]
