"""rare_word: heads whose top attention goes to the least frequent token (Voita et al. 2019).

Frequency: occurrences of the token id in the bundled text corpus, tokenized by the model's
tokenizer (`headscope.probes.base.token_counts`, carried by the text probe's batches); a batch
without counts (patterns scored from a notebook) counts its own tokens. In each example, the
targets are the positions holding a token of the lowest count among its content tokens (after
`content_start`; ties all count), except position 0: attention to the first token is the
sink's (Xiao et al. 2023), so an example whose rarest token is only there is left out (NaN).
    mean over queries i that see a target j != i of [argmax_j A[i, j] is a target != i]
(in a causal model query i sees keys j <= i). Threshold 0.5 (most queries): Voita et al. give no
threshold; their rare-word head points at the rarest token 66% of the time.
"""
from __future__ import annotations

import torch

from ...attention.pattern import Pattern, as_pattern
from ..protocol import Detector, masked_query_mean

__all__ = ["rare_word", "rare_targets"]


def rare_targets(batch) -> torch.Tensor:
    """`[batch, pos]` bool: the positions (not 0) holding the example's least frequent token."""
    def build():
        ids, valid = batch.input_ids, batch.attention_mask.bool()
        counts = batch.token_counts
        if counts is None:
            counts = torch.bincount(ids[valid], minlength=int(ids.max()) + 1)
        counts = counts.to(ids.device)
        inside = ids < counts.shape[0]
        freq = torch.where(inside, counts[ids.clamp(max=counts.shape[0] - 1)], torch.zeros_like(ids)).double()
        candidate = valid.clone()
        candidate[:, : batch.content_start] = False
        freq = torch.where(candidate, freq, torch.full_like(freq, float("inf")))
        lowest = freq.min(dim=-1, keepdim=True).values  # (B, 1)
        targets = candidate & (freq == lowest)
        targets[:, 0] = False  # a rarest token only at position 0 leaves the example unscored
        return targets
    return batch.cached("rare_targets", build)


def rare_word_score(pattern: Pattern, batch) -> torch.Tensor:
    """`[batch, head]` share of queries whose argmax key is a rare-token position other than itself."""
    targets = rare_targets(batch)  # (B, T)
    t = targets.shape[1]
    positions = torch.arange(t, device=targets.device)
    seen = targets[:, None, :] & batch.key_allowed() & (positions[:, None] != positions[None, :])  # (B, Q, K)
    queries = seen.any(-1)  # (B, Q)
    pattern = as_pattern(pattern)
    top = pattern.argmax()  # (B, H, Q)
    hit = targets[:, None, :].expand(-1, pattern.shape[1], -1).gather(-1, top) & (top != positions)  # (B, H, Q)
    return masked_query_mean(hit.to(pattern.dtype), queries)


rare_word = Detector(
    name="rare_word", probe="text", threshold=0.5,
    formula="share of queries (that see one) whose argmax key holds the example's least frequent token "
            "(frequency in the bundled text corpus; position 0 and special tokens excluded)",
    source="Voita et al. 2019 (rare-word head, 66% of the time on the rarest token); threshold 0.5 (most queries) "
           "since they give none",
    fn=rare_word_score, lazy=False, quantity="share of queries (argmax)", opt_in=True,
)