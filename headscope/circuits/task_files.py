"""Tasks read from a user's file: JSONL (one example a line) or a task `Task.save` wrote.

- `read_jsonl(path, tokenizer, n, positions)`: the Task fields of `{"clean", "corrupted",
  "answer", "wrong"}` objects, one a line; every error names the file and the line (and, for a
  word the tokenizer does not know, the word); an answer without its leading space where the
  spaced word is another token is a warning naming the line.
- `is_saved_task(path)`, `read_saved(path, tokenizer, n, metric, positions)`: a file `Task.save`
  wrote, whatever its name, read as it was saved.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

from ..errors import HeadscopeError, HeadscopeWarning
from .task_text import assemble, check_known, continuation, encode, shown, unknown_id
from .tasks import MAX_TASK_TOKENS, Task, is_task_file, tokenizer_fingerprint

__all__ = ["read_jsonl", "is_saved_task", "read_saved"]


def is_saved_task(path: Path) -> bool:
    """Whether `path` holds a task `Task.save` wrote rather than JSONL: its first line (the whole
    file, for a .json file) a JSON object of that format."""
    try:
        if path.suffix == ".json":
            return is_task_file(path.read_bytes())
        with open(path, "rb") as handle:
            first = next((line for line in handle if line.strip()), b"")
    except OSError:
        return False
    return is_task_file(first)


def read_saved(path: Path, tokenizer, n: Optional[int], metric: Optional[str], positions: Optional[int]) -> Task:
    """A task `Task.save` wrote, read as it was saved: its first `n` examples, `metric` if given."""
    saved = Task.load(path)
    mine = tokenizer_fingerprint(tokenizer)
    if saved.tokenizer is not None and saved.tokenizer != mine:
        raise HeadscopeError(f"{path} is a saved task built for another tokenizer ({saved.tokenizer}; this one is "
                             f"{mine}); build it again with this model's tokenizer")
    if n is not None and n > saved.n:
        raise HeadscopeError(f"{path} is a saved task of {saved.n} examples, fewer than n={n}")
    if positions is not None and saved.clean.shape[1] > positions:
        raise HeadscopeError(f"{path} is a saved task of prompts of {saved.clean.shape[1]} tokens; this model takes "
                             f"at most {positions} positions")
    if n is not None:
        saved = saved.subset(slice(0, n))
    return saved.with_metric(metric) if metric else saved


def read_jsonl(path: Path, tokenizer, n: Optional[int], positions: Optional[int] = None) -> dict:
    """Read `{"clean", "corrupted", "answer", "wrong"}` objects, one a line (blank lines skipped),
    the first n of them (all by default); every error names the file and the line. `positions`:
    the model's, which no prompt may exceed (None: not known here)."""
    try:
        handle = open(path, encoding="utf-8")
    except OSError as err:
        raise HeadscopeError(f"cannot read task file {path}: {err.strerror or type(err).__name__}") from None
    clean, corrupted, answer, wrong, texts = [], [], [], [], []
    with handle:
        try:
            for number, line in enumerate(handle, 1):
                if n is not None and len(clean) == n:
                    break
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                record = _record(line, where)
                rows = {}
                for field in ("clean", "corrupted"):
                    rows[field] = encode(tokenizer, record[field])
                    check_known(tokenizer, record[field], rows[field], where, field)
                clean_row, corrupted_row = rows["clean"], rows["corrupted"]
                if len(clean_row) != len(corrupted_row):
                    raise HeadscopeError(f"{where}: clean has {len(clean_row)} tokens and corrupted {len(corrupted_row)}; "
                                         "they must have as many")
                if positions is not None and len(clean_row) > positions:
                    raise HeadscopeError(f"{where}: clean is {len(clean_row)} tokens; this model takes at most "
                                         f"{positions} positions")
                width = max([len(clean_row)] + [len(row) for row in clean])
                if width * (len(clean) + 1) > MAX_TASK_TOKENS:
                    raise HeadscopeError(f"{where}: the task would hold {len(clean) + 1} prompts of up to {width} tokens, "
                                         f"more than the {MAX_TASK_TOKENS:,} prompt positions a task holds; use fewer "
                                         f"or shorter prompts (n)")
                after = record["clean"]
                answer_ids = _token_set(tokenizer, record["answer"], where, "answer", after)
                wrong_ids = _token_set(tokenizer, record["wrong"], where, "wrong", after)
                if set(answer_ids) & set(wrong_ids):
                    raise HeadscopeError(f"{where}: answer and wrong share a token; a token is one or the other")
                clean.append(clean_row)
                corrupted.append(corrupted_row)
                answer.append(answer_ids)
                wrong.append(wrong_ids)
                texts.append({"clean": record["clean"], "corrupted": record["corrupted"],
                              "answer": " | ".join(record["answer"]), "wrong": " | ".join(record["wrong"])})
        except UnicodeDecodeError:
            raise HeadscopeError(f"{path} is not UTF-8 text; a task file holds one JSON object a line") from None
    if not clean:
        raise HeadscopeError(f"{path} holds no examples; write one JSON object a line with clean, corrupted, answer, wrong")
    if n is not None and len(clean) < n:
        raise HeadscopeError(f"{path} holds {len(clean)} examples, fewer than n={n}")
    if all(len(a) == 1 for a in answer) and all(len(w) == 1 for w in wrong):
        answer, wrong = [a[0] for a in answer], [w[0] for w in wrong]
    return assemble(path.stem, tokenizer, clean, corrupted, answer, wrong, texts)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _record(line: str, where: str) -> dict:
    """One line's object, answer and wrong as lists of strings."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise HeadscopeError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise HeadscopeError(f"{where}: expected a JSON object with clean, corrupted, answer, wrong; got {type(record).__name__}")
    for field in ("clean", "corrupted", "answer", "wrong"):
        if field not in record:
            raise HeadscopeError(f"{where}: no {field!r} field (each line needs clean, corrupted, answer, wrong)")
        value = record[field]
        if field in ("answer", "wrong") and isinstance(value, list):
            if not value or not all(isinstance(item, str) and item.strip() for item in value):
                raise HeadscopeError(f"{where}: {field!r} must be a string or a non-empty list of strings, each "
                                     f"more than whitespace")
            continue
        if not isinstance(value, str) or not value:
            raise HeadscopeError(f"{where}: {field!r} must be a non-empty string, got {_short(value)}")
        if not value.strip():
            raise HeadscopeError(f"{where}: {field!r} is only whitespace ({value!r}); it needs at least one word")
        if field in ("answer", "wrong"):
            record[field] = [value]
    return record


def _token_set(tokenizer, texts: list, where: str, field: str, after: str) -> list:
    """Each answer text's one token, none twice (a set counts each token once)."""
    ids = [_one_token(tokenizer, text, where, field, after) for text in texts]
    for i, token in enumerate(ids):
        first = ids.index(token)
        if first != i:
            raise HeadscopeError(f"{where}: {field} {texts[first]!r} and {texts[i]!r} are the same token "
                                 f"{tokenizer.decode([token])!r}; list each once")
    return ids


def _one_token(tokenizer, text: str, where: str, field: str, after: str = "") -> int:
    """The one token `text` is as the continuation of a prompt; a warning where it has no leading
    space, the prompt ends without one and the spaced word is another single token (the word the
    model would more likely predict there)."""
    ids = continuation(tokenizer, text)
    if len(ids) != 1:
        raise HeadscopeError(f"{where}: {field} {text!r} is {len(ids)} tokens {shown(tokenizer, ids)}, not one "
                             "(mind the leading space: ' Mary')")
    if ids[0] == unknown_id(tokenizer):
        raise HeadscopeError(f"{where}: {field} {text!r} is the unknown token of this tokenizer")
    if not text[:1].isspace() and not after[-1:].isspace():
        spaced = continuation(tokenizer, " " + text)
        if len(spaced) == 1 and spaced[0] != ids[0]:
            warnings.warn(f"{where}: {field} {text!r} has no leading space, so it is the token "
                          f"{tokenizer.decode(ids)!r}, not {tokenizer.decode(spaced)!r}: the word after the prompt "
                          f"usually starts with a space; write {' ' + text!r} if that is the word meant",
                          HeadscopeWarning, stacklevel=2)
    return ids[0]
