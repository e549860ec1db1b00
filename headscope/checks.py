"""Argument checks the public functions share, each a one-line `HeadscopeError`.

- `check_loaded(value, what)`: a loaded model (`headscope.load(...)`), not a name or a bare model.
- `check_analysis(value, what)`: an `Analysis` (`headscope.analyze(...)`, `headscope.Analysis.load(folder)`).
- `check_count(name, value, least=1, most=None)`: an integer of at least `least` (and at most `most`).
- `check_seed(value, name="seed")`: an integer from 0 to `MAX_SEED` (torch's and numpy's seeds).
Duck-typed, with no import of the classes: every layer may use them, and `import headscope`
stays torch-free.
"""
from __future__ import annotations

from .errors import HeadscopeError, UsageError

__all__ = ["check_loaded", "check_analysis", "check_count", "check_seed", "MAX_SEED"]

MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit value


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


def check_count(name: str, value, least: int = 1, most=None) -> None:
    """UsageError unless `value` is an integer of at least `least` and, when given, at most `most`
    (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        between = f"of at least {least}" if most is None else f"from {least} to {most}"
        raise UsageError(f"{name} must be an integer {between}, got {value!r}")
    if most is not None and value > most:
        raise UsageError(f"{name} must be an integer from {least} to {most}, got {value!r}")


def check_seed(value, name: str = "seed") -> None:
    """UsageError unless `value` is an integer from 0 to 2**63-1 (a seed torch and numpy both take)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise UsageError(f"{name} must be an integer from 0 to 2**63-1, got {value!r}")
