"""Attention inputs with known structure, and the check that a `LazyPattern` is the full map, shared
by the lazy path's CPU tests and its CUDA tests.

- `qkv(seed, batch, heads, kv_heads, length, d_head)`: `[batch, head, pos, d_head]` q, k, v
  (grouped: `heads` query heads share `kv_heads`), scaled so the patterns are sharp.
- `MASKS`: name -> `(batch, heads, length) -> (mask, is_causal, real rows)`: causal, left
  padding as a boolean mask or with the causal flag, an additive ALiBi bias (`alibi`), none.
- `EXTRAS`: name -> keywords for soft-capping, sink logits, both.
- `assert_lazy_is_the_pattern(z, lazy, z_ref, pattern, rows, ...)`: z, diagonals, key columns,
  masses and entropies of the lazy pattern equal the full map's within `tolerance` (`FP32`).
"""
import torch

FP32 = dict(atol=1e-5, rtol=0)  # fp32: the fused kernel and the explicit path round differently


def qkv(seed=0, batch=2, heads=6, kv_heads=2, length=40, d_head=16):
    """Random q `[batch, heads, length, d_head]` and k, v `[batch, kv_heads, length, d_head]`."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, d_head, generator=g) * 2  # sharp enough to matter
    k = torch.randn(batch, kv_heads, length, d_head, generator=g) * 2
    v = torch.randn(batch, kv_heads, length, d_head, generator=g)
    return q, k, v


def padded_causal(batch, length, n_pad=5):
    """`(real [batch, length], mask [batch, 1, length, length])`: example 1 left-padded by `n_pad`, causal."""
    real = torch.ones(batch, length, dtype=torch.bool)
    real[1, :n_pad] = False  # left padding: the first rows of example 1 see no real key
    mask = real[:, None, None, :] & torch.ones(length, length, dtype=torch.bool).tril()
    return real, mask


def alibi(heads, length):
    """An additive bias that is neither 0 nor hidden (slopes per head), plus the causal mask."""
    distance = (torch.arange(length)[None, :] - torch.arange(length)[:, None]).float()
    bias = distance[None] * torch.tensor([2.0 ** -(h + 1) for h in range(heads)])[:, None, None]
    return bias.masked_fill(distance > 0, float("-inf"))[None]  # (1, H, T, T)


MASKS = {
    "causal": lambda b, h, t: (None, True, torch.ones(b, t, dtype=torch.bool)),
    "padded bool": lambda b, h, t: (padded_causal(b, t)[1], False, padded_causal(b, t)[0]),
    "padding and causal flag": lambda b, h, t: (padded_causal(b, t)[0][:, None, None, :], True, padded_causal(b, t)[0]),
    "additive bias": lambda b, h, t: (alibi(h, t), False, torch.ones(b, t, dtype=torch.bool)),
    "bidirectional": lambda b, h, t: (None, False, torch.ones(b, t, dtype=torch.bool)),
}


def assert_lazy_is_the_pattern(z, lazy, z_ref, pattern, rows, offsets=(-1, 0), keys=(0,), tolerance=FP32):
    """z, diagonals, key columns, masses of random targets and entropies of a `LazyPattern` equal
    the full map's (`pattern`, explicit path) on the rows that see a real key; returns the targets."""
    b, _, t, _ = pattern.shape
    torch.testing.assert_close(z.transpose(1, 2)[rows], z_ref.transpose(1, 2)[rows], **tolerance)
    for offset in offsets:
        ours, ref = lazy.diagonal(offset), pattern.diagonal(offset=offset, dim1=-2, dim2=-1)
        first = max(0, -offset)
        keep = rows[:, first:first + ref.shape[-1]]
        torch.testing.assert_close(ours.transpose(1, 2)[keep], ref.transpose(1, 2)[keep], **tolerance)
    for key in keys:
        torch.testing.assert_close(lazy.column(key).transpose(1, 2)[rows], pattern[..., key].transpose(1, 2)[rows],
                                   **tolerance)
    g = torch.Generator().manual_seed(3)
    targets = ((torch.rand(b, t, t, generator=g) < 0.15) & rows[:, :, None].cpu()).to(pattern.device)
    torch.testing.assert_close(lazy.mass(targets), (pattern * targets[:, None]).sum(-1), **tolerance)
    entropy = -torch.special.xlogy(pattern, pattern).sum(-1)
    torch.testing.assert_close(lazy.entropy().transpose(1, 2)[rows], entropy.transpose(1, 2)[rows], **tolerance)
    return targets


EXTRAS = {
    "softcap": dict(softcap=1.5),
    "sinks": dict(sinks=torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])),
    "softcap and sinks": dict(softcap=1.5, sinks=torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])),
}
