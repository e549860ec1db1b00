"""Head detectors, registered by name.

Each detector is a pure function of one layer's patterns `[batch, head, query, key]` and the
probe batch, returning one score per example and head; see `base.Detector`.

- `REGISTRY`: name -> Detector; `get(name)`; `names()`.
- One module per detector: induction, duplicate_token (formulas shared in copying.py),
  previous_token, next_token, self_token (formula shared in positional.py), sink, uniform,
  syntactic (computed by headscope.syntax from dependency arcs, not from one pattern),
  positional (argmax at offset k, one variant per offset; see variants.py), rare_word.
- From a notebook, a detector is called on a loaded model (`induction(loaded)`, a DataFrame
  from `headscope.analyze`) or on captured patterns (`previous_token(cap.patterns)`).
"""
from __future__ import annotations

from ..errors import HeadscopeError
from .base import REGISTRY, Detector, register
from .induction import induction
from .duplicate_token import duplicate_token
from .previous_token import previous_token
from .next_token import next_token
from .positional_argmax import positional
from .rare_word import rare_word
from .self_token import self_attention
from .sink import sink
from .syntactic import syntactic
from .uniform import uniform

__all__ = [
    "REGISTRY", "Detector", "register", "get", "names", "defaults",
    "previous_token", "next_token", "positional", "self_attention", "rare_word", "sink", "uniform", "induction", "duplicate_token",
    "syntactic",
]


def names() -> list[str]:
    """Every registered detector name."""
    return list(REGISTRY)


def get(name: str) -> Detector:
    """The detector registered as `name`; HeadscopeError listing the detectors otherwise."""
    if name not in REGISTRY:
        raise HeadscopeError(f"unknown detector {name!r}; detectors: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def defaults(causal: bool) -> list[str]:
    """Detectors run when none are named: all that apply to the model."""
    return [n for n, d in REGISTRY.items() if not (causal and d.bidirectional_only) and not d.opt_in]
