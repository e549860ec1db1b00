"""Tasks built from text with a model's own tokenizer: the built-ins and a user's JSONL file.

- `task(name_or_path, tokenizer, n=None, seed=0, metric=None, length=None)` -> `Task`:
  `"ioi"` (indirect-object identification, Wang et al. 2022), `"induction"` (a random sequence
  repeated), `"induction-keys"` (the same prompts, corrupted where the keys read the previous
  token), `"greater-than"` (Hanna et al. 2023) or the path of a JSONL file with one
  `{"clean", "corrupted", "answer", "wrong"}` object per line. docs/tasks.md has the designs.
- `BUILTINS`: the built-in names and what each is.

Prompts are tokenized with the tokenizer's default special tokens at the start (a BOS where
the model expects one) and none at the end (an EOS or [SEP] there would take the place where
the answer is predicted). Answers are tokenized as the continuation of a prompt (after a line
break, no special tokens), and each must be one token.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Optional

import torch

from ..checks import check_count
from ..errors import HeadscopeError, UsageError
from .tasks import METRICS, Task, tokenizer_fingerprint

__all__ = ["task", "BUILTINS", "IOI_TEMPLATES", "NAMES", "PLACES", "OBJECTS", "YEAR_NOUNS"]

BUILTINS = {
    "ioi": "indirect-object identification (Wang et al. 2022), ABC corruption",
    "induction": "a random token sequence repeated; the corrupted repeat is fresh random tokens",
    "induction-keys": "the induction prompts; the corrupted prompt changes only the first copy's token before the answer",
    "greater-than": "'The war lasted from the year 1732 to the year 17' (Hanna et al. 2023); corrupted start year 01",
}
DEFAULT_N = 64
INDUCTION_LENGTH = 20
INDUCTION_TASKS = ("induction", "induction-keys")  # the two corruptions of the same prompts

# Modelled on Wang et al. 2022's IOI templates. {A} and {B} are the pair, {S} the repeated
# name: in ABB order {A} is the indirect object and {B} = {S} the subject, in BAB order the reverse.
IOI_TEMPLATES = (
    "When {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a long argument. Afterwards {S} said to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "While {A} and {B} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a lot of fun at the {PLACE}. {S} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "The {PLACE} {A} and {B} went to had a {OBJECT}. {S} gave it to",
    "While {A} and {B} were commuting to the {PLACE}, {S} gave a {OBJECT} to",
    "After the lunch, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} were thinking about going to the {PLACE}. {S} wanted to give a {OBJECT} to",
)
NAMES = (
    "Mary", "John", "Alice", "Bob", "James", "Sarah", "David", "Emma", "Michael", "Laura", "Daniel", "Anna",
    "Robert", "Lisa", "Thomas", "Kate", "Paul", "Rachel", "Mark", "Sophie", "Peter", "Lucy", "Steven", "Emily",
    "Andrew", "Grace", "Kevin", "Julia", "Brian", "Amy", "Jason", "Helen", "Eric", "Jessica", "Adam", "Claire",
    "Ryan", "Hannah", "Scott", "Megan", "Jack", "Olivia", "George", "Ruth", "Frank", "Linda", "Henry", "Susan",
    "Tom", "Jane", "Sam", "Karen", "Chris", "Nancy", "Matt", "Diana", "Tim", "Rose", "Joe", "Anne", "Dan",
    "Kelly", "Ben", "Victoria", "Alex", "Amanda", "Luke", "Sara", "Max", "Maria", "Charles", "Patricia",
    "Richard", "Jennifer", "Edward", "Elizabeth", "William", "Margaret", "Justin", "Nicole", "Kyle", "Rebecca",
    "Sean", "Heather", "Nathan", "Michelle", "Carl", "Martin", "Simon", "Joseph", "Jessie", "Tony", "Leo",
)
PLACES = ("store", "school", "hospital", "park", "station", "restaurant", "office", "garden", "beach", "market",
          "library", "museum", "house", "bank", "church", "river", "hotel", "airport", "theater", "farm")
OBJECTS = ("drink", "book", "ring", "bone", "gift", "snack", "cake", "letter", "ball", "flower", "pen", "hat",
           "key", "card", "bag", "cup", "phone", "box", "computer", "necklace", "basketball", "bottle")
# Nouns for "The {noun} lasted from the year ...", after Hanna et al. 2023's list.
YEAR_NOUNS = ("war", "dynasty", "conflict", "expedition", "siege", "reign", "famine", "voyage", "project",
              "campaign", "plague", "treaty", "rivalry", "journey", "kingdom", "marriage", "occupation",
              "rebellion", "crisis", "construction")
GT_TEMPLATE = "The {noun} lasted from the year {century}{start} to the year {century}"
GT_CENTURIES = range(11, 18)  # 1100-1799, as in the paper
GT_STARTS = range(2, 99)  # YY in 02..98: both the answer set (YY+1..99) and the wrong set (00..YY) are non-empty


def task(name_or_path, tokenizer, n: Optional[int] = None, seed: int = 0, metric: Optional[str] = None,
         length: Optional[int] = None) -> Task:
    """A built-in task, or one read from a JSONL file, in `tokenizer`'s token ids.

    Args:
        name_or_path: "ioi", "induction", "induction-keys", "greater-than", or the path of a JSONL file.
        tokenizer: the model's tokenizer (or a `headscope.Loaded`, whose tokenizer is used).
        n: examples; built-ins default to 64; a file defaults to all its lines, and a smaller n
            takes its first n (a larger one is an error).
        seed: the random draws of the built-ins (names, templates, tokens, years).
        metric: "logit_diff", "prob", "prob_diff" or "kl"; default "logit_diff", "prob_diff"
            for "greater-than".
        length: "induction" and "induction-keys" only: the random sequence's length L (default 20).
    Returns:
        A `Task` whose `tokenizer` is the tokenizer's fingerprint.
    """
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    if not callable(tokenizer) or not hasattr(tokenizer, "get_vocab"):
        raise HeadscopeError(f"task() takes the model's tokenizer (or the loaded model), not a {type(tokenizer).__name__}")
    if n is not None:
        check_count("n", n)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise HeadscopeError(f"seed must be an integer, got {seed!r}")
    if metric is not None and metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if length is not None and name_or_path not in INDUCTION_TASKS:
        raise HeadscopeError("length is the induction task's sequence length; other tasks take none")
    if name_or_path == "ioi":
        built = _ioi(tokenizer, n or DEFAULT_N, random.Random(seed))
    elif name_or_path in INDUCTION_TASKS:
        if length is not None:
            check_count("length", length, least=2)
        built = _induction(tokenizer, n or DEFAULT_N, torch.Generator().manual_seed(seed), length or INDUCTION_LENGTH,
                           name_or_path)
    elif name_or_path == "greater-than":
        built = _greater_than(tokenizer, n or DEFAULT_N, random.Random(seed))
        metric = metric or "prob_diff"
    elif isinstance(name_or_path, Path) or str(name_or_path).endswith(".jsonl") or Path(str(name_or_path)).is_file():
        built = _from_jsonl(Path(name_or_path), tokenizer, n)
    else:
        raise UsageError(f"unknown task {name_or_path!r}; the built-ins are {', '.join(BUILTINS)}, "
                             "or give the path of a .jsonl file")
    return Task(**built, metric=metric or "logit_diff", tokenizer=tokenizer_fingerprint(tokenizer))


# --- tokenizing --------------------------------------------------------------------------------


def _encode(tokenizer, text: str) -> list[int]:
    """`text`'s ids with the special tokens the tokenizer puts before it, none after it."""
    ids = list(tokenizer(text)["input_ids"])
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for start in range(len(ids) - len(plain) + 1):
        if ids[start:start + len(plain)] == plain:
            return ids[:start] + plain
    return ids


