"""The keys a detector reads for each query, without a `[query, key]` map.

A detector that sums attention over a few keys per query (induction's tokens after an earlier
copy, duplicate-token's earlier copies, a template's keys) needs only where those keys are.
`Targets` holds the coordinates (b, i, j) of the true entries of a `[batch, query, key]` boolean
mask, in row-major order (b, then i, then j: the order `nonzero` gives), so the masses cost memory
in proportion to the number of targets, not to query x key.

- `Targets(b, i, j, shape)`; `Targets.of(mask)`: a dense bool mask's true entries (a `Targets`
  is returned as it is).
- `queries()`: `[batch, query]` bool, the queries with at least one target.
- `dense()`: the mask itself (`[batch, query, key]` bool; costs what the map costs).
- `sum_over(values)`: `[batch, head, query]` sums of per-target values `[n, head]`.
- `pairs_in_blocks(shape, pair, device)`: `Targets` built a block of queries at a time from a
  function giving the block's `[batch, rows, key]` mask, so no more than `BLOCK_ENTRIES` entries
  of the mask exist at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch

__all__ = ["Targets", "pairs_in_blocks", "BLOCK_ENTRIES"]

BLOCK_ENTRIES = 1 << 24  # bool entries of a mask built at once by `pairs_in_blocks` (16 MiB)


@dataclass(frozen=True)
class Targets:
    """The true entries (b, i, j) of a `[batch, query, key]` bool mask of shape `shape`."""

    b: torch.Tensor  # (n,) long
    i: torch.Tensor
    j: torch.Tensor
    shape: tuple  # (batch, query, key)

    @classmethod
    def of(cls, mask: Union[torch.Tensor, "Targets"]) -> "Targets":
        """A dense `[batch, query, key]` bool (or 0/1) mask's true entries; a `Targets` unchanged."""
        if isinstance(mask, Targets):
            return mask
        b, i, j = mask.bool().nonzero(as_tuple=True)
        return cls(b, i, j, tuple(mask.shape))

    def __len__(self) -> int:
        return int(self.b.numel())

    @property
    def device(self) -> torch.device:
        return self.b.device

    def queries(self) -> torch.Tensor:
        """`[batch, query]` bool: True where the query has at least one target."""
        out = torch.zeros(self.shape[:2], dtype=torch.bool, device=self.device)
        out[self.b, self.i] = True
        return out

    def dense(self) -> torch.Tensor:
        """`[batch, query, key]` bool, the mask (as large as a map of one head)."""
        out = torch.zeros(self.shape, dtype=torch.bool, device=self.device)
        out[self.b, self.i, self.j] = True
        return out

    def sum_over(self, values: torch.Tensor) -> torch.Tensor:
        """`[batch, head, query]`: for each query, the sum of `values` `[n, head]` over its targets."""
        batch, n_query = self.shape[:2]
        out = torch.zeros(batch * n_query, values.shape[-1], dtype=values.dtype, device=values.device)
        out.index_add_(0, self.b * n_query + self.i, values)
        return out.view(batch, n_query, -1).permute(0, 2, 1)


def pairs_in_blocks(shape: tuple, pair: Callable[[slice], torch.Tensor], device=None) -> Targets:
    """`Targets` of the mask `[batch, query, key]` of `shape` whose rows `pair(rows)` gives as a
    `[batch, rows, key]` bool block, as many query rows (of every example) as fit in
    `BLOCK_ENTRIES` (read at each call) at a time (at least one), so the whole mask never exists.
    Row-major order, as `Targets.of`."""
    batch, n_query, n_key = shape
    rows = max(1, BLOCK_ENTRIES // max(1, batch * n_key))
    parts = []
    for start in range(0, n_query, rows):
        block = pair(slice(start, min(n_query, start + rows)))  # (B, rows, K)
        b, i, j = block.nonzero(as_tuple=True)
        parts.append((b, i + start, j))
    if not parts:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Targets(empty, empty, empty, tuple(shape))
    b, i, j = (torch.cat(column) for column in zip(*parts))
    order = torch.argsort(b * n_query + i, stable=True)  # blocks hold every example: back to row-major
    return Targets(b[order], i[order], j[order], tuple(shape))
