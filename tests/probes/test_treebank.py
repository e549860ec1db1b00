"""The CoNLL-U reader (headscope.probes.conllu), the bundled English treebank in probes/syntax/ and
the opt-in grammar treebank in tools/grammar/."""

import collections
import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("conllu")

from headscope._paths import probes_dir  # noqa: E402
from headscope.probes.conllu import (  # noqa: E402
    BUNDLED_FILES,
    UD_RELATIONS,
    Sentence,
    TreebankError,
    bundled_treebank,
    read_conllu,
    validate_sentences,
)

SYNTAX_DIR = probes_dir() / "syntax"
GRAMMAR_DIR = Path(__file__).resolve().parents[2] / "tools" / "grammar"
REQUIRED_RELATIONS = ("nsubj obj det amod case nmod obl aux cop advmod compound nmod:poss mark cc "
                      "conj xcomp ccomp").split()
# Scored on the whole treebank, a relation needs 30 arcs in each half of the sentences
# (headscope.detectors.syntax.MIN_ARCS) in at least one direction: 60 and some slack for uneven halves.
MIN_ARCS_PER_RELATION = 70
HEADER = "# sent_id = s1\n# text = The dog barks.\n"
GOOD_ROWS = ["1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_",
             "2\tdog\tdog\tNOUN\t_\t_\t3\tnsubj\t_\t_",
             "3\tbarks\tbark\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No",
             "4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_"]


@pytest.fixture(scope="module")
def treebank():
    return bundled_treebank()


def _write(tmp_path, rows, name="sample.conllu", header=HEADER):
    path = tmp_path / name
    path.write_text(header + "\n".join(rows) + "\n\n", encoding="utf-8")
    return path


def _with(*changes):
    """GOOD_ROWS with (row index, column index, new value) changes applied."""
    rows = [row.split("\t") for row in GOOD_ROWS]
    for row_index, column, value in changes:
        rows[row_index][column] = value
    return ["\t".join(row) for row in rows]


# ----------------------------------------------------------------------------- bundled corpus
def test_bundled_treebank_is_valid(treebank):
    validate_sentences(treebank, source="bundled")  # one root, no cycles, heads in range, relations
    for sentence in treebank:
        assert sentence.heads.count(0) == 1, sentence.sent_id
        assert all(0 <= head <= len(sentence.words) for head in sentence.heads), sentence.sent_id


def test_bundled_treebank_size(treebank):
    ids = [s.sent_id for s in treebank]
    assert len(ids) == len(set(ids))
    assert len(treebank) >= 400
    assert all(i.startswith("nat-") for i in ids)  # natural sentences only


def test_bundled_sentence_lengths_and_registers(treebank):
    lengths = [len(s.words) for s in treebank]
    # web-style text: a few one-word replies ("Ugh.") and long sentences, most of 5 to 40 words
    assert min(lengths) >= 2 and max(lengths) <= 45 and 14 <= sum(lengths) / len(lengths) <= 18
    assert sum(5 <= n <= 40 for n in lengths) >= 0.97 * len(lengths)
    prefixes = collections.Counter(s.sent_id.split("-")[1] if s.sent_id.count("-") == 2 else "" for s in treebank)
    assert set(prefixes) == {"", "a", "b", "c", "d", "e", "f", "g"} and min(prefixes.values()) >= 70
    assert all(len(s.upos) == len(s.words) and "_" not in s.upos for s in treebank)


@pytest.mark.parametrize("relation", REQUIRED_RELATIONS)
def test_bundled_treebank_has_enough_arcs(treebank, relation):
    counts = collections.Counter(r for s in treebank for r in s.relations)
    assert counts[relation] >= MIN_ARCS_PER_RELATION, counts


@pytest.mark.parametrize("path", [GRAMMAR_DIR / "generated.conllu", *(SYNTAX_DIR / n for n in BUNDLED_FILES)],
                         ids=lambda p: p.name)