def _pieces(tokenizer, text: str) -> list[int]:
    """`text`'s ids without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _continuation(tokenizer, text: str) -> list[int]:
    """The ids `text` adds after a line break: how it is tokenized as the continuation of a
    prompt. SentencePiece tokenizers encode a text that starts with a space as a lone '▁' and
    the word (Llama 2: ' Mary' -> ['▁', '▁Mary']), while after other text ' Mary' is '▁Mary'."""
    before = _pieces(tokenizer, "\n")
    ids = _pieces(tokenizer, "\n" + text)
    return ids[len(before):] if ids[:len(before)] == before else _pieces(tokenizer, text)


def _shown(tokenizer, ids) -> str:
    """The tokens of `ids` as a list of their texts, for messages."""
    return "[" + ", ".join(repr(tokenizer.decode([i])) for i in ids) + "]"


def _single_tokens(tokenizer, words, prefix: str = " ") -> dict[str, int]:
    """The words (with `prefix`) that are one token in this tokenizer -> that token's id."""
    found = {}
    for word in words:
        ids = _continuation(tokenizer, prefix + word)
        if len(ids) == 1 and ids[0] != tokenizer.unk_token_id:
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


def _assemble(name: str, tokenizer, clean, corrupted, answer, wrong, texts) -> dict:
    """The Task fields of prompts given as lists of ids (clean and corrupted row lengths equal)."""
    pad = _pad_id(tokenizer)
    clean_ids, mask = _stack(clean, pad)
    corrupted_ids, _ = _stack(corrupted, pad)
    sets = isinstance(answer[0], list)
    answer = _sets(answer) if sets else torch.tensor(answer, dtype=torch.long)
    wrong = _sets(wrong) if sets else torch.tensor(wrong, dtype=torch.long)
    return dict(clean=clean_ids, corrupted=corrupted_ids, answer=answer, wrong=wrong, attention_mask=mask,
                name=name, texts=texts)


