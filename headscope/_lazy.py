"""Lazy re-exports: a package names what it offers without importing the modules that define it.

- `lazy_exports(package, homes)`: the `__getattr__` and `__dir__` of a package whose name
  `homes[name]` is defined in the submodule `package.homes[name]` (e.g. `{"Analysis": "result"}`),
  imported the first time the name is read. `import headscope` and `headscope --help` stay fast
  and torch-free this way.
"""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[Callable, Callable]:
    """`(__getattr__, __dir__)` for `package` (its `__name__`): each name in `homes` read from the
    submodule `homes[name]`, relative to the package, on first use; any other name an AttributeError.
    `__dir__` lists the package's `__all__` and the lazy names."""

    def __getattr__(name: str):
        if name in homes:
            return getattr(import_module(f"{package}.{homes[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(getattr(sys.modules[package], "__all__", ())) | set(homes))

    return __getattr__, __dir__
