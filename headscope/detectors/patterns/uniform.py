"""Uniform ("broad") heads: attention spread evenly over every key a query may see.

uniform: mean over queries with n_i >= 8 of H(A_i) / ln(n_i), where H is the entropy in nats
and n_i the number of keys query i may attend to (earlier-or-equal real tokens in a causal
model, all real tokens in an encoder, all real encoder positions at a cross-attention site,
`ProbeBatch.key_counts`). 1 means perfectly uniform.
Source: Clark et al. 2019 ("broad" heads put at most ~10% on any word; their code uses mean
entropy >= 3.8 nats). headscope normalises by ln(n_i) so the score does not depend on length;
threshold 0.9. Queries with fewer than 8 keys are skipped (their entropy says little).
"""
from __future__ import annotations

import torch

from ...attention.pattern import Pattern, as_pattern
from ..protocol import Detector, masked_query_mean

__all__ = ["uniform", "uniform_score", "MIN_KEYS"]

MIN_KEYS = 8


def uniform_score(pattern: Pattern, batch, min_keys: int = MIN_KEYS) -> torch.Tensor:
    """Normalised entropy per example `[batch, head]`; see the module docstring."""
    n_keys = batch.key_counts()  # (B, Tq)
    normalised = as_pattern(pattern).entropy() / torch.log(n_keys.clamp(min=2).float())[:, None, :]  # (B, H, Tq)
    queries = (n_keys >= min_keys) & batch.attention_mask.bool()
    return masked_query_mean(normalised, queries)


uniform = Detector(
    name="uniform", probe="text", threshold=0.9,
    formula=f"mean over queries with n_i >= {MIN_KEYS} keys of H(A_i) / ln(n_i)",
    source="Clark et al. 2019 (broad heads, entropy >= 3.8 nats); normalised by ln(n_i), threshold 0.9",
    fn=lambda pattern, batch: uniform_score(pattern, batch), lazy=True, row_entropy=True, learned=False,
    quantity="normalised entropy", colour="#bcbd22", short="unif", applies_to=("causal", "bidirectional", "cross"),
)