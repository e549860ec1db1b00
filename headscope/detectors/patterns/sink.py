"""Attention-sink heads: most attention on the first position.

sink: mean over queries i >= 1 of A[i, 0]
At a cross-attention site key 0 is the encoder's first position, which no decoder query is,
so every real query counts, i = 0 included (probes pad on the right: position 0 is real):
sink (cross): mean over real decoder queries i of A[i, 0]
In self-attention query 0 is left out because key 0 is the query itself (its only key in a
causal model, where A[0, 0] = 1 says nothing).
Source: Xiao et al. 2023 (StreamingLLM): beyond the bottom layers, LLMs put most attention on
the first token in most heads; such heads must be labelled sinks, not uniform or positional.
Threshold 0.6: Clark et al. 2019's code calls a head special-token-focused at >= 0.6 of its
attention on [CLS]/[SEP].
"""
from __future__ import annotations

from ...attention.pattern import as_pattern
from ..protocol import Detector, masked_query_mean

__all__ = ["sink"]


def _sink(pattern, batch):
    queries = batch.attention_mask.bool().clone()  # (B, Q)
    if batch.site_kind != "cross":  # key 0 is query 0 itself
        queries[:, 0] = False
    return masked_query_mean(as_pattern(pattern).column(0), queries)


sink = Detector(
    name="sink", probe="text", threshold=0.6,
    formula="mean over queries i >= 1 of A[i, 0] (attention on the first position; at cross-attention sites "
            "every real decoder query, on the encoder's first position)",
    source="Xiao et al. 2023 (StreamingLLM attention sinks); threshold 0.6 from Clark et al. 2019's special-token heads",
    fn=_sink, lazy=True, learned=False, colour="#8c564b", short="sink",
    applies_to=("causal", "bidirectional", "cross"),
)