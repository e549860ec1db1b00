"""A selective activation cache over the hook points of `headscope.hf.hooks`.

- `cache_activations(model, names, to="cpu", sites=None)`: a context manager; every forward pass
  inside it stores the named activations only (wildcards and filter functions as in
  `model_hooks`, whose layers are those of the group of attention sites `sites` names, by
  default the analysed stack); `cache[name]` gives them, several passes concatenated on the batch axis.
Not to be confused with `headscope.loading.load_cache`, the cache of converted GGUF models.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn

from ..errors import HeadscopeError
from .capture import check_device
from .hooks import Selector, model_hooks

__all__ = ["ActivationCache", "cache_activations"]


class ActivationCache:
    """Stored activations by full hook name (`layers.3.attn.hook_z`), in the points' shapes."""

    def __init__(self, to: Any, dtype: Optional[torch.dtype]):
        self.to = to
        self.dtype = dtype
        self._values: dict[str, list[torch.Tensor]] = defaultdict(list)

    def keep(self, value: torch.Tensor, hook) -> None:
        self._values[hook.name].append(value.detach().to(device=self.to or value.device, dtype=self.dtype or value.dtype))

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._values:
            raise KeyError(f"{name!r} was not cached; cached: {', '.join(self._values) or 'nothing yet'}")
        values = self._values[name]
        if len({v.shape[1:] for v in values}) > 1:
            raise HeadscopeError(f"{name} saw forward passes of different shapes; use one pass per cache")
        return values[0] if len(values) == 1 else torch.cat(values, dim=0)

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def keys(self) -> list[str]:
        return list(self._values)


@contextmanager
def cache_activations(
    model: nn.Module,
    names: Sequence[Selector],
    to: Any = "cpu",
    dtype: Optional[torch.dtype] = None,
    sites: Optional[str] = None,
) -> Iterator[ActivationCache]:
    """Keep only the named activations of the forward passes run inside the `with` block.

    Args:
        model: a transformers model headscope runs inside.
        names: hook names (`layers.3.attn.hook_z`), wildcards (`layers.*.attn.hook_pattern`) or
            filter functions `name -> bool`. Caching scores or pattern puts those layers on the
            explicit path; the others stay fused.
        to: device for the stored values; None keeps them where they were computed.
        dtype: dtype for the stored values (default: as computed; scores and pattern are fp32).
        sites: the group of attention sites the names' layers number ("decoder.cross";
            `headscope.hf.sites`); default: the analysed stack.
    Yields:
        An `ActivationCache`: `cache["layers.3.attn.hook_z"]` `[batch, pos, head, d_head]`.
    """
    check_device(to)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise HeadscopeError(f"dtype must be a torch dtype such as torch.float16, got {dtype!r}")
    if isinstance(names, str) or callable(names):
        names = [names]  # one name or filter given alone
    cache = ActivationCache(to, dtype)
    with model_hooks(model, [(name, cache.keep) for name in names], sites=sites):
        yield cache
