"""Attention modules whose head geometry is known by construction, for the subspace tests:
`shared_heads(d_model, n_heads, seed)` is a `MultiHeadAttention` whose heads all hold the same
W_Q, W_K, W_V and W_O slices, so every pair of heads overlaps exactly (1.0) in every role."""
import torch

from headscope.attention import MultiHeadAttention


def shared_heads(d_model=96, n_heads=3, seed=0):
    """Every head holds the same W_Q, W_K, W_V and W_O slices."""
    torch.manual_seed(seed)
    module = MultiHeadAttention(d_model, n_heads)
    d = module.config.d_head
    with torch.no_grad():
        for w in (module.W_q.weight, module.W_k.weight, module.W_v.weight):
            w.copy_(w[:d].repeat(n_heads, 1))  # (H * D, d_model)
        module.W_o.weight.copy_(module.W_o.weight[:, :d].repeat(1, n_heads))  # (d_model, H * D)
    return module
