"""The shared formula of fixed-offset heads (previous-token, next-token, self).

previous_token:  mean over queries i >= 1 of A[i, i-1]
next_token:      mean over queries i < n-1 of A[i, i+1]   (bidirectional models only)
self:            mean over queries i >= 1 of A[i, i]       (i = 0 skipped: in a causal model its
                                                            only key is itself)
Queries and keys are real tokens of the natural-text probe. Source: Voita et al. 2019
("positional heads", their max weight at a fixed relative position) and Clark et al. 2019
(four previous-token and five next-token heads in BERT-base). Threshold 0.5: the share of
attention at that offset used by Clark et al.'s released code to call a head positional.
"""
from __future__ import annotations

import torch

from ...attention.pattern import Pattern, as_pattern
from ..protocol import masked_query_mean

__all__ = ["offset_score"]


def offset_score(pattern: Pattern, batch, offset: int) -> torch.Tensor:
    """Mean of A[i, i + offset] over real queries whose key i + offset is a real token.

    Args:
        pattern: a `Pattern` `[batch, head, query, key]`.
        batch: a `ProbeBatch`.
        offset: -1 previous token, +1 next token, 0 self.
    Returns:
        `[batch, head]`.
    """
    valid = batch.attention_mask.bool()  # (B, T)
    diag = as_pattern(pattern).diagonal(offset)  # (B, H, T - |offset|)
    n = diag.shape[-1]
    if offset < 0:
        queries = valid[:, -offset:] & valid[:, :n]
    elif offset > 0:
        queries = valid[:, :n] & valid[:, offset:]
    else:
        queries = valid.clone()
        queries[:, 0] = False
    return masked_query_mean(diag, queries)