# --- the built-ins ------------------------------------------------------------------------------


def _ioi(tokenizer, n: int, rng: random.Random) -> dict:
    """IOI prompts in ABB and BAB order (alternating); the corruption puts three other names in
    the three name slots (Wang et al.'s ABC distribution), so it carries no information on the IO."""
    names = _single_tokens(tokenizer, NAMES)
    places = list(_single_tokens(tokenizer, PLACES))
    objects = list(_single_tokens(tokenizer, OBJECTS))
    if len(names) < 5 or not places or not objects:
        raise HeadscopeError(f"ioi needs at least 5 names, 1 place and 1 object that are single tokens (with a leading "
                             f"space) in this tokenizer; it has {len(names)} names, {len(places)} places, {len(objects)} objects")
    pool = list(names)
    clean, corrupted, answer, wrong, texts = [], [], [], [], []
    for i in range(n):
        for _ in range(100):
            template = rng.choice(IOI_TEMPLATES)
            io, s, c1, c2, c3 = rng.sample(pool, 5)
            fill = dict(PLACE=rng.choice(places), OBJECT=rng.choice(objects))
            first, second = (io, s) if i % 2 == 0 else (s, io)  # ABB, then BAB
            clean_text = template.format(A=first, B=second, S=s, **fill)
            corrupted_text = template.format(A=c1, B=c2, S=c3, **fill)
            clean_row, corrupted_row = _encode(tokenizer, clean_text), _encode(tokenizer, corrupted_text)
            # a name merged with its neighbours would change the token count or hide the IO
            if len(clean_row) == len(corrupted_row) and names[io] in clean_row and names[s] in clean_row:
                break
        else:
            raise HeadscopeError("ioi could not build a prompt whose names stay single tokens in this tokenizer")
        clean.append(clean_row)
        corrupted.append(corrupted_row)
        answer.append(names[io])
        wrong.append(names[s])
        texts.append({"clean": clean_text, "corrupted": corrupted_text, "answer": " " + io, "wrong": " " + s})
    return _assemble("ioi", tokenizer, clean, corrupted, answer, wrong, texts)


