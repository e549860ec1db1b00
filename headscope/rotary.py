"""Rotary position embedding (Su et al. 2021, RoFormer), in the "rotate half" layout.

- `rotary_cos_sin(positions, dim, base)`: cos and sin tables `[..., pos, dim]`.
- `apply_rotary(x, cos, sin)`: rotates the first `cos.shape[-1]` dims of each head of x.

Layout: dims i and i + dim/2 form a pair rotated by angle pos * base^(-2i/dim); this is the
layout of Llama, Mistral, Qwen2 and GPT-NeoX checkpoints in Hugging Face transformers.
"""
from __future__ import annotations

import torch

__all__ = ["rotary_cos_sin", "apply_rotary"]


def rotary_cos_sin(
    positions: torch.Tensor, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cos and sin tables for integer positions.

    Args:
        positions: `[pos]` or `[batch, pos]` integer positions.
        dim: number of rotated dims per head (even).
        base: the rotary base (theta).
    Returns:
        `(cos, sin)`, each `[..., pos, dim]` in `dtype`.
    """
    if dim % 2:
        raise ValueError(f"rotary dim must be even, got {dim}")
    inv_freq = base ** -(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (..., pos, dim/2)
    angles = torch.cat([angles, angles], dim=-1).float()  # (..., pos, dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the leading `cos.shape[-1]` dims of every head; the rest pass through.

    Args:
        x: `[batch, head, pos, d_head]`.
        cos, sin: `[pos, rot]` or `[batch, pos, rot]`, rot <= d_head.
    Returns:
        Tensor shaped like x.
    """
    rot = cos.shape[-1]
    if cos.dim() == 3:  # (B, T, rot) -> (B, 1, T, rot) to broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    rotated = x_rot * cos.to(x.dtype) + _rotate_half(x_rot) * sin.to(x.dtype)
    return torch.cat([rotated, x_pass], dim=-1) if x_pass.shape[-1] else rotated