def test_text_rebuilds_text_comment(path):
    comments = re.findall(r"^# text = (.*)$", path.read_text(encoding="utf-8"), flags=re.M)
    sentences = read_conllu(path)
    assert len(comments) == len(sentences)
    assert [s.text for s in sentences] == comments


def test_generator_reproduces_generated_conllu(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("probe_grammar", GRAMMAR_DIR / "grammar.py")
    grammar = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, grammar)  # dataclasses look their module up there
    spec.loader.exec_module(grammar)
    written = grammar.main(tmp_path / "generated.conllu")
    assert written.read_bytes() == (GRAMMAR_DIR / "generated.conllu").read_bytes()
    again = grammar.to_conllu(grammar.generate(5, seed=7))
    assert grammar.to_conllu(grammar.generate(5, seed=7)) == again


# ----------------------------------------------------------------------------- reader
def test_reads_words_heads_relations_and_spacing(tmp_path):
    (sentence,) = read_conllu(_write(tmp_path, GOOD_ROWS))
    assert sentence == Sentence("s1", ("The", "dog", "barks", "."), (2, 3, 0, 3),
                                ("det", "nsubj", "root", "punct"), (True, True, False, True),
                                ("DET", "NOUN", "VERB", "PUNCT"))
    assert sentence.text == "The dog barks."


def test_multiword_ranges_and_empty_nodes_are_skipped(tmp_path):
    text = (
        "# sent_id = ewt-1\n# text = I know you won't.\n"
        "1\tI\tI\tPRON\t_\t_\t2\tnsubj\t_\t_\n"
        "2\tknow\tknow\tVERB\t_\t_\t0\troot\t_\t_\n"
        "3\tyou\tyou\tPRON\t_\t_\t4\tnsubj\t_\t_\n"
        "4-5\twon't\t_\t_\t_\t_\t_\t_\t_\tSpaceAfter=No\n"
        "4\two\twill\tAUX\t_\t_\t2\tccomp\t_\t_\n"
        "5\tn't\tnot\tPART\t_\t_\t4\tadvmod\t_\t_\n"
        "6\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_\n\n"
        "# sent_id = ewt-2\n# text = Sam likes tea and Kim coffee.\n"
        "1\tSam\tSam\tPROPN\t_\t_\t2\tnsubj\t2:nsubj\t_\n"
        "2\tlikes\tlike\tVERB\t_\t_\t0\troot\t0:root\t_\n"
        "3\ttea\ttea\tNOUN\t_\t_\t2\tobj\t2:obj\t_\n"
        "4\tand\tand\tCCONJ\t_\t_\t5\tcc\t5.1:cc\t_\n"
        "5\tKim\tKim\tPROPN\t_\t_\t2\tconj\t5.1:nsubj\t_\n"
        "5.1\tlikes\tlike\tVERB\t_\t_\t_\t_\t2:conj\tCopyOf=2\n"
        "6\tcoffee\tcoffee\tNOUN\t_\t_\t5\torphan\t5.1:obj\tSpaceAfter=No\n"
        "7\t.\t.\tPUNCT\t_\t_\t2\tpunct\t2:punct\t_\n\n"
    )
    path = tmp_path / "ewt.conllu"
    path.write_text(text, encoding="utf-8")
    contraction, gapping = read_conllu(path)
    assert contraction.words == ("I", "know", "you", "wo", "n't", ".")
    assert contraction.heads == (2, 0, 4, 2, 4, 2)
    assert contraction.relations == ("nsubj", "root", "nsubj", "ccomp", "advmod", "punct")
    assert contraction.text == "I know you won't."
    assert gapping.words == ("Sam", "likes", "tea", "and", "Kim", "coffee", ".")
    assert gapping.heads == (2, 0, 2, 5, 2, 5, 2)
    assert gapping.text == "Sam likes tea and Kim coffee."


def test_missing_sent_id_falls_back_to_position(tmp_path):
    path = _write(tmp_path, GOOD_ROWS, header="# text = The dog barks.\n")
    assert read_conllu(path)[0].sent_id == "1"


