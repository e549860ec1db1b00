"""Dependency treebanks in CoNLL-U for the syntactic-head detector (Clark et al. 2019).

Offers:
    Sentence            -- one sentence: words, 1-based heads (0 = root), UD relations, spacing.
    read_conllu         -- read a CoNLL-U file; multiword-token ranges and empty nodes are skipped.
    bundled_treebank    -- the English treebank shipped in ``probes/syntax`` (natural sentences).
    validate_sentences  -- one root, no cycles, heads in range, UD relation names.
    TreebankError       -- a missing, unreadable, malformed or invalid treebank (one-line message).
    UD_RELATIONS        -- the 37 universal relations of UD v2; ``x:y`` is valid when ``x`` is one.

Reading uses the ``conllu`` package (a runtime dependency), imported only when a file is read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .._paths import probes_dir
from ..errors import HeadscopeError

__all__ = ["Sentence", "read_conllu", "bundled_treebank", "validate_sentences", "TreebankError",
           "UD_RELATIONS"]

UD_RELATIONS = frozenset("""acl advcl advmod amod appos aux case cc ccomp clf compound conj cop
    csubj dep det discourse dislocated expl fixed flat goeswith iobj list mark nmod nsubj nummod obj
    obl orphan parataxis punct reparandum root vocative xcomp""".split())

# Natural English written for headscope and annotated by hand, by register (see probes/syntax/README.md).
BUNDLED_FILES = ("natural.conllu", "natural-a.conllu", "natural-b.conllu", "natural-c.conllu",
                 "natural-d.conllu", "natural-e.conllu", "natural-f.conllu", "natural-g.conllu")

_WORD_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")
_HEAD = re.compile(r"[0-9]+")
_SUBTYPE = re.compile(r"[a-z]+")


class TreebankError(HeadscopeError, ValueError):
    """A treebank that cannot be read or is not a valid dependency treebank."""


@dataclass(frozen=True)
class Sentence:
    """One dependency-annotated sentence; all tuples have one entry per syntactic word."""

    sent_id: str
    words: tuple[str, ...]  # surface forms, in order
    heads: tuple[int, ...]  # 1-based index of each word's syntactic head, 0 = root
    relations: tuple[str, ...]  # UD relation per word, subtypes kept ("nmod:poss")
    space_after: tuple[bool, ...]  # False where MISC has SpaceAfter=No
    upos: tuple[str, ...] = ()  # universal part of speech per word ("_" unknown); () when not given

    @property
    def text(self) -> str:
        """The sentence rebuilt from ``words`` and ``space_after`` (no trailing space)."""
        if not self.words:
            return ""
        spaced = (w + (" " if space else "") for w, space in zip(self.words[:-1], self.space_after))
        return "".join(spaced) + self.words[-1]


def read_conllu(path: str | Path, *, validate: bool = True) -> list[Sentence]:
    """Read a CoNLL-U file.

    Multiword-token lines ("3-4") are dropped and their syntactic words kept (EWT style): the
    words inside a range are joined without spaces and the last takes the range's SpaceAfter, so
    ``Sentence.text`` gives back the surface text when the words spell the token, as in English.
    Empty nodes ("5.1", enhanced dependencies only) are dropped.

    Args:
        path: the ``.conllu`` file.
        validate: check every tree (see ``validate_sentences``) and raise on the first bad one.

    Returns:
        The sentences in file order; ``sent_id`` comes from ``# sent_id``, or is the sentence's
        1-based position in the file when that comment is missing.

    Raises:
        TreebankError: missing or unreadable file, empty file, wrong column count, bad ID or
            non-integer HEAD (the message names the file and line), or an invalid tree.
    """
    import conllu
    from conllu.exceptions import ParseException

    path = Path(path)
    sentences = []
    for number, block in enumerate(_blocks(path, _read_lines(path)), 1):
        try:
            tokens = conllu.parse("\n".join(line for _, line in block) + "\n\n")[0]
        except (ParseException, ValueError, IndexError) as error:
            raise TreebankError(f"{path}, line {block[0][0]}: {error}") from None
        sentence = _sentence(tokens, default_id=str(number))
        if validate:
            index, problem = _problem(sentence)
            if problem:
                word_lines = [n for n, line in block if _WORD_ID.fullmatch(line.split("\t", 1)[0])]
                line = word_lines[index] if index is not None else block[0][0]
                raise TreebankError(f"{path}, line {line}: sentence {sentence.sent_id}: {problem}")
        sentences.append(sentence)
    return sentences


def bundled_treebank() -> list[Sentence]:
    """The English treebank that ships with headscope, validated.

    Returns:
        The sentences of ``probes/syntax/natural*.conllu`` (``nat-...``): natural English written
        for headscope in nine registers and annotated by hand in UD v2, EWT conventions. The
        grammar-generated sentences of earlier versions are opt-in
        (``tools/grammar/generated.conllu``, pass it as a treebank).
    """
    return list(_bundled())


@lru_cache(maxsize=1)
def _bundled() -> tuple[Sentence, ...]:

    folder = probes_dir() / "syntax"
    return tuple(s for name in BUNDLED_FILES for s in read_conllu(folder / name))


def validate_sentences(sentences, source: str = "treebank") -> None:
    """Check that every sentence is a well-formed dependency tree.

    Args:
        sentences: an iterable of ``Sentence``.
        source: what to call them in the error message (a file name, say).

    Raises:
        TreebankError: for the first sentence with no words, columns of unequal length, not
            exactly one root, a head out of range, a cycle, an unknown relation, or ``root``
            used off the root; the message names ``source``, the sentence id and the problem.
    """
    for sentence in sentences:
        index, problem = _problem(sentence)
        if problem:
            raise TreebankError(f"{source}: sentence {sentence.sent_id}: {problem}")


def _problem(sentence: Sentence) -> tuple[int | None, str | None]:
    """(0-based index of the word at fault or None, what is wrong) or (None, None) if valid."""
    words, heads, relations = sentence.words, sentence.heads, sentence.relations
    count = len(words)
    if count == 0:
        return None, "no words"
    if not len(heads) == len(relations) == len(sentence.space_after) == count:
        return None, "words, heads, relations and space_after differ in length"
    for index, head in enumerate(heads):
        if not 0 <= head <= count:
            return index, f"word {index + 1} {words[index]!r} has head {head}, outside 0..{count}"
        if head == index + 1:
            return index, f"word {index + 1} {words[index]!r} is its own head (cycle)"
    roots = [index for index, head in enumerate(heads) if head == 0]
    if len(roots) != 1:
        where = ", ".join(str(index + 1) for index in roots)
        problem = f"{len(roots)} roots (words {where or 'none'}), expected 1"
        return (roots[1] if roots else None), problem
    for index, relation in enumerate(relations):
        if not _valid_relation(relation):
            return index, f"word {index + 1} {words[index]!r} has unknown relation {relation!r}"
        if (relation == "root") != (heads[index] == 0):
            return index, f"word {index + 1} {words[index]!r}: relation 'root' must go with head 0"
    for index in range(count):
        seen, current = set(), index + 1
        while current != 0 and current not in seen:
            seen.add(current)
            current = heads[current - 1]
        if current != 0:  # walked into a loop: list it from where it closes
            cycle, word = [current], heads[current - 1]
            while word != current:
                cycle.append(word)
                word = heads[word - 1]
            return current - 1, f"cycle through words {', '.join(map(str, sorted(cycle)))}"
    return None, None


def _valid_relation(relation: str) -> bool:
    universal, colon, subtype = relation.partition(":")
    return universal in UD_RELATIONS and (not colon or bool(_SUBTYPE.fullmatch(subtype)))


def _read_lines(path: Path) -> list[str]:
    """The file's lines as text, or a TreebankError naming the file (and line, for bad UTF-8)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TreebankError(f"{path}: no such file") from None
    except OSError as error:
        raise TreebankError(f"{path}: cannot read ({error.strerror or error})") from None
    lines = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    text = []
    for number, line in enumerate(lines, 1):
        try:
            text.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError:
            raise TreebankError(f"{path}, line {number}: not valid UTF-8") from None
    if not any(line.strip() for line in text):
        raise TreebankError(f"{path}, line 1: empty file, no sentences")
    return text


