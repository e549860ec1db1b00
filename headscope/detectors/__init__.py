"""Head detectors, registered by name.

Each detector reduces one layer's pattern `[batch, head, query, key]` on one probe batch to
per-example values and finalizes them into rows of the scores table; see
`headscope.detectors.protocol.Detector`.

- `REGISTRY`: name -> Detector; `get(name)`; `names()`; `defaults(causal)`.
- One module per detector: induction, duplicate_token (formulas shared in copying.py),
  previous_token, next_token, self_token (formula shared in positional.py), sink, uniform,
  positional (argmax at offset k, one variant per offset; see `headscope.detectors.variants`), rare_word,
  syntactic (word attention against dependency arcs, `headscope.detectors.syntax.detector`), retrieval
  (needle copying, Wu et al. 2024; runs its own passes, `Detector.run`). Registered in this
  order, which is the order of the scores table.
- Your own: `headscope.detector(name, template=...)` (`headscope.detectors.templates`) or any
  `register(Detector(...))`; the CLI imports a module named as `--detectors mypkg.module:name`.
- From a notebook, a detector is called on captured patterns (`previous_token(cap.patterns)`).
"""
from __future__ import annotations

import importlib

from ..errors import HeadscopeError
from .protocol import REGISTRY, Detector, register
from .induction import induction
from .duplicate_token import duplicate_token
from .previous_token import previous_token
from .next_token import next_token
from .positional import positional
from .rare_word import rare_word
from .self_token import self_attention
from .sink import sink
from .uniform import uniform
from .syntactic import syntactic  # noqa: E402  (after the pattern detectors: its rows follow theirs)
from .retrieval import retrieval  # noqa: E402  (opt-in; runs its own passes on the needle probe)

__all__ = [
    "REGISTRY", "Detector", "register", "get", "names", "defaults", "resolve",
    "previous_token", "next_token", "positional", "self_attention", "rare_word", "sink", "uniform", "induction", "duplicate_token",
    "syntactic", "retrieval",
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


def resolve(spec: str) -> Detector:
    """A detector by registered name, or by `mypkg.module:name`: the module is imported (a
    module that defines detectors registers them as it loads) and its attribute `name`, a
    `Detector`, is registered if it is not yet. How `--detectors` finds your own detectors.
    """
    if ":" not in spec:
        return get(spec)
    module_name, attribute = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise HeadscopeError(f"cannot import {module_name!r} for detector {spec!r}: {err}") from None
    found = getattr(module, attribute, None)
    if not isinstance(found, Detector):
        raise HeadscopeError(f"{spec!r} is not a detector: {module_name} has no Detector named {attribute!r}")
    return found if REGISTRY.get(found.name) is found else register(found)
