"""Shared formulas of heads that look at earlier copies of the current token.

Both read the repeated-random-tokens probe, where every token of a later repeat has earlier
occurrences. For query i, let E_i = {j < i : x_j = x_i} (earlier occurrences).
induction:        mean over queries with E_i non-empty of  sum_{j in E_i} A[i, j+1]
                  (attention to the token right after an earlier occurrence: prefix matching)
duplicate_token:  mean over queries with E_i non-empty of  sum_{j in E_i} A[i, j]
Only queries that have a target are averaged. TransformerLens's detect_head divides by every
query instead, so on two copies a perfect induction head scores about 0.5; here it scores 1.
With more than two repeats a query's targets are all earlier occurrences (for two copies this
is Olsson et al.'s single target).
Sources: Olsson et al. 2022 (prefix-matching score on 25 random tokens x 4 with a start token;
threshold 0.4 as common practice, e.g. ARENA); duplicate-token heads: Wang et al. 2022 (IOI),
threshold 0.4 by analogy.
"""
from __future__ import annotations

import torch

from ...attention.pattern import Pattern, as_pattern
from ...attention.targets import Targets, pairs_in_blocks
from ..protocol import masked_query_mean

__all__ = ["earlier_copies", "induction_targets", "mass_on"]


def earlier_copies(batch) -> Targets:
    """Key j < query i holds the same token as i (both real, j after the start tokens), as
    `Targets` (built a block of queries at a time: no `[query, key]` mask)."""
    def build():
        ids = batch.input_ids
        valid = batch.attention_mask.bool()
        n = ids.shape[1]
        keys = torch.arange(n, device=ids.device)

        def pair(rows: slice) -> torch.Tensor:
            queries = torch.arange(rows.start, rows.stop, device=ids.device)
            same = (ids[:, rows, None] == ids[:, None, :]) & valid[:, rows, None] & valid[:, None, :]  # (B, rows, K)
            return same & (keys[None, :] < queries[:, None]) & (keys >= batch.content_start)[None, :]
        return pairs_in_blocks((ids.shape[0], n, n), pair, ids.device)
    return batch.cached("earlier_copies", build)


def induction_targets(batch) -> Targets:
    """Key j+1 follows an earlier occurrence j of query i's token (j+1 real), as `Targets`."""
    def build():
        copies = earlier_copies(batch)
        after = copies.j + 1  # j < i, so j + 1 <= i is a key
        keep = batch.attention_mask.bool()[copies.b, after]
        return Targets(copies.b[keep], copies.i[keep], after[keep], copies.shape)
    return batch.cached("induction_targets", build)


def mass_on(pattern: Pattern, targets) -> torch.Tensor:
    """`[batch, head]` mean over queries with a target of the attention on their targets (`Targets`
    or a `[batch, query, key]` bool mask)."""
    targets = Targets.of(targets)
    mass = as_pattern(pattern).mass(targets)  # (B, H, T)
    return masked_query_mean(mass, targets.queries())
