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
from ..protocol import masked_query_mean

__all__ = ["earlier_copies", "induction_targets", "mass_on"]


def earlier_copies(batch) -> torch.Tensor:
    """`[batch, query, key]` bool: key j < query i holds the same token as i (both real)."""
    def build():
        ids = batch.input_ids
        valid = batch.attention_mask.bool()
        same = (ids[:, :, None] == ids[:, None, :]) & valid[:, :, None] & valid[:, None, :]
        t = ids.shape[1]
        before = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril(-1)
        same = same & before
        same[:, :, : batch.content_start] = False  # special start tokens are not copies
        return same
    return batch.cached("earlier_copies", build)


def induction_targets(batch) -> torch.Tensor:
    """`[batch, query, key]` bool: key j+1 follows an earlier occurrence j of query i's token."""
    def build():
        copies = earlier_copies(batch)
        targets = torch.zeros_like(copies)
        targets[:, :, 1:] = copies[:, :, :-1]
        return targets & batch.attention_mask.bool()[:, None, :]
    return batch.cached("induction_targets", build)


def mass_on(pattern: Pattern, targets: torch.Tensor) -> torch.Tensor:
    """`[batch, head]` mean over queries with a target of the attention on their targets (`[batch, query, key]`)."""
    mass = as_pattern(pattern).mass(targets)  # (B, H, T)
    return masked_query_mean(mass, targets.any(-1))