def _blocks(path: Path, lines: list[str]) -> list[list[tuple[int, str]]]:
    """Sentences as lists of (line number, line), after checking what conllu does not report."""
    blocks, block, expected = [], [], 1
    for number, line in enumerate(lines, 1):
        if not line.strip():
            if any(not text.startswith("#") for _, text in block):
                blocks.append(block)
            block, expected = [], 1
            continue
        block.append((number, line))
        if line.startswith("#"):
            continue
        columns = line.split("\t")
        where = f"{path}, line {number}"
        if len(columns) != 10:
            raise TreebankError(f"{where}: expected 10 tab-separated columns, found {len(columns)}")
        token_id, head = columns[0], columns[6]
        if _RANGE_ID.fullmatch(token_id) or _EMPTY_ID.fullmatch(token_id):
            continue
        if not _WORD_ID.fullmatch(token_id):
            raise TreebankError(f"{where}: bad ID {token_id!r}")
        if int(token_id) != expected:
            raise TreebankError(f"{where}: word ID {token_id}, expected {expected}")
        if not _HEAD.fullmatch(head):
            raise TreebankError(f"{where}: HEAD {head!r} is not an integer")
        expected += 1
    if any(not text.startswith("#") for _, text in block):
        blocks.append(block)
    if not blocks:
        raise TreebankError(f"{path}, line {len(lines)}: no sentences (only comments)")
    return blocks


def _sentence(tokens, default_id: str) -> Sentence:
    """A Sentence from a conllu TokenList, keeping syntactic words only."""
    words, heads, relations, spaces, upos = [], [], [], [], []
    range_end, range_space = 0, True
    for token in tokens:
        token_id = token["id"]
        if isinstance(token_id, tuple):
            if token_id[1] == "-":  # multiword token: its words follow
                range_end, range_space = token_id[2], _space_after(token)
            continue  # empty nodes are dropped
        words.append(token["form"])
        heads.append(token["head"])
        relations.append(token["deprel"])
        upos.append(token.get("upos") or "_")
        if token_id < range_end:
            spaces.append(False)
        elif token_id == range_end:
            spaces.append(range_space)
        else:
            spaces.append(_space_after(token))
    sent_id = tokens.metadata.get("sent_id") or default_id
    return Sentence(sent_id, tuple(words), tuple(heads), tuple(relations), tuple(spaces), tuple(upos))


def _space_after(token) -> bool:
    misc = token.get("misc") or {}
    return misc.get("SpaceAfter") != "No"
