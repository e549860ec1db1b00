"""One interface to a layer's attention pattern, whether the map exists or not.

- `Pattern`: what a detector reads, `[batch, head, query, key]`: `shape`, `device`, `dtype`,
  `diagonal(offset)`, `column(key)`, `mass(targets)`, `entropy()`, `argmax()` and `dense()`.
- `DensePattern(tensor)`: the interface over a computed map.
- `headscope.attention.lazy.LazyPattern`: the same interface from the fused kernel's row log-sum-exp,
  without the map (`argmax` and `dense` compute it).
- `as_pattern(x)`: a tensor wrapped as a `DensePattern`; a `Pattern` unchanged. The one place
  that asks which kind a pattern is.

Both implementations give the same numbers to float rounding (tests/attention/test_lazy.py).
"""
from __future__ import annotations

from typing import Union

import torch

from .lazy import LazyPattern
from .targets import Targets

__all__ = ["Pattern", "DensePattern", "as_pattern"]


class DensePattern:
    """A computed pattern `[batch, head, query, key]` behind the `Pattern` methods; never modified."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.tensor.shape)

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    def diagonal(self, offset: int) -> torch.Tensor:
        """`[batch, head, n]` A[i, i + offset] (the order of `Tensor.diagonal(offset, -2, -1)`)."""
        return self.tensor.diagonal(offset=offset, dim1=-2, dim2=-1)

    def column(self, key: int) -> torch.Tensor:
        """`[batch, head, query]` A[:, key]."""
        return self.tensor[..., key]

    def mass(self, targets) -> torch.Tensor:
        """`[batch, head, query]` sum of A[i, j] over keys j with `targets[b, i, j]` (`Targets`, or a
        `[batch, query, key]` bool mask): the target entries gathered, no second map."""
        targets = Targets.of(targets)
        return targets.sum_over(self.tensor.permute(0, 2, 3, 1)[targets.b, targets.i, targets.j])  # (n, H) summed

    def entropy(self) -> torch.Tensor:
        """`[batch, head, query]` row entropy -sum_j A[i, j] ln A[i, j] in nats."""
        # One head at a time, so no second full-size map is allocated.
        return torch.stack([-torch.special.xlogy(self.tensor[:, h], self.tensor[:, h]).sum(-1)
                            for h in range(self.tensor.shape[1])], dim=1)

    def argmax(self) -> torch.Tensor:
        """`[batch, head, query]` the key of each row's maximum."""
        return self.tensor.argmax(dim=-1)

    def dense(self) -> torch.Tensor:
        """The map itself, `[batch, head, query, key]`."""
        return self.tensor


Pattern = Union[DensePattern, LazyPattern]


def as_pattern(pattern: Union[torch.Tensor, Pattern]) -> Pattern:
    """A `Pattern` for a map tensor or a pattern object (returned as it is)."""
    return DensePattern(pattern) if isinstance(pattern, torch.Tensor) else pattern
