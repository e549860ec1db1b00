"""Argument checks the public functions share, each a one-line `HeadscopeError`.

- `check_loaded(value, what)`: a loaded model (`headscope.load(...)`), not a name or a bare model.
- `check_analysis(value, what)`: an `Analysis` (`headscope.analyze(...)`, `headscope.Analysis.load(folder)`).
- `check_count(name, value, least=1)`: an integer of at least `least`.
Duck-typed, with no import of the classes: every layer may use them, and `import headscope`
stays torch-free.
"""
from __future__ import annotations

from .errors import HeadscopeError, UsageError

__all__ = ["check_loaded", "check_analysis", "check_count"]


def check_loaded(value, what: str) -> None:
    """HeadscopeError unless `value` looks like a `headscope.Loaded` (model and tokenizer)."""
    if hasattr(value, "model") and hasattr(value, "tokenizer"):
        return
    example = f"headscope.load({value!r})" if isinstance(value, str) else "headscope.load(...)"
    raise HeadscopeError(f"{what} takes a loaded model ({example}), not a {type(value).__name__}")


def check_analysis(value, what: str) -> None:
    """HeadscopeError unless `value` looks like a `headscope.Analysis` (scores, labels, meta)."""
    if all(hasattr(value, name) for name in ("scores", "labels", "meta")):
        return
    hint = f"headscope.Analysis.load({value!r})" if isinstance(value, str) else "headscope.analyze(loaded)"
    raise HeadscopeError(f"{what} takes an analysis ({hint}), not a {type(value).__name__}")


def check_count(name: str, value, least: int = 1) -> None:
    """HeadscopeError unless `value` is an integer of at least `least` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer of at least {least}, got {value!r}")
