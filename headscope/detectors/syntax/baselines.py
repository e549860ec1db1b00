"""Position-only predictors of a word's partner: what a head gets without learning any syntax.

Offers:
    PREDICTORS      -- predictor names, in tie-break order (nearer offsets first).
    predictor_hits  -- ``[arc, predictor]`` bool: the predictor names the arc's gold partner.

For an attending word ``i`` of a sentence of ``n`` words, each predictor names one other word:
    ``offset k`` (k in -3..+3, k != 0): word ``i + k`` (Clark et al. 2019's baseline; they tried
        -3..+2);
    ``first word``: the first word that is not punctuation (the next one when that is ``i``).
        A causal head with flat attention over its prefix picks it: word-level attention sums
        over pieces, and the first word has the most attention when every token gets ``1/t``;
    ``last word``: the last word that is not punctuation (the one before when that is ``i``);
    ``most pieces``: the word split into the most tokens (first on ties, never ``i``). Flat
        attention summed over a word's pieces prefers it;
    ``previous content word`` / ``next content word``: the nearest word before / after ``i``
        whose UPOS is NOUN, PROPN, VERB, ADJ, ADV or NUM (misses when the treebank gives no
        UPOS).
A word is punctuation when it has no letter or digit. The baseline a head must beat is the best
of these predictors on the same arcs, together with the untrained control model's best head
(``crossfit``).
"""
from __future__ import annotations

import torch

from ...probes.arcs import Arcs
from .scoring import OFFSETS, offset_hits

__all__ = ["PREDICTORS", "predictor_hits", "CONTENT_UPOS"]

CONTENT_UPOS = frozenset({"NOUN", "PROPN", "VERB", "ADJ", "ADV", "NUM"})
_POSITIONAL = ("first word", "last word", "most pieces", "previous content word", "next content word")
PREDICTORS = tuple(f"offset {k:+d}" for k in OFFSETS) + _POSITIONAL


def predictor_hits(arcs: Arcs, sentences, pieces) -> torch.Tensor:
    """Which predictor names each arc's gold partner.

    Args:
        arcs: from ``scoring.collect_arcs`` on ``sentences``.
        sentences: the ``Sentence`` objects (``upos`` used when present).
        pieces: per sentence, the number of tokens of each word (sequence of ints).
    Returns:
        ``[arc, len(PREDICTORS)]`` bool, columns in ``PREDICTORS`` order.
    """
    n_words = max(len(s.words) for s in sentences)
    named = torch.full((len(sentences), n_words, len(_POSITIONAL)), -1, dtype=torch.long)  # (S, W, P)
    for index, (sentence, counts) in enumerate(zip(sentences, pieces)):
        for word, partners in enumerate(_partners(sentence, counts)):
            named[index, word] = torch.tensor(partners)
    positional = named[arcs.sentence, arcs.attending] == arcs.partner[:, None]  # (A, P)
    return torch.cat([offset_hits(arcs), positional], dim=1)


def _partners(sentence, counts):
    """Per word, the word each positional predictor names (-1: none)."""
    words = sentence.words
    n = len(words)
    real = [i for i, w in enumerate(words) if any(c.isalnum() for c in w)]
    upos = sentence.upos if len(sentence.upos) == n else ("_",) * n
    content = [i for i in range(n) if upos[i] in CONTENT_UPOS]
    most = sorted(range(n), key=lambda j: (-counts[j], j))  # most pieces first, then leftmost
    for i in range(n):
        others = [j for j in real if j != i]
        first = others[0] if others else -1
        last = others[-1] if others else -1
        widest = next((j for j in most if j != i), -1)
        before = max((j for j in content if j < i), default=-1)
        after = min((j for j in content if j > i), default=-1)
        yield (first, last, widest, before, after)
