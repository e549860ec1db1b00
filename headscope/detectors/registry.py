"""The detector registry: built-in detectors listed by name, loaded on first use.

- `BUILTINS`: `(module, attribute)` of every built-in detector, in the order of the scores
  table. Adding a detector is its module plus one line here.
- `REGISTRY`: name -> `Detector`, a mapping that imports the built-ins the first time it is
  read (importing `headscope.detectors` registers nothing, and loads no torch).
- `register(detector)`, `get(name)`, `names()`, `defaults_for(kind)` (the default detectors at
  one kind of attention site), `defaults(causal)` (a decoder's or an encoder's self-attention).
- `detector_spec(meta, label)`, `detector_specs(meta)`: what an analysis recorded about its
  detectors; the registry is consulted only for what the analysis did not record, so a saved
  analysis is read without it (and without torch).
- `report_section(name)`: a detector's report section, a built-in's read without the detector.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from importlib import import_module
from typing import NamedTuple, Optional

from ..errors import HeadscopeError, UsageError
from ..attention.site_kinds import SITE_KINDS

__all__ = ["BUILTINS", "Builtin", "REGISTRY", "SPEC_FIELDS", "register", "get", "names", "defaults", "defaults_for",
           "detector_spec", "detector_specs", "registry_order", "report_section"]

class Builtin(NamedTuple):
    """Where a built-in detector is defined: `module.attribute`, registered as `name`; `section`
    ("module:attribute") is its report section (`Detector.report`), which the report reads
    without importing the detector (and torch)."""

    name: str
    module: str
    attribute: str
    section: Optional[str] = None


BUILTINS = (
    Builtin("induction", "headscope.detectors.patterns.induction", "induction"),
    Builtin("duplicate_token", "headscope.detectors.patterns.duplicate_token", "duplicate_token"),
    Builtin("previous_token", "headscope.detectors.patterns.previous_token", "previous_token"),
    Builtin("next_token", "headscope.detectors.patterns.next_token", "next_token"),
    Builtin("positional", "headscope.detectors.patterns.positional", "positional"),
    Builtin("rare_word", "headscope.detectors.patterns.rare_word", "rare_word"),
    Builtin("self", "headscope.detectors.patterns.self_token", "self_attention"),
    Builtin("sink", "headscope.detectors.patterns.sink", "sink"),
    Builtin("uniform", "headscope.detectors.patterns.uniform", "uniform"),
    # cross-attention only, on the copy probe
    Builtin("alignment", "headscope.detectors.patterns.alignment", "alignment"),
    # after the pattern detectors: its rows follow theirs
    Builtin("syntactic", "headscope.detectors.syntax.detector", "syntactic", "headscope.detectors.syntax.report:SECTION"),
    # opt-in; runs its own passes on the needle probe
    Builtin("retrieval", "headscope.detectors.retrieval.scoring", "RETRIEVAL"),
)

# What `Detector.describe()` records in `meta["detectors"]`: an analysis that recorded all of
# them for a detector is read without the registry.
SPEC_FIELDS = ("formula", "threshold", "source", "probe", "learned", "outranks_resting", "gate", "quantity",
               "variants", "colour", "short", "icl_check", "report_rule", "ov_qualified")


class _Registry(MutableMapping):
    """name -> Detector; the built-ins are imported the first time any entry is read or added."""

    def __init__(self):
        self._detectors: dict = {}
        self._loaded = False

    def _load(self) -> dict:
        """The built-ins, imported once in `BUILTINS` order (every write loads them first, so
        nothing registered can precede them)."""
        if not self._loaded:
            builtins = {}
            for builtin in BUILTINS:
                detector = getattr(import_module(builtin.module), builtin.attribute)
                if detector.name != builtin.name:
                    raise RuntimeError(f"BUILTINS names {builtin.name!r} but {builtin.module} defines {detector.name!r}")
                builtins[detector.name] = detector
            self._detectors, self._loaded = builtins, True
        return self._detectors

    @property
    def loaded(self) -> bool:
        return self._loaded

    def so_far(self) -> dict:
        """What is registered now (the built-ins only once loaded), without loading them."""
        return dict(self._detectors)

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


def register(detector, replace: bool = False):
    """Add a detector to the registry under its name.

    A detector of the same name registered before by you is replaced (re-running a notebook
    cell); a built-in is replaced only with `replace=True`, else HeadscopeError. The
    detector's fields are checked when it is made (`headscope.detectors.protocol.check_detector`).
    """
    name = getattr(detector, "name", None)
    if not isinstance(name, str) or not name or ":" in name or "," in name:
        raise HeadscopeError(f"a detector name must be non-empty without ':' or ',', got {name!r}")
    if not callable(getattr(detector, "describe", None)):
        raise HeadscopeError(f"register needs a Detector (headscope.detectors.protocol.Detector), got {type(detector).__name__}")
    builtin = name in {b.name for b in BUILTINS}
    if builtin and not replace and REGISTRY.get(name) is not detector:
        raise HeadscopeError(f"{name!r} is a built-in detector; choose another name, or pass replace=True to replace it")
    REGISTRY.add(detector)
    return detector


def names() -> list[str]:
    """Every registered detector name."""
    return list(REGISTRY)


def get(name: str):
    """The detector registered as `name`; HeadscopeError listing the detectors otherwise."""
    if name not in REGISTRY:
        raise UsageError(f"unknown detector {name!r}; detectors: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def defaults_for(kind: str) -> list[str]:
    """Detectors run at sites of `kind` ("causal", "bidirectional" or "cross";
    `headscope.attention.site_kinds.SITE_KINDS`) when none are named: all that apply to it
    (`Detector.applies_to`) and are not opt-in, in registry order."""
    if kind not in SITE_KINDS:
        raise HeadscopeError(f"unknown site kind {kind!r}; use one of {', '.join(SITE_KINDS)}")
    return [n for n, d in REGISTRY.items() if kind in d.applies_to and not d.opt_in]


def defaults(causal: bool) -> list[str]:
    """Detectors run on a causal (decoder) or bidirectional (encoder) model when none are named:
    `defaults_for` its self-attention."""
    return defaults_for("causal" if causal else "bidirectional")


def detector_spec(meta: dict, label: str) -> dict:
    """What an analysis recorded about a label's detector (`meta["detectors"]`; "syntactic:obj"
    -> "syntactic"), over the registered detector's description, which fills in fields an older
    analysis did not record; {} for a detector neither knows."""
    recorded = meta.get("detectors", {})
    name = label if label in recorded else label.split(":")[0]
    if _complete(recorded):  # a complete record describes the analysis alone
        return dict(recorded.get(name, {}))
    name = label if label in recorded or label in REGISTRY else label.split(":")[0]
    known = REGISTRY[name].describe() if name in REGISTRY else {}
    return {**known, **recorded.get(name, {})}


def _complete(recorded: dict) -> bool:
    return bool(recorded) and all(all(key in spec for key in SPEC_FIELDS) for spec in recorded.values())


def detector_specs(meta: Optional[dict] = None) -> dict:
    """name -> spec (`Detector.describe()`) of the detectors an analysis knows.

    An analysis that recorded every field of every detector it ran (`meta["detectors"]`) is
    described by that record, in its order, followed by the other detectors registered so far
    (none in a process that has not loaded the registry: reading a saved analysis loads no
    detector and no torch). Otherwise (an older analysis, or `meta=None`) the recorded
    detectors and then every other registered one, the record overriding the registered
    description field by field.
    """
    recorded = (meta or {}).get("detectors", {})
    if _complete(recorded):  # then the registered ones, as far as they are loaded already
        others = {name: detector.describe() for name, detector in REGISTRY.so_far().items() if name not in recorded}
        return {**{name: dict(spec) for name, spec in recorded.items()}, **others}
    return {name: detector_spec(meta or {}, name) for name in dict.fromkeys([*recorded, *REGISTRY])}


def registry_order(names) -> list:
    """`names` in registry order: built-ins as `BUILTINS` lists them, then the others as given."""
    order = {builtin.name: i for i, builtin in enumerate(BUILTINS)}
    return sorted(names, key=lambda name: order.get(name, len(order)))


def report_section(name: str):
    """The report section of the detector registered as `name` (`Detector.report`), or None.
    A built-in's is imported from where `BUILTINS` says, so the registry (and torch) stays
    unloaded until something else needs it."""
    if REGISTRY.loaded or name in REGISTRY.so_far():
        return REGISTRY[name].report if name in REGISTRY else None
    for builtin in BUILTINS:
        if builtin.name == name:
            if builtin.section is None:
                return None
            module, attribute = builtin.section.split(":")
            return getattr(import_module(module), attribute)
    return None
