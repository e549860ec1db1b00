"""Probe inputs for the detectors.

- `text_probe(tokenizer, n_examples, seq_len, seed)`: windows of natural English from
  `probes/text/` (written for headscope; see its README), wrapped in the tokenizer's own special
  tokens ([CLS] ... [SEP] for BERT, nothing for SmolLM2).
- `repeated_probe(tokenizer, n_examples, repeat_len, repeats, seed)`: random tokens repeated
  (Olsson et al. 2022: 25 tokens x 4 with a start token), the period varying across examples
  (`repeat_periods`: so a fixed-offset head cannot pass for induction), drawn without replacement within a
  repeat from the middle of the vocabulary (special tokens and the first and last 5% of ids,
  typically the most frequent pieces and the rarest merges, excluded), wrapped in the
  tokenizer's special tokens, or after the model's BOS token when the tokenizer adds none.
- `candidate_ids(tokenizer)`: the ids the repeated probe draws from (for random-token prompts
  of your own, as examples/patching.ipynb builds).
- `token_counts(tokenizer)`: how often each token id occurs in the bundled text corpus (the
  rare_word detector's frequencies).
- `special_tokens(tokenizer, bos=False)`: the ids put before and after a text, the one place
  that says how probes wrap special tokens (and put a BOS first when the tokenizer adds none).
- `ProbeSet`: input_ids `[example, pos]`, attention_mask, and what the detectors need to know.
- `ProbeBatch`: one batch as reducers see it (`WordContext` for treebank batches), for one kind
  of attention site (`headscope.attention.site_kinds.SITE_KINDS`: causal or bidirectional
  self-attention, cross-attention).
- `EvalProbe`: inputs, targets and scored tokens of a causal check (`headscope.validate`).
The probe kinds that build these from their settings are in `headscope.probes.kinds`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .._paths import probes_dir
from ..errors import HeadscopeError, UsageError

__all__ = ["ProbeSet", "ProbeBatch", "WordContext", "EvalProbe", "text_probe", "repeated_probe", "repeat_periods",
           "text_corpus", "token_counts", "special_tokens", "candidate_ids"]


@dataclass
class WordContext:
    """Which word each token of a treebank batch belongs to.

    Attributes:
        token_words: `[batch, pos]` long, the word of each token or -1 (special token, padding).
        present: `[batch, word]` bool, words that own at least one token.
        n_words: word slots (the batch's longest sentence).
        rows: the sentence index of each example of the batch.
    """

    token_words: torch.Tensor
    present: torch.Tensor
    n_words: int
    rows: tuple[int, ...]

    def to(self, device) -> "WordContext":
        return WordContext(self.token_words.to(device), self.present.to(device), self.n_words, self.rows)


@dataclass
class ProbeBatch:
    """One batch as the detectors see it, at one kind of attention site.

    For self-attention the queries and the keys are the same tokens, `input_ids`. For
    cross-attention (`key_mask` given) the queries are the decoder's tokens, `input_ids`, and
    the keys the encoder's positions, `key_mask` (and `key_ids` where the encoder reads tokens).

    Attributes:
        input_ids: `[batch, query]` the queries' tokens (and the keys' in self-attention).
        attention_mask: `[batch, query]`, True for real tokens.
        causal: whether a query sees only keys <= itself (False for cross-attention).
        content_start: index of the first probe token (after a BOS/[CLS]).
        token_counts: `[vocab]` corpus frequency of each token id (None: unknown; the rare_word
            detector then counts the batch's own tokens).
        words: the token-to-word alignment of a treebank batch (None for other probes).
        key_ids: `[batch, key]` the encoder's tokens at a cross-attention site (None: self-attention,
            or an encoder that reads no tokens, like Whisper's audio encoder).
        key_mask: `[batch, key]` True for real encoder positions at a cross-attention site;
            None for self-attention, whose keys are the queries' tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    causal: bool
    content_start: int = 0
    token_counts: Optional[torch.Tensor] = None
    words: Optional[WordContext] = None
    key_ids: Optional[torch.Tensor] = None
    key_mask: Optional[torch.Tensor] = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.key_mask is None and self.key_ids is not None:
            raise HeadscopeError("a cross-attention batch needs key_mask (the encoder's attention mask) with key_ids")
        if self.key_mask is not None and self.causal:
            raise HeadscopeError("cross-attention is not causal: a decoder query sees every encoder position")

    @property
    def site_kind(self) -> str:
        """The kind of site the batch is read at: "causal", "bidirectional" or "cross"
        (`headscope.attention.site_kinds.SITE_KINDS`)."""
        if self.key_mask is not None:
            return "cross"
        return "causal" if self.causal else "bidirectional"

    def for_site(self, kind: str) -> "ProbeBatch":
        """The batch as a site of `kind` sees it: itself, the one kind it was built for."""
        if kind != self.site_kind:
            raise HeadscopeError(f"this probe batch is read at {self.site_kind} attention sites, not at {kind} ones")
        return self

    def to(self, device) -> "ProbeBatch":
        move = lambda tensor: None if tensor is None else tensor.to(device)
        words = None if self.words is None else self.words.to(device)
        return ProbeBatch(self.input_ids.to(device), self.attention_mask.to(device), self.causal, self.content_start,
                          move(self.token_counts), words, move(self.key_ids), move(self.key_mask))

    def cached(self, key: str, build):
        """Memoise per-batch masks shared by detectors across layers."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def key_allowed(self) -> torch.Tensor:
        """`[batch, query, key]` bool: which keys each real query may attend to (at a
        cross-attention site: every real encoder position)."""
        def build():
            valid = self.attention_mask.bool()
            keys = valid if self.key_mask is None else self.key_mask.bool()
            allowed = keys[:, None, :] & valid[:, :, None]
            if self.causal:
                t = valid.shape[1]
                allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
            return allowed
        return self.cached("key_allowed", build)

    def key_counts(self) -> torch.Tensor:
        """`[batch, query]` long: how many keys each query may attend to, `key_allowed().sum(-1)`
        counted without the `[query, key]` mask (0 for padding queries)."""
        def build():
            valid = self.attention_mask.bool()
            keys = valid if self.key_mask is None else self.key_mask.bool()
            counts = keys.long().cumsum(-1) if self.causal else keys.long().sum(-1, keepdim=True).expand_as(valid)
            return counts * valid
        return self.cached("key_counts", build)


@dataclass
class ProbeSet:
    """A probe's examples, all the same length (no padding needed)."""

    name: str
    input_ids: torch.Tensor  # (N, T)
    content_start: int
    description: str
    token_counts: Optional[torch.Tensor] = None  # (vocab,) corpus frequency of each id, if known

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    extra_meta = {}  # nothing to add to an analysis's meta beyond `meta()`

    def meta(self) -> dict:
        """What `meta["probes"][name]` records."""
        return {"n_examples": len(self), "seq_len": self.seq_len, "description": self.description}

    def build(self, loaded, seed: int) -> "ProbeSet":
        """Itself: a `ProbeSet` made by hand is its own probe (`analyze(probes=[...])`)."""
        return self

    def explorer_ids(self, n: int, length: int) -> torch.Tensor:
        """`[n, length]` the first examples, cut short, whose maps the report's explorer keeps."""
        return self.input_ids[:n, :length]

    def batches(self, batch_size: int, causal: bool, device) -> list[ProbeBatch]:
        out = []
        for start in range(0, len(self), batch_size):
            ids = self.input_ids[start:start + batch_size].to(device)
            out.append(ProbeBatch(ids, torch.ones_like(ids, dtype=torch.bool), causal, self.content_start,
                                  self.token_counts))
        return out


def special_tokens(tokenizer, bos: bool = False) -> tuple[list[int], list[int]]:
    """The ids put before and after a probe text: the tokenizer's own special tokens ([CLS] ...
    [SEP] for BERT, none for SmolLM2), and with `bos` the BOS token first when the tokenizer
    puts nothing in front (so a causal model's attention sink falls on a special token).

    Returns:
        `(prefix, suffix)` lists of token ids.
    """
    prefix, suffix = [], []
    plain = tokenizer("hello", add_special_tokens=False)["input_ids"]
    full = tokenizer("hello")["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            prefix, suffix = full[:start], full[start + len(plain):]
            break
    if bos and not prefix and getattr(tokenizer, "bos_token_id", None) is not None:
        prefix = [tokenizer.bos_token_id]
    return prefix, suffix


def text_corpus() -> str:
    """All passages of the bundled natural-text probe, separated by blank lines."""
    folder = probes_dir() / "text"
    passages = []
    for path in sorted(folder.glob("*.txt")):
        for chunk in path.read_text(encoding="utf-8").split("\n---\n"):
            chunk = chunk.strip()
            if chunk and chunk != "---":
                passages.append(chunk)
    return "\n\n".join(passages)


def token_counts(tokenizer) -> torch.Tensor:
    """`[len(tokenizer)]` occurrences of each token id in the bundled text corpus (`text_corpus()`)."""
    stream = tokenizer(text_corpus(), add_special_tokens=False, verbose=False)["input_ids"]
    return _count(stream, len(tokenizer))


def _count(stream: list[int], size: int) -> torch.Tensor:
    ids = torch.tensor(stream, dtype=torch.long)
    return torch.bincount(ids, minlength=max(size, int(ids.max()) + 1 if len(stream) else 0))


def text_probe(tokenizer, n_examples: int, seq_len: int, seed: int = 0) -> ProbeSet:
    """`n_examples` non-overlapping windows of `seq_len` tokens of natural text, chosen by seed."""
    prefix, suffix = special_tokens(tokenizer)
    content = seq_len - len(prefix) - len(suffix)
    if content < 2:
        raise HeadscopeError(f"seq_len {seq_len} is too short for the tokenizer's special tokens")
    stream = tokenizer(text_corpus(), add_special_tokens=False, verbose=False)["input_ids"]
    available = len(stream) // content
    if available < n_examples:
        raise HeadscopeError(
            f"the text probe has {len(stream)} tokens: at most {available} examples of seq_len {seq_len} "
            f"(asked for {n_examples})"
        )
    order = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:n_examples]
    rows = [prefix + stream[i * content:(i + 1) * content] + suffix for i in sorted(order.tolist())]
    return ProbeSet("text", torch.tensor(rows), len(prefix),
                    f"natural English from probes/text, {n_examples} windows of {seq_len} tokens",
                    token_counts=_count(stream, len(tokenizer)))


def candidate_ids(tokenizer, vocab_size: Optional[int] = None) -> torch.Tensor:
    """The token ids the repeated probe draws its random tokens from: the middle 90% of the
    vocabulary (the first and last 5% of ids, typically the most frequent pieces and the rarest
    merges, left out), special tokens excluded.

    Args:
        tokenizer: the model's tokenizer.
        vocab_size: the vocabulary size (default `len(tokenizer)`).
    Returns:
        A 1-D long tensor of ids, ascending.
    """
    vocab_size = len(tokenizer) if vocab_size is None else vocab_size
    special = set(tokenizer.all_special_ids or [])
    lo, hi = int(0.05 * vocab_size), int(0.95 * vocab_size)
    ids = [i for i in range(lo, hi) if i not in special]
    return torch.tensor(ids, dtype=torch.long)


def repeat_periods(n_examples: int, repeat_len: int, vary_period: bool = True) -> list[int]:
    """The period (tokens per copy) of each example of the repeated probe.

    With `vary_period`, the periods cycle from `repeat_len` down to `repeat_len // 2 + 1`
    (25, 24, ..., 13 for the default 25), so no period is a multiple of another. Induction
    targets are found from the tokens (copying.py), so a content-based head scores the same on
    every period, while a head that attends at a fixed offset -(p - 1) hits its targets only on
    the examples of period p (a fixed offset -d also hits period q when d + 1 is a multiple of q,
    which no two periods of the range allow): its score is at most the share of examples with
    one period, ceil(n / k) / n for k periods (2/16 for the defaults). Olsson et al. 2022 use one
    period (`vary_period=False`), with which a fixed-offset positional head at -(period - 1)
    scores like an induction head.
    """
    if not vary_period:
        return [repeat_len] * n_examples
    choices = list(range(repeat_len, repeat_len // 2, -1))
    return [choices[i % len(choices)] for i in range(n_examples)]


def repeated_probe(
    tokenizer, n_examples: int, repeat_len: int = 25, repeats: int = 4, seed: int = 0,
    vocab_size: Optional[int] = None, vary_period: bool = True,
) -> ProbeSet:
    """`repeat_len * repeats` content tokens per example, BOS first when the tokenizer has one:
    a unit of distinct random tokens repeated, the unit's length (the period) varying across
    examples (`repeat_periods`; the last copy is cut short where the period does not divide the
    length), or `repeat_len` for every example without `vary_period`."""
    if repeat_len < 2 or repeats < 2:
        raise UsageError("the repeated probe needs repeat_len >= 2 and repeats >= 2")
    vocab = vocab_size or len(tokenizer)
    candidates = candidate_ids(tokenizer, vocab)
    if len(candidates) < repeat_len:
        raise HeadscopeError(
            f"the tokenizer has only {len(candidates)} ordinary token ids in the middle of its vocabulary; "
            f"the repeated probe needs {repeat_len} distinct ones"
        )
    gen = torch.Generator().manual_seed(seed + 1)
    length = repeat_len * repeats
    periods = repeat_periods(n_examples, repeat_len, vary_period)
    rows = []
    for period in periods:
        unit = candidates[torch.randperm(len(candidates), generator=gen)[:repeat_len]][:period]
        rows.append(unit.repeat(-(-length // period))[:length])
    ids = torch.stack(rows)  # (N, repeat_len * repeats)
    prefix, suffix = special_tokens(tokenizer, bos=True)
    wrap = lambda extra: torch.tensor(extra, dtype=torch.long).expand(n_examples, len(extra))
    ids = torch.cat([wrap(prefix), ids, wrap(suffix)], dim=1)
    start = f" after {len(prefix)} start token(s)" if prefix else ""
    if vary_period:
        what = (f"{n_examples} sequences of {length} tokens: a unit of {min(periods)}-{max(periods)} random tokens "
                f"repeated (the period varies across examples){start}")
    else:
        what = f"{n_examples} sequences of {repeat_len} random tokens x {repeats}{start}"
    return ProbeSet("repeated", ids, len(prefix), what)


@dataclass
class EvalProbe:
    """Inputs whose output a head ablation should change (`headscope.validate`).

    Attributes:
        name: "repeated", "text", "treebank", "copy" or "icl_text".
        input_ids: `[example, pos]` what the model reads ([MASK] at scored tokens for masked LMs);
            an encoder-decoder's encoder input when `decoder_input_ids` is given.
        targets: `[example, pos]` the tokens scored (input_ids, unless masked).
        attention_mask: `[example, pos]` bool, False on padding.
        scored: `[example, pos]` bool; for causal models, True at t means "the loss of predicting
            token t from tokens < t" (so t >= 1); with `decoder_input_ids`, "the loss of decoder
            position t predicting `targets[:, t]`".
        description: what the probe holds, in words.
        decoder_input_ids: `[example, pos]` an encoder-decoder's decoder input (a teacher-forced
            copy, `headscope.probes.copy.as_copy_eval`), or None for a one-input model.
    """

    name: str
    input_ids: torch.Tensor
    targets: torch.Tensor
    attention_mask: torch.Tensor
    scored: torch.Tensor
    description: str
    decoder_input_ids: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def two_inputs(self) -> bool:
        """Whether the model reads an encoder and a decoder input (`decoder_input_ids` given)."""
        return self.decoder_input_ids is not None

    @classmethod
    def span(cls, name: str, ids: torch.Tensor, start: int, stop: int, description: str) -> "EvalProbe":
        """Unpadded examples scored from token `max(1, start)` to `stop` (exclusive)."""
        scored = torch.zeros_like(ids, dtype=torch.bool)
        scored[:, max(1, start):stop] = True
        return cls(name, ids, ids, torch.ones_like(ids, dtype=torch.bool), scored, description)
