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
import os
import random
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from ..checks import check_count, check_seed
from ..errors import HeadscopeError, HeadscopeWarning, UsageError
from .tasks import MAX_TASK_TOKENS, METRICS, Task, is_task_file, positions_of, tokenizer_fingerprint

__all__ = ["task", "resolve_task", "BUILTINS", "IOI_TEMPLATES", "NAMES", "PLACES", "OBJECTS", "YEAR_NOUNS"]

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
    """A built-in task, or one read from a file, in `tokenizer`'s token ids.

    Args:
        name_or_path: "ioi", "induction", "induction-keys", "greater-than", or the path of a JSONL
            file or of a task saved with `Task.save` (read as it was saved). An existing file
            is always read, even under a built-in's name (with a warning).
        tokenizer: the model's tokenizer, or a `headscope.Loaded` (its tokenizer is used, and
            prompts longer than the model's positions are refused here, naming the line).
        n: examples; built-ins default to 64; a file defaults to all its lines, and a smaller n
            takes its first n (a larger one is an error).
        seed: the random draws of the built-ins (names, templates, tokens, years); 0 to 2**63-1.
        metric: "logit_diff", "prob", "prob_diff" or "kl"; default "logit_diff", "prob_diff"
            for "greater-than" (a saved task: its own).
        length: "induction" and "induction-keys" only: the random sequence's length L (default 20).
    Returns:
        A `Task` whose `tokenizer` is the tokenizer's fingerprint.
    """
    model = tokenizer if hasattr(tokenizer, "tokenizer") else None
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    if not callable(tokenizer) or not hasattr(tokenizer, "get_vocab"):
        raise HeadscopeError(f"task() takes the model's tokenizer (or the loaded model), not a {type(tokenizer).__name__}")
    if n is not None:
        check_count("n", n)
    check_seed(seed)
    source = resolve_task(name_or_path, metric)
    if length is not None and source not in INDUCTION_TASKS:
        raise HeadscopeError("length is the induction task's sequence length; other tasks take none")
    positions = positions_of(model) if model is not None else None
    if isinstance(source, Path):
        if _is_saved_task(source):
            return _saved(source, tokenizer, n, metric, positions)
        built = _from_jsonl(source, tokenizer, n, positions)
    elif source == "ioi":
        built = _ioi(tokenizer, n or DEFAULT_N, random.Random(seed))
    elif source in INDUCTION_TASKS:
        if length is not None:
            check_count("length", length, least=2)
        built = _induction(tokenizer, n or DEFAULT_N, torch.Generator().manual_seed(seed), length or INDUCTION_LENGTH,
                           source, hint=length is not None)
    else:
        built = _greater_than(tokenizer, n or DEFAULT_N, random.Random(seed))
        metric = metric or "prob_diff"
    if positions is not None and built["clean"].shape[1] > positions:
        raise HeadscopeError(f"{source} needs prompts of {built['clean'].shape[1]} tokens; this model takes at most "
                             f"{positions} positions" + (" (use a smaller length)" if source in INDUCTION_TASKS else ""))
    return Task(**built, metric=metric or "logit_diff", tokenizer=tokenizer_fingerprint(tokenizer))


def resolve_task(name_or_path, metric: Optional[str] = None, quiet: bool = False):
    """What `name_or_path` names, checked without a tokenizer (the command line's `--task` and
    `--metric`, before the model loads): a built-in's name, or the `Path` of a task file.

    An existing file is read whatever its name: a file named like a built-in is read, with a
    warning (`HeadscopeWarning`; `quiet`: none, for a check `task()` repeats) that the built-in is
    not. A name with a suffix or a folder in it is a path, which must exist. UsageError for an
    unknown name or metric."""
    if metric is not None and metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise UsageError(f"a task is a built-in name ({', '.join(BUILTINS)}) or the path of a task file, "
                         f"not a {type(name_or_path).__name__}")
    path = Path(name_or_path)
    if path.is_file():
        if str(name_or_path) in BUILTINS and not quiet:
            warnings.warn(f"{name_or_path} is a file in this folder, so it is read as the task; the built-in task "
                          f"{name_or_path!r} is not used (rename the file to run the built-in)", HeadscopeWarning,
                          stacklevel=3)
        return path
    if isinstance(name_or_path, str) and name_or_path in BUILTINS:
        return name_or_path
    if isinstance(name_or_path, Path) or path.suffix or len(path.parts) > 1 or str(name_or_path).endswith(("/", os.sep)):
        if path.is_dir():
            raise HeadscopeError(f"{path} is a folder; a task file is a JSONL file or a task saved with Task.save")
        raise HeadscopeError(f"cannot read task file {path}: no such file")
    raise UsageError(f"unknown task {name_or_path!r}; the built-ins are {', '.join(BUILTINS)}, "
                     "or give the path of a .jsonl file")


