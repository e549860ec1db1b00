"""Hook points: named identity modules whose values can be read or replaced.

- `HookPoint`: an identity `nn.Module`; a hook `fn(value, hook)` may return a replacement.
- `hooks(module, {name: fn, ...})`: a context manager that adds hooks to the named hook
  points of `module` and always removes them on exit, exceptions included.
- `hook_points(module)`: the names of every hook point inside `module`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ..errors import HeadscopeError

__all__ = ["HookPoint", "HookFn", "hooks", "hook_points"]

HookFn = Callable[[torch.Tensor, "HookPoint"], Optional[torch.Tensor]]


class HookPoint(nn.Module):
    """Identity module marking a named value inside a computation; `name` is what hooks see."""

    def __init__(self, name: str = ""):
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def hooked(self) -> bool:
        """Whether any hook is attached right now."""
        return bool(self._forward_hooks)

    def add_hook(self, fn: HookFn):
        """Attach `fn(value, hook)`; returns a handle with `.remove()`. Prefer `hooks(...)`.
        A replacement that is not a tensor of the value's shape is a HeadscopeError naming the point."""
        if not callable(fn):
            raise HeadscopeError(f"the hook for {self.name or 'a hook point'} must be a function fn(value, hook), got {fn!r}")

        def call(module: nn.Module, args, output: torch.Tensor):
            replacement = fn(output, module)
            if replacement is not None and (not isinstance(replacement, torch.Tensor)
                                            or replacement.shape != output.shape):
                got = tuple(replacement.shape) if isinstance(replacement, torch.Tensor) else type(replacement).__name__
                raise HeadscopeError(f"the hook on {module.name or 'a hook point'} returned {got}, not a tensor of the "
                                     f"value's shape {tuple(output.shape)}; return None to only read")
            return replacement

        return self.register_forward_hook(call)


def hook_points(module: nn.Module) -> list[str]:
    """Names (as in `named_modules`) of every `HookPoint` inside `module`."""
    return [name for name, sub in module.named_modules() if isinstance(sub, HookPoint)]


@contextmanager
def hooks(
    module: nn.Module,
    fwd_hooks: Union[Mapping[str, HookFn], Sequence[tuple[str, HookFn]]],
) -> Iterator[nn.Module]:
    """Attach hooks to named hook points for the duration of a `with` block.

    Args:
        module: the module holding the hook points.
        fwd_hooks: `{name: fn}` or `[(name, fn), ...]`; `fn(value, hook)` returns None to
            only read, or a tensor of the same shape to replace the value.
    Yields:
        `module`, for convenience.
    """
    items = list(fwd_hooks.items()) if isinstance(fwd_hooks, Mapping) else list(fwd_hooks)
    handles = []
    try:
        for name, fn in items:
            try:
                point = module.get_submodule(name)
            except AttributeError:
                point = None
            if not isinstance(point, HookPoint):
                known = ", ".join(hook_points(module)) or "none"
                raise HeadscopeError(f"no hook point named {name!r}; hook points: {known}")
            handles.append(point.add_hook(fn))
        yield module
    finally:
        for handle in handles:
            handle.remove()
