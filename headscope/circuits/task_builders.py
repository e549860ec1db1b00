"""Tasks built from text with a model's own tokenizer: the built-ins and a user's file.

- `task(name_or_path, tokenizer, n=None, seed=0, metric=None, length=None)` -> `Task`:
  `"ioi"` (indirect-object identification, Wang et al. 2022), `"induction"` (a random sequence
  repeated), `"induction-keys"` (the same prompts, corrupted where the keys read the previous
  token), `"greater-than"` (Hanna et al. 2023), or the path of a JSONL file with one
  `{"clean", "corrupted", "answer", "wrong"}` object per line or of a task `Task.save` wrote
  (`headscope.circuits.task_files`). docs/tasks.md has the designs.
- `resolve_task(name_or_path, metric)`: what a name names, checked without a tokenizer (the
  command line's `--task` and `--metric`, before the model loads).
- `BUILTINS`: the built-in names and what each is.

Prompts are tokenized with the tokenizer's default special tokens at the start (a BOS where
the model expects one) and none at the end (an EOS or [SEP] there would take the place where
the answer is predicted). Answers are tokenized as the continuation of a prompt (after a line
break, no special tokens), and each must be one token (`headscope.circuits.task_text`). A word
the tokenizer does not know is refused, naming the row and the word; given a loaded model,
prompts longer than its positions are refused with the limit.
"""
from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import Optional

import torch

from ..checks import check_count, check_seed
from ..errors import HeadscopeError, HeadscopeWarning, UsageError
from .task_files import is_saved_task, read_jsonl, read_saved
from .task_text import assemble, check_known, continuation, encode, pieces, shown, single_tokens
from .tasks import METRICS, Task, positions_of, tokenizer_fingerprint

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
        if is_saved_task(source):
            return read_saved(source, tokenizer, n, metric, positions)
        built = read_jsonl(source, tokenizer, n, positions)
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


# --- the built-ins ------------------------------------------------------------------------------


def _ioi(tokenizer, n: int, rng: random.Random) -> dict:
    """IOI prompts in ABB and BAB order (alternating); the corruption puts three other names in
    the three name slots (Wang et al.'s ABC distribution), so it carries no information on the IO."""
    names = single_tokens(tokenizer, NAMES)
    places = list(single_tokens(tokenizer, PLACES))
    objects = list(single_tokens(tokenizer, OBJECTS))
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
            clean_row, corrupted_row = encode(tokenizer, clean_text), encode(tokenizer, corrupted_text)
            # a name merged with its neighbours would change the token count or hide the IO
            if len(clean_row) == len(corrupted_row) and names[io] in clean_row and names[s] in clean_row:
                break
        else:
            raise HeadscopeError("ioi could not build a prompt whose names stay single tokens in this tokenizer")
        check_known(tokenizer, clean_text, clean_row, f"ioi row {i}", "the prompt")
        clean.append(clean_row)
        corrupted.append(corrupted_row)
        answer.append(names[io])
        wrong.append(names[s])
        texts.append({"clean": clean_text, "corrupted": corrupted_text, "answer": " " + io, "wrong": " " + s})
    return assemble("ioi", tokenizer, clean, corrupted, answer, wrong, texts)


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
    probe = pieces(tokenizer, "a")
    prefix = encode(tokenizer, "a")[:-len(probe)]  # the special tokens a prompt starts with (BOS), if any
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
    return assemble(name, tokenizer, clean, corrupted, answer, wrong, texts)


def _greater_than(tokenizer, n: int, rng: random.Random) -> dict:
    """'The {noun} lasted from the year {XX}{YY} to the year {XX}': the answer set is the two-digit
    tokens YY+1..99, the wrong set 00..YY; the corrupted prompt starts at {XX}01 (Hanna et al. 2023)."""
    year, century = " 1732", " 17"
    ids = continuation(tokenizer, year)
    two_digit = [continuation(tokenizer, f"{yy:02d}") for yy in range(100)]
    split = len(ids) == 2 and ids == continuation(tokenizer, century) + two_digit[32]
    if not split or any(len(piece) != 1 for piece in two_digit):
        raise HeadscopeError(f"greater-than needs a tokenizer that splits a year into the century and the two-digit year, "
                             f"one token each (Hanna et al. 2023; GPT-2: ' 1732' -> [' 17', '32']); this tokenizer splits "
                             f"{year!r} into {shown(tokenizer, ids)}")
    digits = [piece[0] for piece in two_digit]
    clean, corrupted, answer, wrong, texts = [], [], [], [], []
    for _ in range(n):
        noun, xx, yy = rng.choice(YEAR_NOUNS), rng.choice(GT_CENTURIES), rng.choice(GT_STARTS)
        clean_text = GT_TEMPLATE.format(noun=noun, century=xx, start=f"{yy:02d}")
        corrupted_text = GT_TEMPLATE.format(noun=noun, century=xx, start="01")
        clean_row, corrupted_row = encode(tokenizer, clean_text), encode(tokenizer, corrupted_text)
        check_known(tokenizer, clean_text, clean_row, f"greater-than row {len(clean)}", "the prompt")
        year_ids = continuation(tokenizer, f" {xx}") + [digits[yy]]
        if len(clean_row) != len(corrupted_row) or not _contains(clean_row, year_ids):
            raise HeadscopeError(f"greater-than: this tokenizer does not keep the year of {clean_text!r} as "
                                 f"{shown(tokenizer, year_ids)} ({shown(tokenizer, clean_row)})")
        clean.append(clean_row)
        corrupted.append(corrupted_row)
        answer.append(digits[yy + 1:])
        wrong.append(digits[:yy + 1])
        texts.append({"clean": clean_text, "corrupted": corrupted_text, "answer": f"{yy + 1:02d}..99",
                      "wrong": f"00..{yy:02d}"})
    return assemble("greater-than", tokenizer, clean, corrupted, answer, wrong, texts)


def _contains(row: list[int], piece: list[int]) -> bool:
    return any(row[i:i + len(piece)] == piece for i in range(len(row) - len(piece) + 1))


