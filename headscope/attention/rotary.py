"""Rotary position embedding (Su et al. 2021, RoFormer).

- `rotary_cos_sin(positions, dim, base, interleaved=False)`: cos and sin tables `[..., pos, dim]`.
- `apply_rotary(x, cos, sin, interleaved=False)`: rotates the first `cos.shape[-1]` dims of each
  head of x.
- `full_width(cos, sin, dim, interleaved)`: tables given for one angle per pair (`dim / 2`
  wide, as gpt-oss and GPT-J pass them) widened to `dim`.

Two layouts pair the dims differently. "Rotate half" (Llama, Mistral, Qwen2, GPT-NeoX, ...):
dims i and i + dim/2 form a pair rotated by angle pos * base^(-2i/dim); tables hold the angles
twice, `[a_0 .. a_{dim/2-1}, a_0 .. a_{dim/2-1}]`. Interleaved (GPT-J, Cohere): dims 2i and 2i + 1
form the pair; tables hold each angle twice in a row, `[a_0, a_0, a_1, a_1, ...]`.
"""
from __future__ import annotations

import torch

__all__ = ["rotary_cos_sin", "apply_rotary", "full_width"]


def _widen(half: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """One value per pair `[..., dim/2]` -> `[..., dim]` in the layout's order."""
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat([half, half], dim=-1)


def rotary_cos_sin(
    positions: torch.Tensor, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cos and sin tables for integer positions.

    Args:
        positions: `[pos]` or `[batch, pos]` integer positions.
        dim: number of rotated dims per head (even).
        base: the rotary base (theta).
        interleaved: lay the tables out for pairs (2i, 2i + 1) instead of (i, i + dim/2).
    Returns:
        `(cos, sin)`, each `[..., pos, dim]` in `dtype`.
    """
    if dim % 2:
        raise ValueError(f"rotary dim must be even, got {dim}")
    inv_freq = base ** -(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (..., pos, dim/2)
    angles = _widen(angles, interleaved).float()  # (..., pos, dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def full_width(cos: torch.Tensor, sin: torch.Tensor, dim: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables `[..., dim]` from tables that are `dim` or `dim / 2` (one angle per pair) wide."""
    if cos.shape[-1] * 2 == dim:
        return _widen(cos, interleaved), _widen(sin, interleaved)
    return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., ::2], x[..., 1::2]  # (..., dim/2) each
    return torch.stack([-odd, even], dim=-1).flatten(-2)  # (..., dim): [-x1, x0, -x3, x2, ...]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate the leading `cos.shape[-1]` dims of every head; the rest pass through.

    Args:
        x: `[batch, head, pos, d_head]`.
        cos, sin: `[pos, rot]` or `[batch, pos, rot]`, rot <= d_head, in the layout chosen by
            `interleaved`.
        interleaved: pairs are (2i, 2i + 1) instead of (i, i + rot/2).
    Returns:
        Tensor shaped like x.
    """
    rot = cos.shape[-1]
    if cos.dim() == 3:  # (B, T, rot) -> (B, 1, T, rot) to broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    turned = _rotate_pairs(x_rot) if interleaved else _rotate_half(x_rot)
    rotated = x_rot * cos.to(x.dtype) + turned * sin.to(x.dtype)
    return torch.cat([rotated, x_pass], dim=-1) if x_pass.shape[-1] else rotated
