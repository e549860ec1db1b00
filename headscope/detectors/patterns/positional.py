"""positional: heads whose top attention sits at a fixed relative position (Voita et al. 2019).

For an offset k, the per-example score is the share of queries i whose argmax key is i + k:
    mean over queries i with a real content key i + k of [argmax_j A[i, j] = i + k]
Offsets k in {-3, -2, +2, +3}; forward offsets score NaN in causal models (no query sees them).
Each head keeps its best offset (`headscope.detectors.variants`) and is labelled
`positional:<k>` (e.g. `positional:-2`).

Why |k| >= 2 only: offsets +-1 are the previous_token / next_token detectors (attention mass at
the offset, threshold 0.5). A head whose argmax is at i - 1 in 90% of queries nearly always has
most of its mass there too, so also scoring k = -1 here would give such a head two labels for
one behaviour (and often "mixed"). Keys before `content_start` (BOS, [CLS]) are not targets, so
a sink head is not positional at the offset that reaches the first token.

Threshold 0.9: Voita et al.'s own criterion, which is this argmax share ("at least 90% of the
time its maximum attention weight is at one relative position").
"""
from __future__ import annotations

import torch

from ...attention.pattern import Pattern, as_pattern
from ..protocol import Detector

__all__ = ["positional", "OFFSETS", "argmax_offset_share"]

OFFSETS = (-3, -2, 2, 3)


def argmax_offset_share(pattern: Pattern, batch, offsets=OFFSETS) -> torch.Tensor:
    """Share of queries whose argmax key is i + k, for each offset k.

    Args:
        pattern: a `Pattern` `[batch, head, query, key]` (whole rows: the argmax needs them).
        batch: a `ProbeBatch`.
        offsets: the offsets k.
    Returns:
        `[batch, head, offset]`, NaN where no query has a real content key at i + k.
    """
    pattern = as_pattern(pattern)
    top = pattern.argmax()  # (B, H, T) key index of each row's maximum
    valid = batch.attention_mask.bool()  # (B, T)
    t = valid.shape[1]
    positions = torch.arange(t, device=top.device)
    shares = []
    for k in offsets:
        target = positions + k  # (T,)
        inside = (target >= batch.content_start) & (target < t)
        queries = valid & inside & valid[:, target.clamp(0, t - 1)]  # (B, T)
        if batch.causal and k > 0:
            queries = torch.zeros_like(queries)
        hit = (top == target).to(pattern.dtype)  # (B, H, T)
        count = queries.sum(-1).to(pattern.dtype)[:, None]  # (B, 1)
        total = (hit * queries[:, None].to(pattern.dtype)).sum(-1)  # (B, H)
        shares.append(torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan"))))
    return torch.stack(shares, dim=-1)  # (B, H, offsets)


positional = Detector(
    name="positional", probe="text", threshold=0.9,
    formula="share of queries i whose argmax key is i + k (k in -3, -2, +2, +3; forward offsets only in "
            "bidirectional models), the head's best k; label positional:<k>",
    source="Voita et al. 2019 (positional heads: maximum attention weight at one relative position at least 90% "
           "of the time; threshold 0.9 is theirs); offsets +-1 are previous_token / next_token",
    fn=argmax_offset_share, lazy=False, quantity="share of queries (argmax)", opt_in=True,
    variants=tuple(f"{k:+d}" if k > 0 else str(k) for k in OFFSETS),
)