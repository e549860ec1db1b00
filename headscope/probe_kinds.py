"""The probes, as small settings objects that build their examples.

A probe kind carries its own parameters and builds, for a loaded model and a seed:
    build(loaded, seed) -> a built probe: `batches(batch_size, causal, device)` (the
        `ProbeBatch`es reducers receive), `explorer_ids(n, length)`, `meta()`, `extra_meta`;
    eval_probe(loaded, n_examples, seed) -> `EvalProbe`: what `headscope.validate` measures.

- `TextProbe(n_examples, seq_len)`: windows of natural English (`headscope.probes.text_probe`).
- `RepeatedProbe(n_examples, repeat_len, repeats)`: random tokens repeated (Olsson et al. 2022).
- `TreebankProbe(treebank, n_sentences)`: dependency-annotated sentences aligned to tokens
  (`headscope.syntax.probe`).
- `PROBE_KINDS`: probe name -> kind; `probe_settings(probes)`: name -> settings, the defaults
  where none are given. A `ProbeSet` made by hand is also accepted (it builds itself).
Special tokens and the BOS rule: `headscope.probes.special_tokens`, for every probe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable, Optional

from .errors import HeadscopeError
from .probes import EvalProbe, ProbeSet, repeated_probe, special_tokens, text_probe
from .syntax.probe import TreebankProbe

__all__ = ["TextProbe", "RepeatedProbe", "TreebankProbe", "PROBE_KINDS", "probe_settings"]


@dataclass(frozen=True)
class TextProbe:
    """Non-overlapping windows of the bundled natural text (`probes/text`), wrapped in the
    tokenizer's special tokens; the seed picks the windows.

    Attributes:
        n_examples: windows (the bootstrap resamples these).
        seq_len: tokens per window, special tokens included.
    """

    n_examples: int = 16
    seq_len: int = 128
    name: ClassVar[str] = "text"

    def build(self, loaded, seed: int) -> ProbeSet:
        _at_least_one("n_examples", self.n_examples)
        return text_probe(loaded.tokenizer, self.n_examples, self.seq_len, seed)

    def eval_probe(self, loaded, n_examples: int, seed: int, name: str = "text") -> EvalProbe:
        """Windows of the text; every content token scored (not the special tokens)."""
        probe = text_probe(loaded.tokenizer, n_examples, self.seq_len, seed)
        _, suffix = special_tokens(loaded.tokenizer)
        stop = probe.input_ids.shape[1] - len(suffix)
        return EvalProbe.span(name, probe.input_ids, probe.content_start, stop, probe.description)


@dataclass(frozen=True)
class RepeatedProbe:
    """`repeat_len` random tokens repeated `repeats` times, BOS first (Olsson et al. 2022: 25 x 4).

    Attributes:
        n_examples: sequences.
        repeat_len: random tokens per repeat.
        repeats: copies of them.
    """

    n_examples: int = 16
    repeat_len: int = 25
    repeats: int = 4
    name: ClassVar[str] = "repeated"

    def __post_init__(self):
        if self.repeat_len < 2 or self.repeats < 2:
            raise HeadscopeError("the repeated probe needs repeat_len >= 2 and repeats >= 2")

    def build(self, loaded, seed: int) -> ProbeSet:
        _at_least_one("n_examples", self.n_examples)
        return repeated_probe(loaded.tokenizer, self.n_examples, self.repeat_len, self.repeats, seed,
                              vocab_size=loaded.model.config.vocab_size)

    def eval_probe(self, loaded, n_examples: int, seed: int) -> EvalProbe:
        """Scored from the second token of the second copy to the end of the last copy (the first
        token of the second copy follows nothing seen before: no head can predict it)."""
        probe = RepeatedProbe(n_examples, self.repeat_len, self.repeats).build(loaded, seed)
        start = probe.content_start
        return EvalProbe.span("repeated", probe.input_ids, start + self.repeat_len + 1,
                              start + self.repeat_len * self.repeats,
                              probe.description + "; scored from the second token of the second copy on")


PROBE_KINDS = {kind.name: kind for kind in (TextProbe, RepeatedProbe, TreebankProbe)}


def probe_settings(probes: Optional[Iterable] = None) -> dict:
    """Probe name -> settings: those given (settings objects or built `ProbeSet`s, by their
    `name`), and the defaults of every other kind."""
    given = {}
    for probe in probes or ():
        if not hasattr(probe, "build") or not hasattr(probe, "name"):
            raise HeadscopeError(f"a probe is a TextProbe, RepeatedProbe, TreebankProbe or ProbeSet, got {probe!r}")
        given[probe.name] = probe
    return {**{name: kind() for name, kind in PROBE_KINDS.items() if name not in given}, **given}


def _at_least_one(name: str, value: int) -> None:
    if value <= 0:
        raise HeadscopeError(f"{name} must be at least 1, got {value}")
