"""The treebank probe: dependency-annotated sentences, aligned to the model's tokens.

Offers:
    TreebankProbe(treebank=None, n_sentences=None)   settings; ``build(loaded, seed)`` ->
                  ``TreebankSet``; ``eval_probe(loaded, n_examples, seed)`` for ``validate``.
    TreebankSet   the sentences that fit the context, their ``Alignment``s, the scored
                  ``Arcs``, notes; ``batches(...)`` carry a ``WordContext`` per batch.

Causal models get their BOS token in front when the tokenizer adds none
(``headscope.probes.base.special_tokens``), so the attention sink falls on a dropped special token,
not on the first word. Batches hold sentences of similar length (less padding), padded on the
right.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Optional, Union

import torch

from ..checks import check_count
from ..errors import HeadscopeError
from .base import EvalProbe, ProbeBatch, WordContext, special_tokens
from .conllu import bundled_treebank, read_conllu, validate_sentences
from .align import Alignment, align_sentences
from .arcs import Arcs, collect_arcs

__all__ = ["TreebankProbe", "TreebankSet", "eval_sentences", "CAUSAL_NOTE", "SENTENCES_PER_EXAMPLE"]

CAUSAL_NOTE = "causal model: only arcs whose partner precedes the attending word are scored"
SENTENCES_PER_EXAMPLE = 4  # validate: treebank sentences are short, 4 per text example


@dataclass
class TreebankSet:
    """A treebank built for one model (see the module docstring)."""

    sentences: list
    alignments: list[Alignment]
    arcs: Arcs
    content_start: int
    pad_id: int
    notes: list[str]
    extra_meta: dict
    skipped: int
    bos_added: bool
    name: str = "treebank"
    _order: list[int] = field(default_factory=list, repr=False)
    rows_per_example: ClassVar[int] = SENTENCES_PER_EXAMPLE  # sentences a pass takes per example of its batch

    @property
    def n_words(self) -> int:
        return max(a.n_words for a in self.alignments)

    def meta(self) -> dict:
        return {"n_examples": len(self.sentences), "seq_len": None, "max_tokens": self.seq_len,
                "description": f"{len(self.sentences)} dependency-annotated sentences, {len(self.arcs.sentence)} arcs"}

    @property
    def seq_len(self) -> int:
        return max(len(a.input_ids) for a in self.alignments)

    def explorer_ids(self, n: int, length: int) -> Optional[torch.Tensor]:
        """None: the head explorer shows text and repeated examples only."""
        return None

    def batches(self, batch_size: int, causal: bool, device) -> list[ProbeBatch]:
        """Sentences of similar length together, right-padded; each with its `WordContext`."""
        order = sorted(range(len(self.alignments)), key=lambda i: len(self.alignments[i].input_ids))
        out = []
        for start in range(0, len(order), batch_size):
            members = order[start:start + batch_size]
            chosen = [self.alignments[i] for i in members]
            length = max(len(a.input_ids) for a in chosen)
            ids = torch.full((len(members), length), self.pad_id, dtype=torch.long)
            token_words = torch.full((len(members), length), -1, dtype=torch.long)
            mask = torch.zeros(len(members), length, dtype=torch.bool)
            for row, a in enumerate(chosen):
                ids[row, :len(a.input_ids)] = torch.tensor(a.input_ids)
                token_words[row, :len(a.input_ids)] = torch.tensor(a.token_words)
                mask[row, :len(a.input_ids)] = True
            words = max(a.n_words for a in chosen)
            present = torch.tensor([list(a.aligned) + [False] * (words - a.n_words) for a in chosen], dtype=torch.bool)
            context = WordContext(token_words, present, words, tuple(members))
            out.append(ProbeBatch(ids.to(device), mask.to(device), causal, self.content_start,
                                  words=context.to(device)))
        return out


@dataclass(frozen=True)
class TreebankProbe:
    """Sentences with dependency arcs, for the syntactic detector (Clark et al. 2019).

    Attributes:
        treebank: a CoNLL-U file path, a list of ``headscope.probes.conllu.Sentence``, or None for
            the bundled treebank (``probes/syntax``, 1,016 sentences).
        n_sentences: score a seeded sample of this many sentences (None: all of them).
        source: where sentences given as a list come from, for ``meta["treebank"]["source"]``
            (a file already read, say; default "sentences given in Python").
    """

    treebank: Union[str, os.PathLike, list, tuple, None] = None
    n_sentences: Optional[int] = None
    source: Optional[str] = None
    name: ClassVar[str] = "treebank"

    def sentences(self) -> tuple[list, dict]:
        """(sentences, where they come from): source, n_sentences, natural (bundled only)."""
        if self.treebank is None:
            sentences = bundled_treebank()
            natural = sum(s.sent_id.startswith("nat-") for s in sentences)
            return sentences, {"source": "bundled", "n_sentences": len(sentences), "natural": natural}
        if isinstance(self.treebank, (str, os.PathLike)):
            sentences = read_conllu(self.treebank)
            return sentences, {"source": str(self.treebank), "n_sentences": len(sentences), "natural": None}
        sentences = list(self.treebank)
        source = self.source or "sentences given in Python"
        return sentences, {"source": source, "n_sentences": len(sentences), "natural": None}

    def build(self, loaded, seed: int) -> TreebankSet:
        """Sample, validate and align the sentences; keep those that fit the context.

        Raises:
            HeadscopeError: no sentences, invalid trees, ``n_sentences`` < 1, every sentence
                longer than the context, or no scorable arc.
        """
        sentences, source = self.sentences()
        if not sentences:
            raise HeadscopeError("no sentences to score: the treebank is empty")
        if self.n_sentences is not None:
            check_count("max_sentences", self.n_sentences)
            if self.n_sentences < len(sentences):
                chosen = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed))[:self.n_sentences]
                sentences = [sentences[i] for i in sorted(chosen.tolist())]
        validate_sentences(sentences, "sentences")
        tokenizer = loaded.tokenizer
        alignments = align_sentences(tokenizer, sentences)
        bos = [] if alignments[0].token_words[:1] == (-1,) else special_tokens(tokenizer, bos=loaded.causal)[0]
        alignments = [a.with_prefix(bos) for a in alignments] if bos else alignments
        context = loaded.context_length
        kept = [i for i, a in enumerate(alignments) if context is None or len(a.input_ids) <= context]
        skipped = len(sentences) - len(kept)
        if not kept:
            raise HeadscopeError(f"every sentence is longer than the model's context ({context} tokens)")
        sentences = [sentences[i] for i in kept]
        alignments = [alignments[i] for i in kept]
        arcs = collect_arcs(sentences, loaded.causal, [a.aligned for a in alignments])
        if len(arcs.sentence) == 0:
            raise HeadscopeError("the sentences have no scorable arcs (only root and punct)")
        notes = [CAUSAL_NOTE] if loaded.causal else []
        if bos:
            notes.append(f"{tokenizer.bos_token} put in front of every sentence: the tokenizer adds no "
                         "special token and a causal model's attention sink should fall on a dropped token")
        if skipped:
            notes.append(f"{skipped} sentences skipped: longer than the context ({context} tokens)")
        if arcs.unaligned:
            notes.append(f"{arcs.unaligned} dependencies skipped: a word shares its only token with another word")
        pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
        return TreebankSet(sentences, alignments, arcs, len(bos), pad, notes, {"treebank": source}, skipped, bool(bos))

    def eval_probe(self, loaded, n_examples: int, seed: int) -> EvalProbe:
        """``eval_sentences`` with ``SENTENCES_PER_EXAMPLE * n_examples`` sentences."""
        return eval_sentences(loaded, SENTENCES_PER_EXAMPLE * n_examples, seed)


def eval_sentences(loaded, n_sentences: int, seed: int) -> EvalProbe:
    """A seeded sample of bundled-treebank sentences that fit the model's context, right-padded,
    BOS first for causal models as in the treebank probe; every word token scored."""
    tokenizer = loaded.tokenizer
    prefix, suffix = special_tokens(tokenizer, bos=loaded.causal)
    texts = [sentence.text for sentence in bundled_treebank()]
    rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
    context = loaded.context_length or float("inf")
    fitting = [row for row in rows if len(prefix) + len(row) + len(suffix) <= context]
    if not fitting:
        raise HeadscopeError(f"no treebank sentence fits {loaded.name}'s context of {context} tokens")
    order = torch.randperm(len(fitting), generator=torch.Generator().manual_seed(seed))
    rows = [fitting[i] for i in sorted(order[:n_sentences].tolist())]
    length = max(len(prefix) + len(r) + len(suffix) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    scored = torch.zeros_like(mask)
    for i, row in enumerate(rows):
        full = prefix + row + suffix
        ids[i, :len(full)] = torch.tensor(full)
        mask[i, :len(full)] = True
        scored[i, max(1, len(prefix)):len(prefix) + len(row)] = True
    return EvalProbe("treebank", ids, ids, mask, scored,
                     f"{len(rows)} sentences of the bundled treebank (of {len(fitting)} that fit), chosen by seed")