def _induction(tokenizer, n: int, generator: torch.Generator, length: int, name: str = "induction") -> dict:
    """`[prefix] r_0..r_{L-1} r_0..r_{L-2}`: at the last token (r_{L-2}, second copy) an induction
    head predicts r_{L-1}. The corrupted prompt's second half is L-1 fresh tokens seen nowhere
    before, so there is nothing to copy; wrong is another fresh token. Tokens are drawn without
    replacement from the middle half of the vocabulary (ids V/4 to 3V/4, special tokens left
    out): not bytes or the rarest merges.

    `name` "induction-keys": the corrupted prompt is the clean one with the first copy's r_{L-2}
    replaced by the first fresh token. The query (the second r_{L-2}) and the value at the first
    r_{L-1} are the clean run's; only what a previous-token head moves into the first r_{L-1}'s
    key differs, so the difference runs through K-composition (Elhage et al. 2021). The same
    draws as "induction": the clean prompts, answers and wrong tokens are identical."""
    size = len(tokenizer.get_vocab())
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    candidates = torch.tensor([i for i in range(size // 4, 3 * size // 4) if i not in special], dtype=torch.long)
    if len(candidates) < 2 * length:
        raise HeadscopeError(f"{name} with length {length} needs {2 * length} distinct tokens from the middle of the "
                             f"vocabulary; this tokenizer has {len(candidates)} there (use a smaller length)")
    probe = _pieces(tokenizer, "a")
    prefix = _encode(tokenizer, "a")[:-len(probe)]  # the special tokens a prompt starts with (BOS), if any
    clean, corrupted, answer, wrong, texts = [], [], [], [], []
    for _ in range(n):
        drawn = candidates[torch.randperm(len(candidates), generator=generator)[:2 * length]].tolist()
        sequence, fresh, other = drawn[:length], drawn[length:2 * length - 1], drawn[-1]
        clean.append(prefix + sequence + sequence[:-1])
        if name == "induction-keys":
            corrupted.append(prefix + sequence[:-2] + fresh[:1] + sequence[-1:] + sequence[:-1])
        else:
            corrupted.append(prefix + sequence + fresh)
        answer.append(sequence[-1])
        wrong.append(other)
        texts.append({"clean": tokenizer.decode(clean[-1]), "corrupted": tokenizer.decode(corrupted[-1]),
                      "answer": tokenizer.decode([sequence[-1]]), "wrong": tokenizer.decode([other])})
    return _assemble(name, tokenizer, clean, corrupted, answer, wrong, texts)


def _greater_than(tokenizer, n: int, rng: random.Random) -> dict:
    """'The {noun} lasted from the year {XX}{YY} to the year {XX}': the answer set is the two-digit
    tokens YY+1..99, the wrong set 00..YY; the corrupted prompt starts at {XX}01 (Hanna et al. 2023)."""
    year, century = " 1732", " 17"
    ids = _continuation(tokenizer, year)
    two_digit = [_continuation(tokenizer, f"{yy:02d}") for yy in range(100)]
    split = len(ids) == 2 and ids == _continuation(tokenizer, century) + two_digit[32]
    if not split or any(len(piece) != 1 for piece in two_digit):
        raise HeadscopeError(f"greater-than needs a tokenizer that splits a year into the century and the two-digit year, "
                             f"one token each (Hanna et al. 2023; GPT-2: ' 1732' -> [' 17', '32']); this tokenizer splits "
                             f"{year!r} into {_shown(tokenizer, ids)}")
    digits = [piece[0] for piece in two_digit]
    clean, corrupted, answer, wrong, texts = [], [], [], [], []
    for _ in range(n):
        noun, xx, yy = rng.choice(YEAR_NOUNS), rng.choice(GT_CENTURIES), rng.choice(GT_STARTS)
        clean_text = GT_TEMPLATE.format(noun=noun, century=xx, start=f"{yy:02d}")
        corrupted_text = GT_TEMPLATE.format(noun=noun, century=xx, start="01")
        clean_row, corrupted_row = _encode(tokenizer, clean_text), _encode(tokenizer, corrupted_text)
        year_ids = _continuation(tokenizer, f" {xx}") + [digits[yy]]
        if len(clean_row) != len(corrupted_row) or not _contains(clean_row, year_ids):
            raise HeadscopeError(f"greater-than: this tokenizer does not keep the year of {clean_text!r} as "
                                 f"{_shown(tokenizer, year_ids)} ({_shown(tokenizer, clean_row)})")
        clean.append(clean_row)
        corrupted.append(corrupted_row)
        answer.append(digits[yy + 1:])
        wrong.append(digits[:yy + 1])
        texts.append({"clean": clean_text, "corrupted": corrupted_text, "answer": f"{yy + 1:02d}..99",
                      "wrong": f"00..{yy:02d}"})
    return _assemble("greater-than", tokenizer, clean, corrupted, answer, wrong, texts)


def _contains(row: list[int], piece: list[int]) -> bool:
    return any(row[i:i + len(piece)] == piece for i in range(len(row) - len(piece) + 1))


# --- a user's file ------------------------------------------------------------------------------


def _from_jsonl(path: Path, tokenizer, n: Optional[int]) -> dict:
    """Read `{"clean", "corrupted", "answer", "wrong"}` objects, one a line (blank lines skipped),
    the first n of them (all by default); every error names the file and the line."""
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
                clean_row, corrupted_row = _encode(tokenizer, record["clean"]), _encode(tokenizer, record["corrupted"])
                if len(clean_row) != len(corrupted_row):
                    raise HeadscopeError(f"{where}: clean has {len(clean_row)} tokens and corrupted {len(corrupted_row)}; "
                                         "they must have as many")
                answer_ids = [_one_token(tokenizer, text, where, "answer") for text in record["answer"]]
                wrong_ids = [_one_token(tokenizer, text, where, "wrong") for text in record["wrong"]]
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
    return _assemble(path.stem, tokenizer, clean, corrupted, answer, wrong, texts)


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
            if not value or not all(isinstance(item, str) for item in value):
                raise HeadscopeError(f"{where}: {field!r} must be a string or a non-empty list of strings")
            continue
        if not isinstance(value, str) or (field in ("clean", "corrupted") and not value):
            raise HeadscopeError(f"{where}: {field!r} must be a non-empty string, got {value!r}")
        if field in ("answer", "wrong"):
            record[field] = [value]
    return record


def _one_token(tokenizer, text: str, where: str, field: str) -> int:
    ids = _continuation(tokenizer, text)
    if len(ids) != 1:
        raise HeadscopeError(f"{where}: {field} {text!r} is {len(ids)} tokens {_shown(tokenizer, ids)}, not one "
                             "(mind the leading space: ' Mary')")
    if ids[0] == tokenizer.unk_token_id:
        raise HeadscopeError(f"{where}: {field} {text!r} is the unknown token of this tokenizer")
    return ids[0]
