"""The detector registry: built-in detectors listed by name, loaded on first use.

- `BUILTINS`: `(module, attribute)` of every built-in detector, in the order of the scores
  table. Adding a detector is its module plus one line here.
- `REGISTRY`: name -> `Detector`, a mapping that imports the built-ins the first time it is
  read (importing `headscope.detectors` registers nothing, and loads no torch).
- `register(detector)`, `get(name)`, `names()`, `defaults(causal)`.
- `detector_spec(meta, label)`: what an analysis recorded about a label's detector; the registry
  is consulted only for what the analysis did not record, so a saved analysis is read without it.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from importlib import import_module

from ..errors import HeadscopeError

__all__ = ["BUILTINS", "REGISTRY", "SPEC_FIELDS", "register", "get", "names", "defaults", "detector_spec"]

BUILTINS = (
    ("headscope.detectors.patterns.induction", "induction"),
    ("headscope.detectors.patterns.duplicate_token", "duplicate_token"),
    ("headscope.detectors.patterns.previous_token", "previous_token"),
    ("headscope.detectors.patterns.next_token", "next_token"),
    ("headscope.detectors.patterns.positional", "positional"),
    ("headscope.detectors.patterns.rare_word", "rare_word"),
    ("headscope.detectors.patterns.self_token", "self_attention"),
    ("headscope.detectors.patterns.sink", "sink"),
    ("headscope.detectors.patterns.uniform", "uniform"),
    ("headscope.detectors.syntax.detector", "syntactic"),  # after the pattern detectors: its rows follow theirs
    ("headscope.detectors.retrieval.scoring", "RETRIEVAL"),  # opt-in; runs its own passes on the needle probe
)

# What `Detector.describe()` records in `meta["detectors"]`: an analysis that recorded all of
# them for a detector is read without the registry.
SPEC_FIELDS = ("formula", "threshold", "source", "probe", "learned", "outranks_resting", "gate", "quantity",
               "variants", "colour", "short", "icl_check", "report_rule")


class _Registry(MutableMapping):
    """name -> Detector; the built-ins are imported the first time any entry is read or added."""

    def __init__(self):
        self._detectors: dict = {}
        self._loaded = False

    def _load(self) -> dict:
        if not self._loaded:
            self._loaded = True
            added = dict(self._detectors)
            self._detectors.clear()
            for module, attribute in BUILTINS:
                detector = getattr(import_module(module), attribute)
                self._detectors[detector.name] = detector
            self._detectors.update(added)
        return self._detectors

    def __getitem__(self, name):
        return self._load()[name]

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())

    def __setitem__(self, name, detector):
        self._load()[name] = detector

    def __delitem__(self, name):
        del self._load()[name]

    def add(self, detector) -> None:
        self[detector.name] = detector


REGISTRY = _Registry()


def register(detector):
    """Add a detector to the registry under its name (replacing one of the same name)."""
    if not detector.name or ":" in detector.name or "," in detector.name:
        raise HeadscopeError(f"a detector name must be non-empty without ':' or ',', got {detector.name!r}")
    REGISTRY.add(detector)
    return detector


def names() -> list[str]:
    """Every registered detector name."""
    return list(REGISTRY)


def get(name: str):
    """The detector registered as `name`; HeadscopeError listing the detectors otherwise."""
    if name not in REGISTRY:
        raise HeadscopeError(f"unknown detector {name!r}; detectors: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def defaults(causal: bool) -> list[str]:
    """Detectors run when none are named: all that apply to the model."""
    return [n for n, d in REGISTRY.items() if not (causal and d.bidirectional_only) and not d.opt_in]


def detector_spec(meta: dict, label: str) -> dict:
    """What an analysis recorded about a label's detector (`meta["detectors"]`; "syntactic:obj"
    -> "syntactic"), over the registered detector's description, which fills in fields an older
    analysis did not record; {} for a detector neither knows."""
    recorded = meta.get("detectors", {})
    name = label if label in recorded else label.split(":")[0]
    if name in recorded and all(key in recorded[name] for key in SPEC_FIELDS):
        return dict(recorded[name])
    name = label if label in recorded or label in REGISTRY else label.split(":")[0]
    known = REGISTRY[name].describe() if name in REGISTRY else {}
    return {**known, **recorded.get(name, {})}
