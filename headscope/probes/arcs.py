"""The dependency arcs a treebank batch is scored on.

- `Arcs`: one row per (dependency, direction) that counts, as tensors `[arc]`.
- `collect_arcs(sentences, causal, aligned=None)`: both directions of every dependency except
  root and punct; in a causal model only arcs whose partner precedes the attending word.
- `DIRECTIONS` ("dep->head": the dependent attends to its head; "head->dep"),
  `EXCLUDED_RELATIONS` (root, punct).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Arcs", "collect_arcs", "DIRECTIONS", "EXCLUDED_RELATIONS"]

DIRECTIONS = ("dep->head", "head->dep")
EXCLUDED_RELATIONS = frozenset({"root", "punct"})


@dataclass(frozen=True)
class Arcs:
    """The scored arcs, one per (dependency, direction); all tensors ``[arc]`` long.

    Attributes:
        sentence: index of the sentence.
        attending: 0-based word that attends (the dependent for "dep->head").
        partner: 0-based word it should attend to.
        relation: index into ``relations``.
        direction: index into ``DIRECTIONS``.
        relations: relation names, sorted (UD subtypes kept, e.g. "nmod:poss").
        causal_only: True when only arcs whose partner precedes the attending word were kept.
        unaligned: dependencies dropped because a word owns no token.
    """

    sentence: torch.Tensor
    attending: torch.Tensor
    partner: torch.Tensor
    relation: torch.Tensor
    direction: torch.Tensor
    relations: tuple[str, ...]
    causal_only: bool
    unaligned: int = 0

    @property
    def group(self) -> torch.Tensor:
        """``[arc]``: relation * 2 + direction, one id per (relation, direction)."""
        return self.relation * len(DIRECTIONS) + self.direction

    @property
    def n_groups(self) -> int:
        return len(self.relations) * len(DIRECTIONS)


def collect_arcs(sentences, causal: bool, aligned=None) -> Arcs:
    """Both directions of every dependency except root and punct.

    Args:
        sentences: ``Sentence`` objects.
        causal: keep, per direction, only arcs whose partner precedes the attending word.
        aligned: optional per-sentence sequences of per-word bools (``Alignment.aligned``);
            dependencies touching a word without tokens are dropped and counted.
    Returns:
        ``Arcs``.
    """
    rows, unaligned = [], 0
    for index, sentence in enumerate(sentences):
        for dependent, (head, relation) in enumerate(zip(sentence.heads, sentence.relations)):
            if head == 0 or relation.split(":")[0] in EXCLUDED_RELATIONS:
                continue
            head -= 1
            if aligned is not None and not (aligned[index][dependent] and aligned[index][head]):
                unaligned += 1
                continue
            for direction, (attending, partner) in enumerate(((dependent, head), (head, dependent))):
                if not causal or partner < attending:
                    rows.append((index, attending, partner, relation, direction))
    relations = tuple(sorted({row[3] for row in rows}))
    code = {name: i for i, name in enumerate(relations)}
    columns = list(zip(*rows)) if rows else [(), (), (), (), ()]
    as_long = lambda values: torch.tensor(values, dtype=torch.long)
    return Arcs(as_long(columns[0]), as_long(columns[1]), as_long(columns[2]),
                as_long([code[name] for name in columns[3]]), as_long(columns[4]), relations, causal, unaligned)
