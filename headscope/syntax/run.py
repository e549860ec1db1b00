"""Running the syntactic detector on a loaded model.

Offers:
    run_syntax    -- align a treebank to the model's tokens, run it through the model (and the
                     control model) inside ``capture(reduce=...)``, and score every head
                     (``scoring``, ``baselines``, ``crossfit``).
    SyntaxResult  -- table, best, head_scores, notes, meta.

Each layer's pattern ``[batch, head, query, key]`` is reduced on the spot to the predicted
partner word of every word, ``[batch, head, word]`` small integers; attention maps are never
kept. Causal models get their BOS token in front when the tokenizer adds none (as in the
repeated-token probe), so the attention sink falls on a dropped special token, not on the
first word.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from headscope.errors import HeadscopeError

from .align import Alignment, align_words
from .baselines import predictor_hits
from .crossfit import THRESHOLD, score_arcs
from .scoring import MIN_ARCS, arc_hits, best_heads, collect_arcs, predicted_partners, word_attention

__all__ = ["run_syntax", "SyntaxResult"]

Progress = Callable[[str, int, int], None]  # (stage, done, total)

CAUSAL_NOTE = "causal model: only arcs whose partner precedes the attending word are scored"


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


def run_syntax(loaded, sentences=None, batch_size: int = 8, progress: Optional[Progress] = None,
               min_arcs: int = MIN_ARCS, seed: int = 0, max_sentences: Optional[int] = None,
               threshold: float = THRESHOLD, control=None) -> SyntaxResult:
    """Score every head of a model as a syntactic head (Clark et al. 2019; Voita et al. 2019).

    Args:
        loaded: a ``headscope.load(...)`` result (model, fast tokenizer, causal flag).
        sentences: ``Sentence`` objects (default: ``bundled_treebank()``, 445 sentences).
        batch_size: sentences per forward pass (padded on the right).
        progress: ``fn(stage, done, total)`` called as batches finish.
        min_arcs: a (relation, direction) needs this many arcs in each half of the sentences
            to count for a head's score, and this many in all for ``best``.
        seed: sentence sample (with ``max_sentences``) and bootstrap resamples.
        max_sentences: score a seeded random sample of this many sentences (order kept).
        threshold: held-out margin over the baseline (CI lower bound) for the
            ``syntactic:<relation>`` label.
        control: a ``Loaded`` untrained twin with the same tokenizer (``headscope.control``);
            its best head per relation joins the baseline. None: position-only baselines.
    Returns:
        A ``SyntaxResult``.
    Raises:
        HeadscopeError: no sentences, invalid trees, bad arguments, every sentence longer
            than the context, or no relation with ``min_arcs`` arcs.
    """
    from headscope.treebank import bundled_treebank, validate_sentences

    started = time.perf_counter()
    sentences = bundled_treebank() if sentences is None else list(sentences)
    if not sentences:
        raise HeadscopeError("no sentences to score: the treebank is empty")
    if batch_size < 1 or min_arcs < 1:
        raise HeadscopeError(f"batch_size and min_arcs must be at least 1 (got {batch_size}, {min_arcs})")
    if max_sentences is not None:
        if max_sentences < 1:
            raise HeadscopeError(f"max_sentences must be at least 1, got {max_sentences}")
        if max_sentences < len(sentences):
            chosen = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed))[:max_sentences]
            sentences = [sentences[i] for i in sorted(chosen.tolist())]
    validate_sentences(sentences, "sentences")

    alignments = [align_words(loaded.tokenizer, s) for s in sentences]
    bos = _bos_to_add(loaded, alignments[0])
    alignments = [a.with_prefix(bos) for a in alignments] if bos else alignments
    context = loaded.context_length
    kept = [i for i, a in enumerate(alignments) if context is None or len(a.input_ids) <= context]
    skipped = len(sentences) - len(kept)
    if not kept:
        raise HeadscopeError(f"every sentence is longer than the model's context ({context} tokens)")
    sentences = [sentences[i] for i in kept]
    alignments = [alignments[i] for i in kept]

    predictions = _predict(loaded, alignments, batch_size, progress)  # (S, L, H, W)
    arcs = collect_arcs(sentences, loaded.causal, [a.aligned for a in alignments])
    if len(arcs.sentence) == 0:
        raise HeadscopeError("the sentences have no scorable arcs (only root and punct)")
    control_hits = None
    if control is not None:
        control_predictions = _predict(control, alignments, batch_size, progress, stage="syntax (control)")
        control_hits = arc_hits(control_predictions, arcs).flatten(1)
    pieces = [[a.token_words.count(w) for w in range(a.n_words)] for a in alignments]
    table, heads = score_arcs(arc_hits(predictions, arcs).flatten(1), arcs, len(sentences),
                              (loaded.n_layers, loaded.n_heads), predictor_hits(arcs, sentences, pieces),
                              control_hits, min_arcs=min_arcs, threshold=threshold, seed=seed)
    best = best_heads(table, min_arcs)

    notes = []
    if loaded.causal:
        notes.append(CAUSAL_NOTE)
    if bos:
        notes.append(f"{loaded.tokenizer.bos_token} put in front of every sentence: the tokenizer adds no "
                     "special token and a causal model's attention sink should fall on a dropped token")
    if skipped:
        notes.append(f"{skipped} sentences skipped: longer than the context ({context} tokens)")
    if arcs.unaligned:
        notes.append(f"{arcs.unaligned} dependencies skipped: a word shares its only token with another word")
    meta = {"n_sentences": len(sentences), "skipped": skipped, "n_arcs": int(len(arcs.sentence)),
            "causal": loaded.causal, "bos_added": bool(bos), "max_sentences": max_sentences,
            "min_arcs": min_arcs, "threshold": threshold, "seed": seed, "control": control is not None,
            "seconds": round(time.perf_counter() - started, 3)}
    return SyntaxResult(table=table, best=best, head_scores=heads, notes=notes, meta=meta)


def _bos_to_add(loaded, alignment: Alignment) -> list[int]:
    """``[bos_id]`` for a causal model whose tokenizer puts no special token in front, else []."""
    bos = getattr(loaded.tokenizer, "bos_token_id", None)
    if loaded.causal and bos is not None and alignment.token_words[:1] != (-1,):
        return [bos]
    return []


@torch.no_grad()
def _predict(loaded, alignments: list[Alignment], batch_size: int, progress, stage: str = "syntax") -> torch.Tensor:
    """``[sentence, layer, head, word]`` predicted partners (-1 beyond a sentence's words)."""
    from headscope.hf.capture import capture

    device = loaded.device
    tokenizer = loaded.tokenizer
    pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    n_words = max(a.n_words for a in alignments)
    order = sorted(range(len(alignments)), key=lambda i: len(alignments[i].input_ids))  # less padding
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    predictions = torch.full((len(alignments), loaded.n_layers, loaded.n_heads, n_words), -1, dtype=torch.long)
    current = {}

    def reduce(layer, pattern, attention_mask):
        words = word_attention(pattern, current["token_words"], current["n_words"])  # (B, H, W, W)
        partners = predicted_partners(words, current["present"])  # (B, H, W)
        return partners.to(device="cpu", dtype=torch.int16)

    with capture(loaded.model, reduce=reduce) as cap:
        for done, members in enumerate(batches, 1):
            length = max(len(alignments[i].input_ids) for i in members)
            ids = torch.full((len(members), length), pad, dtype=torch.long)
            token_words = torch.full((len(members), length), -1, dtype=torch.long)
            mask = torch.zeros(len(members), length, dtype=torch.long)
            for row, i in enumerate(members):
                size = len(alignments[i].input_ids)
                ids[row, :size] = torch.tensor(alignments[i].input_ids)
                token_words[row, :size] = torch.tensor(alignments[i].token_words)
                mask[row, :size] = 1
            batch_words = max(alignments[i].n_words for i in members)
            present = torch.tensor([list(alignments[i].aligned) + [False] * (batch_words - alignments[i].n_words)
                                    for i in members], dtype=torch.bool)
            current.update(token_words=token_words.to(device), n_words=batch_words, present=present.to(device))
            loaded.model(input_ids=ids.to(device), attention_mask=mask.to(device))
            for layer in range(loaded.n_layers):
                partners = cap.results[layer].pop()  # (B, H, W) for this batch
                predictions[members, layer, :, :batch_words] = partners.long()
            for i in members:  # word slots past a sentence's end stay -1
                predictions[i, :, :, alignments[i].n_words:] = -1
            if progress:
                progress(stage, done, len(batches))
    return predictions
