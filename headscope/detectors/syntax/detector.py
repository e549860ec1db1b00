"""The syntactic detector: heads that attend along dependency arcs (Clark et al. 2019; Voita et al. 2019).

An ordinary `headscope.detectors.protocol.Detector` on the treebank probe:
    reduce: one layer's pattern -> word attention W = P^T A S -> each word's predicted partner,
        ``[batch, head, word]`` small integers (``scoring.word_attention``, ``predicted_partners``);
    finalize: the partners of every sentence -> per (head, relation, direction) accuracy, the
        best position-only baseline and the control's best head, cross-fitted held-out margin
        with its 95% CI (``crossfit.score_arcs``); one row per head, label
        ``syntactic:<relation>`` when its CI lower bound is at least ``threshold`` (0.10).
Its report section (tables, figure, treebank header) is ``report.SECTION``. Formulas and
sources in ``headscope.detectors.syntax`` and docs/syntax.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...errors import HeadscopeError
from ...attention.pattern import as_pattern
from ..protocol import Collected, Detector, Finding
from .baselines import predictor_hits
from .crossfit import THRESHOLD, score_arcs
from .report import SECTION
from .scoring import MIN_ARCS, arc_hits, best_heads, predicted_partners, word_attention

__all__ = ["SyntacticDetector", "syntactic", "predictions"]


def _word_partners(pattern, batch) -> torch.Tensor:
    """`[batch, head, word]` each word's predicted partner on one layer."""
    if batch.words is None:
        raise HeadscopeError("the syntactic detector scores sentences with their dependency arcs: "
                             "use headscope.analyze(..., detectors=['syntactic']) or headscope.run_syntax")
    words = word_attention(as_pattern(pattern).dense(), batch.words.token_words, batch.words.n_words)  # (B, H, W, W)
    return predicted_partners(words, batch.words.present)


def predictions(collected: Collected, treebank) -> torch.Tensor:
    """``[sentence, layer, head, word]`` predicted partners from the batches' values (-1 beyond
    a sentence's words); the layer axis runs over `collected.attention_layers`."""
    layers = collected.attention_layers
    out = torch.full((len(treebank.alignments), len(layers), collected.n_heads, treebank.n_words), -1,
                     dtype=torch.long)
    for batch, values in zip(collected.batches, collected.values):
        rows = list(batch.words.rows)
        for i, layer in enumerate(layers):
            out[rows, i, :, :batch.words.n_words] = values[layer].long()
    for i, alignment in enumerate(treebank.alignments):  # word slots past a sentence's end stay -1
        out[i, :, :, alignment.n_words:] = -1
    return out


@dataclass(frozen=True)
class SyntacticDetector(Detector):
    """A `Detector` whose values are predicted partners and whose finalize cross-fits margins.

    Attributes (beyond `Detector`'s):
        min_arcs: arcs a (relation, direction) needs in each half of the sentences.
    """

    min_arcs: int = MIN_ARCS

    def reduce(self, layer: int, pattern, batch) -> torch.Tensor:
        return _word_partners(pattern, batch).to(torch.int16)

    def finalize(self, model: Collected, control: Optional[Collected], probe, seed: int) -> Finding:
        result = self.score_sentences(model, control, probe, seed)
        names = {(l, h, self.name): f"{self.name}:{r}" for l, h, r in
                 zip(result["heads"]["layer"], result["heads"]["head"], result["heads"]["relation"])}
        best = result["best"]
        # None, not NaN, where a relation has no held-out margin: meta is JSON and must survive a round trip
        records = best.astype(object).where(best.notna(), None).to_dict(orient="records")
        meta = {"syntax_best": records, "syntax_notes": list(probe.notes) + ([result["note"]] if result["note"] else [])}
        return Finding(result["heads"], names, meta, {"syntax": result["table"]})

    def score_sentences(self, model: Collected, control: Optional[Collected], probe, seed: int) -> dict:
        """{"table", "heads", "best", "note"}: every head x relation x direction, one row per head
        (with the extra columns relation, direction, label), the best head per relation, and ""
        or why nothing could be held out (too few arcs: no labels, accuracies kept)."""
        arcs = probe.arcs
        pieces = [[a.token_words.count(w) for w in range(a.n_words)] for a in probe.alignments]
        control_hits = None if control is None else arc_hits(predictions(control, probe), arcs).flatten(1)
        table, heads, note = score_arcs(arc_hits(predictions(model, probe), arcs).flatten(1), arcs, len(probe.sentences),
                                        (len(model.attention_layers), model.n_heads),
                                        predictor_hits(arcs, probe.sentences, pieces), control_hits,
                                        min_arcs=self.min_arcs, threshold=self.threshold, seed=seed,
                                        layers=model.attention_layers)
        return {"table": table, "heads": heads, "best": best_heads(table, self.min_arcs), "note": note}


syntactic = SyntacticDetector(
    name="syntactic", probe="treebank", threshold=THRESHOLD,
    formula="held-out margin: accuracy(argmax word attention = gold partner) - best baseline (offsets -3..+3, "
            "first/last/most-pieces word, nearest content words, the control's best head), the relation and "
            "direction chosen on one half of the sentences and measured on the other; label when its 95% CI "
            "lower bound >= 0.10",
    source="Clark et al. 2019 (word-level attention, Table 1); Voita et al. 2019 (10-point margin over the baseline)",
    fn=_word_partners, gate="ci_low", quantity="held-out margin over the baseline",
    report_rule=("syntax", "Syntactic heads are cross-fitted: each head's relation and direction are chosen on one half "
                 "of the treebank sentences and its margin over the best baseline is measured on the other half (both "
                 "halves, combined); the label needs that held-out margin's 95% CI lower bound ≥ {threshold:g}{control} "
                 "A head can be significant for several relations; its label names the clearest."),
    report=SECTION,
)
