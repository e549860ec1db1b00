"""Text to token ids for tasks: how prompts and answers are tokenized, and the Task fields
they become (`headscope.circuits.task_builders` and `task_files` share these).

- `encode(tokenizer, text)`: a prompt's ids, with the special tokens the tokenizer puts before a
  text (a BOS) and none after it (an EOS or [SEP] would take the place of the answer).
- `pieces(tokenizer, text)`, `continuation(tokenizer, text)`: ids without special tokens; an
  answer's as it continues a prompt (after a line break).
- `unknown_id(tokenizer)`, `check_known(tokenizer, text, ids, where, field)`: the id of what a
  tokenizer does not know, and a HeadscopeError naming the first such word of a text.
- `single_tokens(tokenizer, words)`, `shown(tokenizer, ids)`: words that are one token; tokens as
  text for messages.
- `assemble(name, tokenizer, clean, corrupted, answer, wrong, texts)`: Task fields from rows of ids.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..errors import HeadscopeError

__all__ = ["encode", "pieces", "continuation", "shown", "unknown_id", "check_known", "single_tokens", "assemble"]


def encode(tokenizer, text: str) -> list[int]:
    """`text`'s ids with the special tokens the tokenizer puts before it, none after it."""
    ids = list(tokenizer(text)["input_ids"])
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for start in range(len(ids) - len(plain) + 1):
        if ids[start:start + len(plain)] == plain:
            return ids[:start] + plain
    return ids


def pieces(tokenizer, text: str) -> list[int]:
    """`text`'s ids without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def continuation(tokenizer, text: str) -> list[int]:
    """The ids `text` adds after a line break: how it is tokenized as the continuation of a
    prompt. SentencePiece tokenizers encode a text that starts with a space as a lone '▁' and
    the word (Llama 2: ' Mary' -> ['▁', '▁Mary']), while after other text ' Mary' is '▁Mary'."""
    before = pieces(tokenizer, "\n")
    ids = pieces(tokenizer, "\n" + text)
    return ids[len(before):] if ids[:len(before)] == before else pieces(tokenizer, text)


def shown(tokenizer, ids, most: int = 8) -> str:
    """The tokens of `ids` as a list of their texts (the first `most`), for messages."""
    more = f", ... {len(ids) - most} more" if len(ids) > most else ""
    return "[" + ", ".join(repr(tokenizer.decode([i])) for i in ids[:most]) + more + "]"


def unknown_id(tokenizer) -> Optional[int]:
    """The id a tokenizer gives what it does not know, or None: none, or one it shares with another
    special token (GPT-2's unk is its end-of-text, which text never becomes by accident)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    others = {getattr(tokenizer, f"{role}_token_id", None) for role in ("bos", "eos", "pad")}
    return unk if isinstance(unk, int) and unk not in others else None


def check_known(tokenizer, text: str, ids: list, where: str, field: str) -> None:
    """HeadscopeError naming the first word of `text` the tokenizer reads as its unknown token."""
    unk = unknown_id(tokenizer)
    if unk is None or unk not in ids:
        return
    word = None
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        word = next(text[a:b] for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if i == unk)
    except (NotImplementedError, TypeError, ValueError, KeyError, StopIteration):
        pass  # a tokenizer without offsets: the token's place instead
    what = repr(word) if word else f"token {ids.index(unk)}"
    raise HeadscopeError(f"{where}: {field} holds {what}, which this tokenizer does not know (it reads it as "
                         f"{tokenizer.unk_token}); write it in words the tokenizer knows")


def single_tokens(tokenizer, words, prefix: str = " ") -> dict[str, int]:
    """The words (with `prefix`) that are one token in this tokenizer -> that token's id."""
    found = {}
    for word in words:
        ids = continuation(tokenizer, prefix + word)
        if len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None):
            found[word] = ids[0]
    return found


def _pad_id(tokenizer) -> int:
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(token_id, int):
            return token_id
    return 0


def _stack(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Right-padded `[n, pos]` ids and their mask (None when every row has the same length)."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = 1
    return ids, (None if bool(mask.all()) else mask)


def _sets(rows: list[list[int]]) -> torch.Tensor:
    """`[n, k]` answer sets padded with -1."""
    width = max(len(row) for row in rows)
    return torch.tensor([row + [-1] * (width - len(row)) for row in rows], dtype=torch.long)


def assemble(name: str, tokenizer, clean, corrupted, answer, wrong, texts) -> dict:
    """The Task fields of prompts given as lists of ids (clean and corrupted row lengths equal)."""
    pad = _pad_id(tokenizer)
    clean_ids, mask = _stack(clean, pad)
    corrupted_ids, _ = _stack(corrupted, pad)
    sets = isinstance(answer[0], list)
    answer = _sets(answer) if sets else torch.tensor(answer, dtype=torch.long)
    wrong = _sets(wrong) if sets else torch.tensor(wrong, dtype=torch.long)
    return dict(clean=clean_ids, corrupted=corrupted_ids, answer=answer, wrong=wrong, attention_mask=mask,
                name=name, texts=texts)
