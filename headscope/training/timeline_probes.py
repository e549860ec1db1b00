"""The probes a timeline scores at every step: small, built once, the same examples each step.

- `IdTokenizer(vocab_size, bos_token_id)`: a stand-in for a model trained from scratch with no
  text tokenizer (or a trivial one): no special tokens but the BOS id, every id "ordinary", so
  `headscope.probes.base.repeated_probe` draws its random tokens from the ids alone.
- `has_text_tokenizer(tokenizer, vocab_size)`: whether the text probe can be built from it.
- `timeline_probes(loaded, seed, n_examples)`: the built probes (`ProbeSet`s) of a timeline,
  sized to the model's context: the text probe (natural English when there is a text tokenizer,
  else uniform random token ids, on which positional heads such as previous-token show as they
  do on text) and the repeated probe (`RepeatedProbe`, the period varying across examples).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..probes.base import ProbeSet
from ..probes.kinds import RepeatedProbe, TextProbe

__all__ = ["IdTokenizer", "has_text_tokenizer", "timeline_probes", "PROBE_TOKENS"]

PROBE_TOKENS = 64  # longest probe, in tokens (or the model's context, if shorter): a timeline scores often


class IdTokenizer:
    """The part of a tokenizer the repeated probe reads, for a model that has only token ids.

    Attributes:
        vocab_size: ids 0 .. vocab_size - 1.
        bos_token_id: put first in every probe example (None: nothing is).
    """

    def __init__(self, vocab_size: int, bos_token_id: Optional[int] = None):
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.all_special_ids = [] if bos_token_id is None else [bos_token_id]

    def __len__(self) -> int:
        return self.vocab_size

    def __call__(self, text, add_special_tokens: bool = True, **_):
        return {"input_ids": [0]}  # one "token" for any text; special tokens added by `special_tokens(bos=True)`

    def convert_ids_to_tokens(self, ids):
        return [f"<{i}>" for i in ids]


def has_text_tokenizer(tokenizer, vocab_size: int) -> bool:
    """A real tokenizer whose ids fit the model's embedding (a char tokenizer of a toy counts)."""
    if tokenizer is None or isinstance(tokenizer, IdTokenizer):
        return False
    try:
        ids = tokenizer("The cat sat on the mat.", add_special_tokens=False)["input_ids"]
        return len(tokenizer) <= vocab_size and len(ids) > 0
    except Exception:  # a tokenizer-like object that cannot read text
        return False


def _random_ids(vocab_size: int, bos: Optional[int], n_examples: int, seq_len: int, seed: int) -> ProbeSet:
    gen = torch.Generator().manual_seed(seed + 2)
    prefix = [] if bos is None else [bos]
    low = int(0.05 * vocab_size)  # as the repeated probe: the first and last 5% of ids left out
    ids = torch.randint(low, max(low + 1, int(0.95 * vocab_size)), (n_examples, seq_len - len(prefix)), generator=gen)
    if prefix:
        ids = torch.cat([torch.full((n_examples, 1), bos, dtype=torch.long), ids], dim=1)
    return ProbeSet("text", ids, len(prefix), f"{n_examples} sequences of {seq_len} uniform random token ids "
                                              f"(no text tokenizer)")


def timeline_probes(loaded, seed: int = 0, n_examples: int = 16) -> list[ProbeSet]:
    """The text and repeated probes of a timeline, built for `loaded` (`Loaded`) and `seed`.

    Both are at most `PROBE_TOKENS` long (or the model's context): the repeated probe is 4
    copies of up to `(length - 1) // 4` tokens after a BOS, periods varying across examples.
    """
    vocab = loaded.text_config.vocab_size
    length = min(PROBE_TOKENS, loaded.context_length or PROBE_TOKENS)
    repeat_len = max(2, (length - 1) // 4)
    if has_text_tokenizer(loaded.tokenizer, vocab):
        text = TextProbe(n_examples, length).build(loaded, seed)
    else:
        text = _random_ids(vocab, loaded.tokenizer.bos_token_id, n_examples, length, seed)
    repeated = RepeatedProbe(n_examples, repeat_len, 4).build(loaded, seed)
    return [text, repeated]
