"""The kinds of attention site, the vocabulary detectors and probe batches share.

- `SITE_KINDS`: "causal" (self-attention where a query sees keys up to itself: a decoder's),
  "bidirectional" (self-attention over every token: an encoder's) and "cross" (queries from a
  decoder's tokens, keys over an encoder's positions: an encoder-decoder's cross-attention).

No torch: the detector registry reads it to choose defaults without loading any detector.
"""
from __future__ import annotations

__all__ = ["SITE_KINDS"]

SITE_KINDS = ("causal", "bidirectional", "cross")
