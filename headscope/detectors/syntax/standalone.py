"""One detector on its own, outside `headscope.analyze`: the syntactic detector's full tables.

Offers:
    run_syntax    -- the treebank probe (`headscope.probes.treebank`) through the model (and the control
                     model) with the syntactic detector (`headscope.detectors.syntax.detector`) reducing each
                     layer, then every head scored (``scoring``, ``baselines``, ``crossfit``).
    SyntaxResult  -- table, best, head_scores, notes, meta.

Each layer's pattern ``[batch, head, query, key]`` is reduced on the spot to the predicted
partner word of every word, ``[batch, head, word]`` small integers; attention maps are never
kept. `headscope.analyze` runs the same detector on the same probe in its loop, through the
same `collect_with_control`; `run_syntax` then keeps the detector's full tables.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from ...errors import HeadscopeError
from ...checks import check_count, check_loaded
from ...probes.treebank import CAUSAL_NOTE, TreebankProbe
from ..protocol import Progress
from ..runner import Timings, collect_with_control
from .crossfit import THRESHOLD
from .detector import syntactic
from .scoring import MIN_ARCS

__all__ = ["run_syntax", "SyntaxResult", "CAUSAL_NOTE"]


@dataclass
class SyntaxResult:
    """What ``run_syntax`` returns.

    Attributes:
        table: every head on every (relation, direction), see ``crossfit.score_arcs``: accuracy,
            baseline, baseline_kind, control_accuracy, n, held_out_margin, ci_low, ci_high,
            significant, causal_only.
        best: relation, layer, head, direction, accuracy, baseline_kind, baseline_accuracy,
            held_out_margin, significant, n -- the most accurate head per relation (Clark et
            al. 2019, Table 1).
        head_scores: layer, head, detector, score (held-out margin), ci_low, ci_high, n,
            relation, direction, label, control, control_max -- one row per head.
        notes: caveats in words (causal filtering, a BOS put in front, skipped sentences,
            unaligned words).
        meta: n_sentences, skipped, n_arcs, causal, bos_added, max_sentences, min_arcs,
            threshold, seed, seconds.
    """

    table: object
    best: object
    head_scores: object
    notes: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def run_syntax(loaded, sentences=None, batch_size: int = 32, progress: Optional[Progress] = None,
               min_arcs: int = MIN_ARCS, seed: int = 0, max_sentences: Optional[int] = None,
               threshold: float = THRESHOLD, control=None) -> SyntaxResult:
    """Score every head of a model as a syntactic head (Clark et al. 2019; Voita et al. 2019).

    Args:
        loaded: a ``headscope.load(...)`` result (model, fast tokenizer, causal flag).
        sentences: ``Sentence`` objects (default: ``bundled_treebank()``, 1,016 sentences).
        batch_size: sentences per forward pass (padded on the right; 32, as `analyze`'s 8
            examples of 4 sentences).
        progress: ``fn(stage, done, total)`` called as batches finish.
        min_arcs: a (relation, direction) needs this many arcs in each half of the sentences
            to count for a head's score, and this many in all for ``best``.
        seed: sentence sample (with ``max_sentences``) and bootstrap resamples.
        max_sentences: score a seeded random sample of this many sentences (order kept).
        threshold: held-out margin over the baseline (CI lower bound) for the
            ``syntactic:<relation>`` label.
        control: a ``Loaded`` untrained twin with the same tokenizer (``headscope.loading.control``);
            its best head per relation joins the baseline. None: position-only baselines.
    Returns:
        A ``SyntaxResult``.
    Raises:
        HeadscopeError: no sentences, invalid trees, bad arguments, every sentence longer
            than the context, or no relation with ``min_arcs`` arcs.
    """
    check_loaded(loaded, "run_syntax")
    timings = Timings()
    check_count("batch_size", batch_size)
    check_count("min_arcs", min_arcs)
    probe = TreebankProbe(sentences, max_sentences).build(loaded, seed)
    detector = dataclasses.replace(syntactic, min_arcs=min_arcs, threshold=threshold)
    passes, twin = collect_with_control(loaded, control, probe, [detector], batch_size, timings, progress,
                                        stage="syntax")
    scored = detector.score_sentences(passes.values[detector.name], twin.get(detector.name), probe, seed)
    timings.total()
    meta = {"n_sentences": len(probe.sentences), "skipped": probe.skipped, "n_arcs": int(len(probe.arcs.sentence)),
            "causal": loaded.causal, "bos_added": probe.bos_added, "max_sentences": max_sentences,
            "min_arcs": min_arcs, "threshold": threshold, "seed": seed, "control": control is not None,
            "seconds": timings.rounded()["total"]}
    return SyntaxResult(table=scored["table"], best=scored["best"], head_scores=scored["heads"],
                        notes=list(probe.notes) + ([scored["note"]] if scored["note"] else []),
                        meta=meta)