@pytest.mark.parametrize("rows, line, words", [
    (GOOD_ROWS[:1] + ["2\tdog\tdog\tNOUN\t_\t_\t3\tnsubj\t_"] + GOOD_ROWS[2:], 4, "columns"),
    (_with((1, 6, "x")), 4, "not an integer"),
    (_with((2, 6, "_")), 5, "not an integer"),
    (_with((3, 0, "5")), 6, "expected 4"),
    (_with((0, 0, "one")), 3, "bad ID"),
])
def test_malformed_lines_name_file_and_line(tmp_path, rows, line, words):
    path = _write(tmp_path, rows, name="broken.conllu")
    with pytest.raises(TreebankError) as caught:
        read_conllu(path)
    message = str(caught.value)
    assert "broken.conllu" in message and f"line {line}:" in message and words in message
    assert "\n" not in message


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.conllu"
    rows = "\n".join(GOOD_ROWS).replace("dog", "d\xf6g")
    path.write_bytes((HEADER + rows + "\n\n").encode("latin-1"))
    with pytest.raises(TreebankError, match=r"latin1\.conllu, line 4: not valid UTF-8"):
        read_conllu(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n", "# just a comment\n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.conllu"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TreebankError, match=r"empty\.conllu, line \d+: .*(empty|no sentences)"):
        read_conllu(path)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(TreebankError, match=r"nothere\.conllu: no such file"):
        read_conllu(tmp_path / "nothere.conllu")
    folder = tmp_path / "folder.conllu"
    folder.mkdir()
    with pytest.raises(TreebankError, match=r"folder\.conllu: cannot read"):
        read_conllu(folder)


def test_treebank_error_is_a_value_error():
    assert issubclass(TreebankError, ValueError)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("rows, line, words", [
    (_with((1, 6, "1")), 3, "cycle through words 1, 2"),
    (_with((1, 6, "0"), (1, 7, "root")), 5, "2 roots (words 2, 3)"),
    (_with((3, 6, "9")), 6, "outside 0..4"),
    (_with((1, 6, "2")), 4, "its own head"),
    (_with((1, 7, "subject")), 4, "unknown relation 'subject'"),
    (_with((1, 7, "nsubj:Pass")), 4, "unknown relation"),
    (_with((1, 7, "root")), 4, "'root' must go with head 0"),
])
def test_invalid_trees_name_file_sentence_and_line(tmp_path, rows, line, words):
    path = _write(tmp_path, rows, name="bad.conllu")
    with pytest.raises(TreebankError) as caught:
        read_conllu(path)
    message = str(caught.value)
    assert "bad.conllu" in message and f"line {line}:" in message and "sentence s1" in message
    assert words in message
    read_conllu(path, validate=False)  # the same file reads without validation


def test_validate_sentences_catches_cycle_and_double_root():
    cycle = Sentence("c1", ("a", "b", "c"), (0, 3, 2), ("root", "dep", "dep"), (True,) * 3)
    two_roots = Sentence("r2", ("a", "b"), (0, 0), ("root", "root"), (True, True))
    with pytest.raises(TreebankError, match=r"^mine: sentence c1: cycle through words 2, 3$"):
        validate_sentences([cycle], source="mine")
    with pytest.raises(TreebankError, match=r"^mine: sentence r2: 2 roots"):
        validate_sentences([two_roots], source="mine")


def test_ud_relations():
    assert len(UD_RELATIONS) == 37
    assert {"nsubj", "obj", "obl", "nmod", "clf", "orphan", "reparandum"} <= UD_RELATIONS
    assert "dobj" not in UD_RELATIONS and "nmod:poss" not in UD_RELATIONS
    ok = Sentence("ok", ("her", "dog", "ran"), (2, 3, 0), ("nmod:poss", "nsubj", "root"),
                  (True,) * 3)
    validate_sentences([ok])