def _is_saved_task(path: Path) -> bool:
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


def _saved(path: Path, tokenizer, n: Optional[int], metric: Optional[str], positions: Optional[int]) -> Task:
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


def _shown(tokenizer, ids, most: int = 8) -> str:
    """The tokens of `ids` as a list of their texts (the first `most`), for messages."""
    more = f", ... {len(ids) - most} more" if len(ids) > most else ""
    return "[" + ", ".join(repr(tokenizer.decode([i])) for i in ids[:most]) + more + "]"


def _unknown_id(tokenizer) -> Optional[int]:
    """The id a tokenizer gives what it does not know, or None: none, or one it shares with another
    special token (GPT-2's unk is its end-of-text, which text never becomes by accident)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    others = {getattr(tokenizer, f"{role}_token_id", None) for role in ("bos", "eos", "pad")}
    return unk if isinstance(unk, int) and unk not in others else None


def _check_known(tokenizer, text: str, ids: list, where: str, field: str) -> None:
    """HeadscopeError naming the first word of `text` the tokenizer reads as its unknown token."""
    unk = _unknown_id(tokenizer)
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


def _single_tokens(tokenizer, words, prefix: str = " ") -> dict[str, int]:
    """The words (with `prefix`) that are one token in this tokenizer -> that token's id."""
    found = {}
    for word in words:
        ids = _continuation(tokenizer, prefix + word)
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
        _check_known(tokenizer, clean_text, clean_row, f"ioi row {i}", "the prompt")
        clean.append(clean_row)
        corrupted.append(corrupted_row)
        answer.append(names[io])
        wrong.append(names[s])
        texts.append({"clean": clean_text, "corrupted": corrupted_text, "answer": " " + io, "wrong": " " + s})
    return _assemble("ioi", tokenizer, clean, corrupted, answer, wrong, texts)


def _induction(tokenizer, n: int, generator: torch.Generator, length: int, name: str = "induction",
               hint: bool = True) -> dict:
    """`[prefix] r_0..r_{L-1} r_0..r_{L-2}`: at the last token (r_{L-2}, second copy) an induction
    head predicts r_{L-1}. The corrupted prompt's second half is L-1 fresh tokens seen nowhere
    before, so there is nothing to copy; wrong is another fresh token. Tokens are drawn without
    replacement from the middle half of the vocabulary (ids V/4 to 3V/4, special tokens left
    out): not bytes or the rarest merges.

    `name` "induction-keys": the corrupted prompt is the clean one with the first copy's r_{L-2}
    replaced by the first fresh token. The query (the second r_{L-2}) and the value at the first
    r_{L-1} are the clean run's; only what a previous-token head moves into the first r_{L-1}'s
    key differs, so the difference runs through K-composition (Elhage et al. 2021). The same
    draws as "induction": the clean prompts, answers and wrong tokens are identical. `hint`: the
    caller chose the length, so a refusal suggests a smaller one."""
    size = len(tokenizer.get_vocab())
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    candidates = torch.tensor([i for i in range(size // 4, 3 * size // 4) if i not in special], dtype=torch.long)
    if len(candidates) < 2 * length:
        raise HeadscopeError(f"{name} with length {length} needs {2 * length} distinct tokens from the middle of the "
                             f"vocabulary; this tokenizer has {len(candidates)} there"
                             + (" (use a smaller length)" if hint else f": its vocabulary is too small for {name}"))
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
        _check_known(tokenizer, clean_text, clean_row, f"greater-than row {len(clean)}", "the prompt")
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


def _from_jsonl(path: Path, tokenizer, n: Optional[int], positions: Optional[int] = None) -> dict:
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
                    rows[field] = _encode(tokenizer, record[field])
                    _check_known(tokenizer, record[field], rows[field], where, field)
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
    return _assemble(path.stem, tokenizer, clean, corrupted, answer, wrong, texts)


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
    ids = _continuation(tokenizer, text)
    if len(ids) != 1:
        raise HeadscopeError(f"{where}: {field} {text!r} is {len(ids)} tokens {_shown(tokenizer, ids)}, not one "
                             "(mind the leading space: ' Mary')")
    if ids[0] == _unknown_id(tokenizer):
        raise HeadscopeError(f"{where}: {field} {text!r} is the unknown token of this tokenizer")
    if not text[:1].isspace() and not after[-1:].isspace():
        spaced = _continuation(tokenizer, " " + text)
        if len(spaced) == 1 and spaced[0] != ids[0]:
            warnings.warn(f"{where}: {field} {text!r} has no leading space, so it is the token "
                          f"{tokenizer.decode(ids)!r}, not {tokenizer.decode(spaced)!r}: the word after the prompt "
                          f"usually starts with a space; write {' ' + text!r} if that is the word meant",
                          HeadscopeWarning, stacklevel=2)
    return ids[0]
