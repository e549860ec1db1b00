"""The hook contract of an adapter, shared by the five-family and the all-family tests."""
import torch

from headscope.attention import MultiHeadAttention
from headscope.hf.adapters import attention_blocks
from headscope.attention.hook_points import hook_points


@torch.no_grad()
def assert_hook_contract(model) -> None:
    """Every hook point of the first layer's `from_hf` module exists and fires once with its shape."""
    _, block = attention_blocks(model)[0]
    m = MultiHeadAttention.from_hf(block, model.config)
    c = m.config
    B, T = 2, 5
    expected = {
        "hook_q": (B, c.n_heads, T, c.d_head), "hook_k": (B, c.n_kv_heads, T, c.d_head),
        "hook_v": (B, c.n_kv_heads, T, c.d_head), "hook_scores": (B, c.n_heads, T, T),
        "hook_pattern": (B, c.n_heads, T, T), "hook_z": (B, T, c.n_heads, c.d_head),
        "hook_result": (B, T, c.n_heads, c.d_model),
    }
    assert set(hook_points(m)) == set(expected)
    seen = {}
    with m.hooks({n: (lambda n: lambda v, h: seen.setdefault(n, []).append(tuple(v.shape)))(n) for n in expected}):
        m(torch.randn(B, T, c.d_model))
    assert seen == {n: [s] for n, s in expected.items()}
