"""The probes, as small settings objects that build their examples.

A probe kind carries its own parameters and builds, for a loaded model and a seed:
    build(loaded, seed) -> a built probe: `batches(batch_size, causal, device)` (the
        `ProbeBatch`es reducers receive), `explorer_ids(n, length)`, `meta()`, `extra_meta`;
    eval_probe(loaded, n_examples, seed) -> `EvalProbe`: what `headscope.validate` measures.

- `TextProbe(n_examples, seq_len)`: windows of natural English (`headscope.probes.base.text_probe`).
- `RepeatedProbe(n_examples, repeat_len, repeats, vary_period)`: random tokens repeated (Olsson et al.
  2022), the period varying across examples.
- `TreebankProbe(treebank, n_sentences)`: dependency-annotated sentences aligned to tokens
  (`headscope.probes.treebank`).
- `NeedleProbe(lengths, depths, n_needles, max_len)`: needle-in-a-haystack prompts
  (`headscope.probes.needle`), built as a `NeedleSet`; read by detectors that run their own passes
  (`Detector.run`: retrieval), so it has no pattern batches.
- `CopyProbe(n_examples, seq_len)`: the text through an encoder-decoder, the decoder teacher-forced
  to copy it (`headscope.probes.copy`), built as a `CopySet` of `Seq2SeqBatch`es; read at
  cross-attention sites (the alignment detector).
- `PROBE_KINDS`: probe name -> kind; `probe_settings(probes)`: name -> settings, the defaults
  where none are given. A `ProbeSet` made by hand is also accepted (it builds itself).
Special tokens and the BOS rule: `headscope.probes.base.special_tokens`, for every probe.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Iterable, Optional

import torch

from ..checks import check_count
from ..errors import HeadscopeError, UsageError
from . import conllu
from .needle import NEEDLES, QUESTION, NeedleExample, needle_probe
from .copy import CopySet, as_copy_eval, copy_probe, decoder_start_token
from .base import EvalProbe, ProbeSet, repeat_periods, repeated_probe, special_tokens, text_probe
from .treebank import TreebankProbe

__all__ = ["TextProbe", "RepeatedProbe", "TreebankProbe", "NeedleProbe", "NeedleSet", "CopyProbe", "PROBE_KINDS",
           "probe_settings", "command_line_probes"]


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
        check_count("n_examples", self.n_examples)
        return text_probe(loaded.tokenizer, self.n_examples, self.seq_len, seed)

    def eval_probe(self, loaded, n_examples: int, seed: int, name: str = "text") -> EvalProbe:
        """Windows of the text; every content token scored (not the special tokens)."""
        probe = text_probe(loaded.tokenizer, n_examples, self.seq_len, seed)
        _, suffix = special_tokens(loaded.tokenizer)
        stop = probe.input_ids.shape[1] - len(suffix)
        return EvalProbe.span(name, probe.input_ids, probe.content_start, stop, probe.description)


@dataclass(frozen=True)
class RepeatedProbe:
    """Random tokens repeated, BOS first (Olsson et al. 2022: 25 x 4), `repeat_len * repeats`
    tokens per example; the period varies across examples (`repeat_len` down to
    `repeat_len // 2 + 1`, `headscope.probes.base.repeat_periods`) so that a head attending at a
    fixed offset cannot score like an induction head.

    Attributes:
        n_examples: sequences.
        repeat_len: random tokens per repeat (the longest period).
        repeats: copies of a `repeat_len` unit; the length of every example is `repeat_len * repeats`.
        vary_period: False gives Olsson et al.'s single period (every example `repeat_len` x `repeats`).
    """

    n_examples: int = 16
    repeat_len: int = 25
    repeats: int = 4
    vary_period: bool = True
    name: ClassVar[str] = "repeated"

    def __post_init__(self):
        check_count("repeat_len", self.repeat_len, least=2)
        check_count("repeats", self.repeats, least=2)

    def build(self, loaded, seed: int) -> ProbeSet:
        check_count("n_examples", self.n_examples)
        return repeated_probe(loaded.tokenizer, self.n_examples, self.repeat_len, self.repeats, seed,
                              vocab_size=loaded.text_config.vocab_size, vary_period=self.vary_period)

    def eval_probe(self, loaded, n_examples: int, seed: int) -> EvalProbe:
        """Scored from the second token of the second copy to the end (the first token of the
        second copy follows nothing seen before: no head can predict it), each example after its
        own period."""
        probe = RepeatedProbe(n_examples, self.repeat_len, self.repeats, self.vary_period).build(loaded, seed)
        start, stop = probe.content_start, probe.content_start + self.repeat_len * self.repeats
        scored = torch.zeros_like(probe.input_ids, dtype=torch.bool)
        for row, period in enumerate(repeat_periods(n_examples, self.repeat_len, self.vary_period)):
            scored[row, max(1, start + period + 1):stop] = True
        return EvalProbe("repeated", probe.input_ids, probe.input_ids, torch.ones_like(scored), scored,
                         probe.description + "; scored from the second token of the second copy on")


@dataclass(frozen=True)
class NeedleProbe:
    """Needle-in-a-haystack prompts, one per length x depth x needle (`headscope.probes.needle`).

    Attributes:
        lengths: prompt lengths in tokens; those above `max_len` or the model's context are
            dropped (an error when none is left).
        depths: where the needle goes, as shares of the haystack.
        n_needles: needle sentences per (length, depth).
        max_len: longest prompt to build (None: the model's context).
        needles, question: the sentences hidden and the request after the haystack
            (`headscope.probes.needle.NEEDLES`, `QUESTION`; shorter ones fit a short context).
        control_max_len: the control twin reads only the prompts up to this length (None: all);
            a random twin's argmax lands on the needle by chance more often in short prompts,
            so its best head there is the stricter bar.
    """

    lengths: tuple[int, ...] = (2048, 4096, 8192)
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    n_needles: int = 1
    max_len: Optional[int] = None
    needles: tuple[str, ...] = NEEDLES
    question: str = QUESTION
    control_max_len: Optional[int] = None
    name: ClassVar[str] = "needle"

    def kept_lengths(self, loaded) -> list[int]:
        """The lengths that fit the model and `max_len`; HeadscopeError for a bidirectional model
        (no next-token prediction to teacher-force) or when none fits."""
        if not loaded.causal:
            raise HeadscopeError(f"the needle probe (retrieval) needs a causal model; {loaded.name} is bidirectional")
        limits = [n for n in (self.max_len, loaded.context_length) if n is not None]
        kept = [length for length in self.lengths if not limits or length <= min(limits)]
        if not kept:
            raise HeadscopeError(f"no needle length fits: lengths {list(self.lengths)}, longest allowed {min(limits)}")
        return kept

    def build(self, loaded, seed: int) -> "NeedleSet":
        kept = self.kept_lengths(loaded)
        examples = needle_probe(loaded.tokenizer, kept, self.depths, self.n_needles, seed, self.needles, self.question)
        return NeedleSet(examples, kept, tuple(self.depths), self.n_needles, control_max_len=self.control_max_len)

    def eval_probe(self, loaded, n_examples: int, seed: int) -> EvalProbe:
        """Prompts of the shortest kept length, every answer token scored (needle-copy loss and
        accuracy; the same prompts `headscope.detectors.retrieval.scoring.validate_retrieval` ablates on)."""
        shortest = min(self.kept_lengths(loaded))
        examples = needle_probe(loaded.tokenizer, [shortest], self.depths, self.n_needles, seed, self.needles,
                                self.question)[:n_examples]
        ids = torch.stack([e.input_ids for e in examples])  # (N, T): every prompt is `shortest` tokens
        scored = torch.zeros_like(ids, dtype=torch.bool)
        for i, e in enumerate(examples):
            scored[i, e.answer] = True
        return EvalProbe("needle", ids, ids, torch.ones_like(scored), scored,
                         f"{len(examples)} needle prompts of {shortest} tokens, answer tokens scored")


@dataclass
class NeedleSet:
    """A built `NeedleProbe`: the prompts, for a detector's `run` (no pattern batches).

    Attributes:
        examples: `NeedleExample`s, length-major.
        lengths, depths, n_needles, control_max_len: the settings, `lengths` those kept.
    """

    examples: list[NeedleExample]
    lengths: list[int]
    depths: tuple[float, ...]
    n_needles: int
    name: str = "needle"
    extra_meta: dict = field(default_factory=dict)
    control_max_len: Optional[int] = None

    def control_examples(self) -> list[NeedleExample]:
        """The prompts the control twin reads (those up to `control_max_len` tokens)."""
        limit = self.control_max_len
        return [e for e in self.examples if limit is None or e.length <= limit]

    @property
    def seq_len(self) -> int:
        return max(e.length for e in self.examples)

    def meta(self) -> dict:
        meta = {"n_examples": len(self.examples), "seq_len": self.seq_len, "lengths": list(self.lengths),
                "depths": list(self.depths), "n_needles": self.n_needles,
                "description": f"needle prompts, lengths {list(self.lengths)} x depths {list(self.depths)} x "
                               f"{self.n_needles} needle(s), answer teacher-forced"}
        if self.control_max_len is not None:  # recorded only when set: older analyses had no such key
            meta["control_max_len"] = self.control_max_len
        return meta

    def explorer_ids(self, n: int, length: int):
        return None  # prompts of thousands of tokens: no map for the head explorer

    def batches(self, batch_size: int, causal: bool, device):
        raise HeadscopeError("the needle probe has no pattern batches: it is read by detectors with `run` (retrieval)")


@dataclass(frozen=True)
class CopyProbe:
    """The text probe's windows as an encoder-decoder's input, the decoder reading them shifted
    right behind its start token (`headscope.probes.copy.copy_probe`): decoder position i has
    read encoder tokens 0..i-1 and predicts token i.

    Attributes:
        n_examples: windows (the bootstrap resamples these).
        seq_len: tokens per window, special tokens included (the decoder's input is as long).
    """

    n_examples: int = 16
    seq_len: int = 128
    name: ClassVar[str] = "copy"

    def build(self, loaded, seed: int) -> CopySet:
        check_count("n_examples", self.n_examples)
        return copy_probe(loaded.tokenizer, self.n_examples, self.seq_len, decoder_start(loaded), seed)

    def eval_probe(self, loaded, n_examples: int, seed: int) -> EvalProbe:
        """The windows `build` gives for the seed, the decoder teacher-forced to copy them
        (`headscope.probes.copy.as_copy_eval`): decoder position t is scored on predicting token
        t, every content token (not the special tokens). Only at a decoder's sites
        (`loaded.two_inputs`), where the copy is what the model is asked to do."""
        if not loaded.two_inputs:
            raise HeadscopeError(f"the copy probe's causal check is the decoder's copy loss; validate it at an "
                                 f"encoder-decoder's decoder sites (loaded.at('decoder.cross')), not at "
                                 f"{loaded.name}'s {loaded.sites or 'default'} sites")
        text = TextProbe(n_examples, self.seq_len).eval_probe(loaded, n_examples, seed, name="copy")
        return as_copy_eval(text, decoder_start(loaded))


def decoder_start(loaded) -> int:
    """The token id an encoder-decoder's decoder starts from (`decoder_start_token_id` of its
    config or generation config); HeadscopeError for a model without one (not an encoder-decoder)."""
    start = decoder_start_token(loaded.model)
    if start is not None:
        return start
    raise HeadscopeError(f"the copy probe feeds an encoder-decoder's decoder; {loaded.name} has no "
                         f"decoder_start_token_id")


PROBE_KINDS = {kind.name: kind for kind in (TextProbe, RepeatedProbe, TreebankProbe, NeedleProbe, CopyProbe)}


def probe_settings(probes: Optional[Iterable] = None) -> dict:
    """Probe name -> settings: those given (settings objects or built `ProbeSet`s, by their
    `name`), and the defaults of every other kind."""
    given = {}
    for probe in probes or ():
        if not hasattr(probe, "build") or not hasattr(probe, "name"):
            raise HeadscopeError(f"a probe is a TextProbe, RepeatedProbe, TreebankProbe, NeedleProbe, CopyProbe or ProbeSet, "
                                 f"got {probe!r}")
        given[probe.name] = probe
    return {**{name: kind() for name, kind in PROBE_KINDS.items() if name not in given}, **given}


def command_line_probes(n_examples: int, seq_len: int, repeat_len: int, repeats: int, needle_lengths: str,
                        treebank=None, n_sentences: int = 0) -> list:
    """The probe settings `headscope analyze`'s options ask for.

    Args:
        n_examples, seq_len: the text probe (and the copy probe of cross-attention sites);
            n_examples, repeat_len, repeats: the repeated probe.
        needle_lengths: `--needle-lengths`, comma-separated token counts ("1024,2048").
        treebank: a CoNLL-U file (read here, once: a bad file fails before any model loads) or None.
        n_sentences: treebank sentences to score (0: all). A treebank probe is added only when
            `treebank` or `n_sentences` is given, so a syntactic detector that cannot run says why.
    Raises:
        HeadscopeError: lengths that are not positive integers, or a bad treebank file.
    """
    check_count("--n-sentences", n_sentences, least=0)
    try:
        lengths = tuple(int(part) for part in needle_lengths.split(",") if part.strip())
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise UsageError(f"--needle-lengths takes comma-separated token counts such as 1024,2048; "
                             f"got {needle_lengths!r}")
    probes = [TextProbe(n_examples, seq_len), RepeatedProbe(n_examples, repeat_len, repeats), NeedleProbe(lengths),
              CopyProbe(n_examples, seq_len)]
    if treebank is not None or n_sentences:
        sentences = None if treebank is None else conllu.read_conllu(treebank)
        probes.append(TreebankProbe(sentences, n_sentences or None, source=None if treebank is None else str(treebank)))
    return probes

