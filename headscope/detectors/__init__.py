"""Head detectors, registered by name.

Each detector is a pure function of one layer's patterns `[batch, head, query, key]` and the
probe batch, returning one score per example and head; see `base.Detector`.

- `REGISTRY`: name -> Detector; `get(name)`; `names()`.
- previous_token, next_token, self (positional.py), sink (sink.py), uniform (uniform.py),
  induction, duplicate_token (copying.py).
- Called on a loaded model, or on captured patterns, from a notebook:
  `headscope.detectors.score(loaded, "induction")`, `headscope.detectors.score_patterns(...)`.
"""
from __future__ import annotations

from ..errors import HeadscopeError
from .base import REGISTRY, Detector, register
from .copying import duplicate_token, induction
from .positional import next_token, previous_token, self_attention
from .sink import sink
from .uniform import uniform

__all__ = [
    "REGISTRY", "Detector", "register", "get", "names", "defaults",
    "previous_token", "next_token", "self_attention", "sink", "uniform", "induction", "duplicate_token",
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
    return [n for n, d in REGISTRY.items() if not (causal and d.bidirectional_only) and d.probe != "treebank"]
