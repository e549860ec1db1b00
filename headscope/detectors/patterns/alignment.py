"""Monotonic-alignment heads of cross-attention: the attended encoder position advances with
the decoder's position.

Per example and head, with a_i = argmax_j A[i, j] the encoder position query i attends to most
(the first such key, as `torch.argmax` breaks ties) over the real decoder queries i:

    alignment = Spearman's rho(i, a_i)
              = Pearson correlation of rank(i) and rank(a_i)

ranks being average ranks (tied argmaxes share the mean of their ranks, as in
`scipy.stats.spearmanr`). 1: the argmax moves forward at every step; about 0 (within
~1/sqrt(n - 1)) for argmaxes drawn at random; -1 for a reversed order. A head whose argmax never
moves (a sink on encoder position 0, or rows so flat that every argmax is the first key) shows
no dependence on the query and scores 0, not NaN: leaving such examples out would let a head
that rests on one position most of the time score on the few where it moves. An example with
fewer than `MIN_QUERIES` real queries is left out (NaN), as a rank correlation of a few points
says little. Padded keys carry no weight (the model masks them), so every argmax is a real key.

Why a rank correlation of the argmax: Whisper's alignment heads (the model: Radford et al. 2022,
"Robust Speech Recognition via Large-Scale Weak Supervision"; the heads and the word timestamps,
after the paper, in openai/whisper's `timing.py`, `_ALIGNMENT_HEADS` per model) are the
cross-attention heads whose attention follows the audio in time; word timestamps come from
dynamic time warping through those heads' maps, i.e. the best monotone path. Monotonic attention (Raffel et al. 2017,
"Online and Linear-Time Attention by Enforcing Monotonic Alignments") makes the attended index
non-decreasing in the output step by construction. Both ask for an order, not a rate: an audio
encoder gives several frames per token, a translation reorders a little, and the copy probe
(`headscope.probes.copy`) puts decoder token i at encoder position i - 1 while it predicts the one
at i. A rank correlation is 1 for every strictly increasing alignment, whatever its rate or
offset, where a share of steps that advance by 1..w positions would need a rate, and one that
counts an advance of 0 would score a sink head 1.

Threshold 0.8 is headscope's: neither source gives one (Whisper's code lists its heads per model,
with no score). A strong rank correlation: random argmaxes over 128 queries (the copy
probe's default) reach 0.8 with a chance of about 1e-19 (rho ~ N(0, 1/(n - 1)) under no
dependence). The label claims a learned behaviour, so a head also needs its CI lower
bound above the untrained control's best head (`headscope.detectors.labels`): in an untrained
twin a head can align on token identity alone where the decoder reads the encoder's tokens
shifted, and the control measures that.
"""
from __future__ import annotations

import torch

from ...attention.pattern import Pattern, as_pattern
from ..protocol import Detector

__all__ = ["alignment", "alignment_score", "average_ranks", "MIN_QUERIES"]

MIN_QUERIES = 8


def average_ranks(values: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """1-based ranks of `values` among the chosen entries of the last axis, ties sharing their
    mean rank; 0 where not chosen.

    Args:
        values: `[..., n]`.
        chosen: `[..., n]` bool (broadcast against `values`).
    Returns:
        `[..., n]` float64.
    """
    values = values.double()
    chosen = chosen.expand_as(values)
    others = chosen[..., None, :]  # (..., 1, n): entry j counts only if chosen
    below = ((values[..., None, :] < values[..., :, None]) & others).sum(-1)  # (..., n)
    equal = ((values[..., None, :] == values[..., :, None]) & others).sum(-1)  # includes itself
    ranks = below + (equal + 1) / 2
    return torch.where(chosen, ranks, torch.zeros_like(ranks))


def alignment_score(pattern: Pattern, batch, min_queries: int = MIN_QUERIES) -> torch.Tensor:
    """Spearman's rho between query position and argmax key per example `[batch, head]`; see
    the module docstring (0 for a constant argmax, NaN under `min_queries` real queries)."""
    pattern = as_pattern(pattern)
    top = pattern.argmax()  # (B, H, Q) encoder position each query attends to most
    queries = batch.attention_mask.bool()[:, None, :]  # (B, 1, Q)
    n = queries.sum(-1).double()  # (B, 1)
    positions = torch.arange(top.shape[-1], device=top.device).expand(top.shape[0], 1, -1)  # (B, 1, Q)
    mean_rank = ((n + 1) / 2)[..., None]  # (B, 1, 1): the mean of 1..n, ties or not
    x = torch.where(queries, average_ranks(positions, queries) - mean_rank, 0.0)  # (B, 1, Q)
    y = torch.where(queries, average_ranks(top, queries) - mean_rank, 0.0)  # (B, H, Q)
    covariance = (x * y).sum(-1)  # (B, H)
    spread = ((x * x).sum(-1) * (y * y).sum(-1)).sqrt()
    rho = torch.where(spread > 0, covariance / spread.clamp(min=1e-300), torch.zeros_like(covariance))
    rho = torch.where(n >= min_queries, rho, torch.full_like(rho, float("nan")))
    return rho.to(pattern.dtype)


alignment = Detector(
    name="alignment", probe="copy", threshold=0.8,
    formula=f"Spearman rank correlation between a real decoder query's position and its argmax encoder position "
            f"(average ranks for ties; 0 when the argmax never moves; examples with under {MIN_QUERIES} queries "
            f"left out); cross-attention only",
    source="Whisper's alignment heads (Radford et al. 2022; openai/whisper timing.py: cross-attention heads that "
           "follow the audio in time, read by dynamic time warping for word timestamps); monotonic attention "
           "(Raffel et al. 2017); threshold 0.8 is headscope's (neither gives one), with the untrained control's "
           "best head to beat",
    fn=alignment_score, lazy=False, quantity="rank correlation (argmax key vs query)", applies_to=("cross",),
    short="align", colour="#393b79",
)
