"""Attention maths: headscope's own multi-head attention and the kernels under it.

- `module`: `MultiHeadAttention`, `Concat(head_1..head_h) W_O` with GQA, rotary, masks and hook
  points (re-exported here: `from headscope.attention import MultiHeadAttention`).
- `latent`: multi-head latent attention's projections (DeepSeek-V2/V3: keys and values from one
  low-rank latent per token), which `MultiHeadAttention(..., latent=LatentRanks(...))` uses.
- `config`: `AttentionConfig`, a module's resolved sizes and options.
- `kernel`: the attention function with transformers' SDPA signature (fast and explicit paths).
- `lazy`: per-head statistics of a pattern without its map (`A = exp(s - lse)`).
- `pattern`: the `Pattern` interface detectors read, dense or lazy.
- `rotary`: rotary position embeddings.
- `hook_points`: `HookPoint` and the `hooks()` context that always removes what it adds.
- `site_kinds`: `SITE_KINDS`, the kinds of attention site (causal, bidirectional, cross).

The re-export is lazy (`__getattr__`), so importing one of the modules above does not import
the module (and with it `headscope.hf`).
"""
from .._lazy import lazy_exports

__all__ = ["MultiHeadAttention", "LatentRanks"]
__getattr__, __dir__ = lazy_exports(__name__, {"MultiHeadAttention": "module", "LatentRanks": "latent"})
